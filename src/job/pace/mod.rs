//! The pace of a job (pace_job, sql/pacing.sql): how many rows a second all its drainers
//! together may change, and the signals of the whole system they yield to: how far
//! behind the replicas may fall, how many WAL segments may wait for archiving, a VACUUM
//! of the target, the hours the job may run, and the DBA's own throttle query; and the
//! critical signals that pause the job instead (a replica lag, an archive backlog, a
//! critical query), as pause_job would, with the reason kept.
//!
//! A drainer reads the pace's row before each chunk, in the chunk's own transaction,
//! and the signals (signals.rs) at most once per etc_batch.signal_interval. When it has
//! to wait, it commits first, so that the wait holds nothing: no transaction id, no
//! snapshot, no lock but its virtual transaction id. The rate is a clock shared by the
//! job's drainers in its pace row: each chunk takes the next slot of it (rows /
//! rows_per_second long) and starts no earlier than the slot, so the job as a whole stays
//! at or under the rate on average, however many drainers there are.
//!
//! Every pace_job call sets the whole pace: what it does not name has no limit (or is
//! off) afterwards, and pace_job(job_id) clears it all.

//!
//! - `signals` what the system says: archive backlog, a VACUUM, the DBA's queries.

pub(crate) mod signals;

use crate::error::{BatchError, Result};
use crate::job::definition::Definition;
use crate::job::rules::window::{self, Windows};
use crate::job::sql;
use crate::own_rows::{self, Compare, Key};
use crate::query;
use crate::roles::{as_author, as_owner, current_user};
use crate::txn::Failure;
use std::time::Duration;

/// A pace as pace_job sets it; None (false): no limit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pace {
    pub rows_per_second: Option<i32>,
    pub max_replica_lag_bytes: Option<i64>,
    pub max_archive_backlog: Option<i32>,
    pub yield_to_vacuum: bool,
    pub windows: Option<Vec<String>>,
    /// The time zone of the windows (the caller's TimeZone when pace_job named none).
    pub time_zone: Option<String>,
    pub throttle_query: Option<String>,
    pub pause_above_replica_lag_bytes: Option<i64>,
    pub pause_above_archive_backlog: Option<i32>,
    pub critical_query: Option<String>,
    /// How long one transaction of a drain may take: as many chunks as fit go in one
    /// (job/run/group.rs). Not under a rate, whose slots are a chunk's each.
    pub transaction_time: Option<Duration>,
}

impl Pace {
    /// The time a drain's transaction is sized to, if any: none under rows_per_second,
    /// whose slots are taken one chunk at a time, between transactions.
    pub fn transaction_target(&self) -> Option<Duration> {
        self.transaction_time
            .filter(|_| self.rows_per_second.is_none())
    }

    /// Whether any signal is set, besides the rate, which is a slot per chunk.
    pub fn has_signals(&self) -> bool {
        // read before every chunk: no copy of the pace's texts
        self.max_replica_lag_bytes.is_some()
            || self.max_archive_backlog.is_some()
            || self.yield_to_vacuum
            || self.windows.is_some()
            || self.throttle_query.is_some()
            || self.pause_above_replica_lag_bytes.is_some()
            || self.pause_above_archive_backlog.is_some()
            || self.critical_query.is_some()
    }
}

/// What a drainer waits for before its next chunk.
#[derive(Debug, Clone, PartialEq)]
pub enum Wait {
    /// The chunk's slot of the pace's clock begins this much later.
    Slot(Duration),
    /// The replicas are `behind` WAL bytes behind, more than `limit`.
    Replicas { behind: i64, limit: i64 },
    /// `ready` WAL segments wait to be archived, more than `limit`.
    Archive { ready: i64, limit: i32 },
    /// A VACUUM, process `pid`, works on the target.
    Vacuum { pid: i32 },
    /// The throttle query said true.
    Throttled,
    /// The hour is outside the job's windows; the next opens in this many minutes.
    OutsideWindows { opens_in: u32 },
}

impl Wait {
    /// What the wait is, for a NOTICE, pg_stat_activity and job_progress.waiting.
    pub fn reason(&self) -> String {
        match self {
            Wait::Slot(delay) => format!("paced, the next chunk in {} ms", delay.as_millis()),
            Wait::Replicas { behind, limit } => format!(
                "the replicas are {behind} bytes of WAL behind, more than max_replica_lag_bytes {limit}"
            ),
            Wait::Archive { ready, limit } => format!(
                "{ready} WAL segments wait to be archived, more than max_archive_backlog {limit}"
            ),
            Wait::Vacuum { pid } => format!("a VACUUM (process {pid}) works on its table"),
            Wait::Throttled => "its throttle_query says to wait".into(),
            Wait::OutsideWindows { opens_in } => format!(
                "outside its windows; the next opens in {}",
                window::human_minutes(*opens_in)
            ),
        }
    }

    /// What the drainer shows in pg_stat_activity while it waits (job_progress.waiting
    /// reads it from there).
    pub fn activity(&self) -> String {
        match self {
            Wait::Slot(_) => self.reason(),
            Wait::Replicas { behind, limit } => {
                format!("waiting for the replicas, {behind} bytes behind, more than {limit}")
            }
            Wait::Archive { ready, limit } => {
                format!("waiting for WAL archiving, {ready} segments ready, more than {limit}")
            }
            Wait::Vacuum { pid } => format!("waiting for a VACUUM of its table, process {pid}"),
            Wait::Throttled => "waiting for its throttle_query".into(),
            Wait::OutsideWindows { opens_in } => format!(
                "waiting for its windows, the next opens in {}",
                window::human_minutes(*opens_in)
            ),
        }
    }

    /// The kind of wait, as events name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Wait::Slot(_) => "pace",
            Wait::Replicas { .. } => "replicas",
            Wait::Archive { .. } => "archiving",
            Wait::Vacuum { .. } => "vacuum",
            Wait::Throttled => "throttle_query",
            Wait::OutsideWindows { .. } => "windows",
        }
    }

    /// Whether `other` is a wait of the same kind (told once while it lasts).
    pub fn same_kind(&self, other: &Wait) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// What the signals say about the next chunk.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    Go,
    Wait(Wait),
    /// A critical signal tripped, or a DBA's query failed: the job is to be paused, for
    /// this reason.
    Pause(String),
}

/// pace_job: sets the whole pace of job `job_id` (Pace::default(): none). The caller
/// acts for the job's registrant; the DBA's queries are checked as the registrant, with
/// the job's search_path, and nothing is stored unless all is well.
pub fn set(job_id: &str, mut pace: Pace) -> Result<()> {
    let in_range = |name: &str, value: Option<i64>, min: i64, unit: &str| match value {
        Some(v) if v < min => Err(BatchError::invalid_because(
            format!("{name} {v} is out of range"),
            format!(
                "Give a number of {unit} {}, or NULL for no limit.",
                if min > 0 { "above 0" } else { "of 0 or more" }
            ),
        )),
        _ => Ok(()),
    };
    let segments = "WAL segments";
    let bytes = "bytes";
    in_range(
        "rows_per_second",
        pace.rows_per_second.map(i64::from),
        1,
        "rows per second",
    )?;
    in_range(
        "max_replica_lag_bytes",
        pace.max_replica_lag_bytes,
        0,
        bytes,
    )?;
    in_range(
        "max_archive_backlog",
        pace.max_archive_backlog.map(i64::from),
        0,
        segments,
    )?;
    in_range(
        "pause_above_replica_lag_bytes",
        pace.pause_above_replica_lag_bytes,
        0,
        bytes,
    )?;
    in_range(
        "pause_above_archive_backlog",
        pace.pause_above_archive_backlog.map(i64::from),
        0,
        segments,
    )?;
    match &pace.windows {
        Some(entries) => {
            Windows::parse(entries)?;
            let zone = match pace.time_zone.take() {
                Some(zone) => zone,
                None => crate::settings::current(c"TimeZone").unwrap_or_else(|| "UTC".into()),
            };
            // an unknown time zone fails here, with PostgreSQL's own 22023
            signals::minute_of_week(&zone)?;
            pace.time_zone = Some(zone);
        }
        None if pace.time_zone.is_some() => {
            return Err(BatchError::invalid_because(
                "time_zone without windows",
                "time_zone is the time zone of the windows: give windows too, or neither.",
            ))
        }
        None => {}
    }
    let by = current_user();
    let def = crate::job::lifecycle::acted_on(job_id, "pace")?;
    if pace.transaction_time.is_some() && pace.rows_per_second.is_some() {
        return Err(BatchError::invalid_because(
            "transaction_time with rows_per_second",
            "Under a rate each chunk takes its own slot, one transaction each: give one or the other.",
        ));
    }
    for (what, text) in [
        ("throttle_query", &pace.throttle_query),
        ("critical_query", &pace.critical_query),
    ] {
        if let Some(text) = text {
            as_author(def.registered_by, &def.search_path, by, &[], || {
                signals::check_query(what, text)
            })?;
        }
    }
    as_owner(|| {
        if pace == Pace::default() {
            return query::run(sql::UNPACE_JOB, &[job_id.into()]);
        }
        query::run(
            sql::PACE_JOB,
            &[
                job_id.into(),
                pace.rows_per_second.into(),
                pace.max_replica_lag_bytes.into(),
                by.into(),
                pace.max_archive_backlog.into(),
                pace.yield_to_vacuum.into(),
                pace.windows.clone().into(),
                pace.time_zone.clone().into(),
                pace.throttle_query.clone().into(),
                pace.pause_above_replica_lag_bytes.into(),
                pace.pause_above_archive_backlog.into(),
                pace.critical_query.clone().into(),
                pace.transaction_time
                    .and_then(|t| pgrx::datum::Interval::try_from(t).ok())
                    .into(),
            ],
        )
    })
}

/// The longest transaction_time pace_job takes: a transaction holds its row locks that
/// long.
const LONGEST_TRANSACTION_TIME: Duration = Duration::from_secs(3600);

/// pace_job's transaction_time, as a duration: above zero, an hour at most.
pub fn transaction_time(interval: pgrx::datum::Interval) -> Result<Duration> {
    match Duration::try_from(interval) {
        Ok(time) if !time.is_zero() && time <= LONGEST_TRANSACTION_TIME => Ok(time),
        _ => Err(BatchError::invalid_because(
            "transaction_time is out of range",
            "Give the time a transaction may take, above 0 and at most an hour (for example '200ms'), or NULL for one chunk per transaction.",
        )),
    }
}

/// The pace of job `job_id`, read by its primary key. Run as the owner.
pub fn of(job_id: &str) -> Result<Pace> {
    let pace = own_rows::reading_table("job_pace", |paces| {
        paces.first("job_id", Compare::Equal, Key::Text(job_id), |row| {
            Ok(Pace {
                rows_per_second: row.get::<i32>("rows_per_second")?,
                max_replica_lag_bytes: row.get::<i64>("max_replica_lag_bytes")?,
                max_archive_backlog: row.get::<i32>("max_archive_backlog")?,
                yield_to_vacuum: row.get::<bool>("yield_to_vacuum")?.unwrap_or(false),
                windows: row.get::<Vec<String>>("windows")?,
                time_zone: row.get::<String>("time_zone")?,
                throttle_query: row.get::<String>("throttle_query")?,
                pause_above_replica_lag_bytes: row.get::<i64>("pause_above_replica_lag_bytes")?,
                pause_above_archive_backlog: row.get::<i32>("pause_above_archive_backlog")?,
                critical_query: row.get::<String>("critical_query")?,
                transaction_time: row
                    .get::<pgrx::datum::Interval>("transaction_time")?
                    .and_then(|t| Duration::try_from(t).ok()),
            })
        })
    })?;
    Ok(pace.unwrap_or_default())
}

/// What the signals of `pace` say now for a job on table `target`: pause (a critical
/// signal, or a DBA's query that failed), wait (the first signal that holds it back), or
/// go. `ask` runs a DBA's query as the job's registrant. Run as the owner.
pub fn read_signals(
    pace: &Pace,
    target: pgrx::pg_sys::Oid,
    ask: impl Fn(&str) -> std::result::Result<bool, Failure>,
) -> Result<Signal> {
    let failed = |what: &str, failure: Failure| {
        Signal::Pause(format!(
            "its {what} failed: {} {}",
            failure.sqlstate(),
            failure.message
        ))
    };
    let backlog =
        if pace.max_archive_backlog.is_some() || pace.pause_above_archive_backlog.is_some() {
            signals::archive_backlog()?
        } else {
            0
        };
    let lag =
        if pace.max_replica_lag_bytes.is_some() || pace.pause_above_replica_lag_bytes.is_some() {
            signals::replica_lag()?
        } else {
            0
        };
    // the critical signals first: a pause wins over any wait
    if let Some(limit) = pace.pause_above_replica_lag_bytes.filter(|l| lag > *l) {
        return Ok(Signal::Pause(format!(
            "the replicas were {lag} bytes of WAL behind, more than pause_above_replica_lag_bytes {limit}"
        )));
    }
    if let Some(limit) = pace
        .pause_above_archive_backlog
        .filter(|l| backlog > i64::from(*l))
    {
        return Ok(Signal::Pause(format!(
            "{backlog} WAL segments waited to be archived, more than pause_above_archive_backlog {limit}"
        )));
    }
    if let Some(text) = &pace.critical_query {
        match ask(text) {
            Ok(true) => return Ok(Signal::Pause("its critical_query returned true".into())),
            Ok(false) => {}
            Err(failure) => return Ok(failed("critical_query", failure)),
        }
    }
    if let (Some(entries), Some(zone)) = (&pace.windows, &pace.time_zone) {
        let windows = Windows::parse(entries)?;
        let now = signals::minute_of_week(zone)?;
        if !windows.inside(now) {
            return Ok(Signal::Wait(Wait::OutsideWindows {
                opens_in: windows.opens_in(now),
            }));
        }
    }
    if let Some(limit) = pace.max_replica_lag_bytes.filter(|l| lag > *l) {
        return Ok(Signal::Wait(Wait::Replicas { behind: lag, limit }));
    }
    if let Some(limit) = pace.max_archive_backlog.filter(|l| backlog > i64::from(*l)) {
        return Ok(Signal::Wait(Wait::Archive {
            ready: backlog,
            limit,
        }));
    }
    if pace.yield_to_vacuum {
        if let Some(pid) = signals::vacuum_of(target)? {
            return Ok(Signal::Wait(Wait::Vacuum { pid }));
        }
    }
    if let Some(text) = &pace.throttle_query {
        match ask(text) {
            Ok(true) => return Ok(Signal::Wait(Wait::Throttled)),
            Ok(false) => {}
            Err(failure) => return Ok(failed("throttle_query", failure)),
        }
    }
    Ok(Signal::Go)
}

/// Pauses job `def` for `reason`, as etc_batch itself (its owner `by`), unless it is
/// paused already. Run as the owner.
pub fn pause_for(def: &Definition, by: pgrx::pg_sys::Oid, reason: &str) -> Result<()> {
    let paused = query::one::<bool>(
        sql::PAUSE_FOR_SIGNAL,
        &[def.job_id.as_str().into(), by.into(), reason.into()],
    )?;
    if paused == Some(true) {
        crate::events::job(
            def.tables.number,
            &def.job_id,
            "paused",
            serde_json::json!({"by": "etc_batch", "reason": reason}),
        );
    }
    Ok(())
}

/// The slot of the pace's clock the next chunk of `rows` rows takes under `pace`: how
/// long until it begins, if at all (its row is then locked until the transaction ends:
/// the caller commits before the chunk). Run as the owner.
pub fn take_slot(job_id: &str, pace: &Pace, rows: i32) -> Result<Option<Duration>> {
    if pace.rows_per_second.is_none() {
        return Ok(None);
    }
    let seconds = query::one::<f64>(sql::TAKE_SLOT, &[job_id.into(), rows.into()])?;
    Ok(seconds.filter(|s| *s > 0.0).map(Duration::from_secs_f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_alone_is_no_signal_and_every_signal_is_one() {
        let rate = Pace {
            rows_per_second: Some(100),
            ..Pace::default()
        };
        assert!(!rate.has_signals());
        let each = [
            Pace {
                max_replica_lag_bytes: Some(0),
                ..Pace::default()
            },
            Pace {
                max_archive_backlog: Some(1),
                ..Pace::default()
            },
            Pace {
                yield_to_vacuum: true,
                ..Pace::default()
            },
            Pace {
                windows: Some(vec!["mon 00:00-24:00".into()]),
                ..Pace::default()
            },
            Pace {
                throttle_query: Some("SELECT false".into()),
                ..Pace::default()
            },
            Pace {
                pause_above_replica_lag_bytes: Some(1),
                ..Pace::default()
            },
            Pace {
                pause_above_archive_backlog: Some(1),
                ..Pace::default()
            },
            Pace {
                critical_query: Some("SELECT false".into()),
                ..Pace::default()
            },
        ];
        for pace in each {
            assert!(pace.has_signals(), "{pace:?}");
        }
    }

    #[test]
    fn each_wait_names_its_kind_and_reason() {
        let archive = Wait::Archive { ready: 4, limit: 2 };
        assert_eq!(archive.kind(), "archiving");
        assert_eq!(
            archive.activity(),
            "waiting for WAL archiving, 4 segments ready, more than 2"
        );
        assert!(archive.same_kind(&Wait::Archive { ready: 9, limit: 2 }));
        assert!(!archive.same_kind(&Wait::Throttled));
        assert_eq!(
            Wait::OutsideWindows { opens_in: 95 }.activity(),
            "waiting for its windows, the next opens in 1 h 35 min"
        );
    }
}
