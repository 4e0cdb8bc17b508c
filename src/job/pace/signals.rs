//! What the whole system says about going on (pace_job's signals), read for a job's
//! drainers: the WAL segments waiting to be archived and the replicas' lag (on a Citus
//! coordinator, on every worker too: the slowest node decides), a VACUUM at work on the target,
//! the minute of the week in the pace's time zone, and the DBA's own throttle and
//! critical queries. How often they are read: `etc_batch.signal_interval`.
//!
//! A DBA's query is checked when it is set (a single SELECT of one boolean, prepared as
//! the job's registrant), and run as the registrant with the job's search_path, in a
//! subtransaction that is always rolled back: whatever a function it calls writes, it
//! changes nothing.

use crate::error::{BatchError, Result};
use crate::job::distributed::greatest_on_workers;
use crate::job::sql;
use crate::query;
use crate::txn::Failure;
use pgrx::{pg_sys, GucContext, GucFlags, GucRegistry, GucSetting};
use std::time::Duration;

/// At most how often, in milliseconds, a drainer reads the signals of its job's pace.
pub static SIGNAL_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(1000);

pub fn register() {
    GucRegistry::define_int_guc(
        c"etc_batch.signal_interval",
        c"At most how often a drainer reads the signals of its job's pace.",
        c"The archive backlog, a VACUUM of the target, the replicas' lag, the windows and the throttle and critical queries set by pace_job are read at most this often by each drainer, and again this often while it waits. 0 reads them before every chunk.",
        &SIGNAL_INTERVAL,
        0,
        3_600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
}

pub fn interval() -> Duration {
    Duration::from_millis(SIGNAL_INTERVAL.get().max(0) as u64)
}

/// How a waiting drainer sleeps between two readings: the interval, but at least a
/// tenth of a second, so that an interval of 0 does not spin.
pub fn recheck() -> Duration {
    interval().max(Duration::from_millis(100))
}

/// How many WAL segments wait for archive_command or archive_library, here or on the
/// Citus worker with the most (the slowest node decides).
pub fn archive_backlog() -> Result<i64> {
    let workers = greatest_on_workers(ARCHIVE_BACKLOG_ON_WORKER)?.unwrap_or(0);
    Ok(archive_backlog_here().max(workers))
}

/// A worker's archive backlog, read by a role with pg_monitor's privileges.
const ARCHIVE_BACKLOG_ON_WORKER: &str =
    "SELECT pg_catalog.count(*) FROM pg_catalog.pg_ls_archive_statusdir() \
     WHERE name OPERATOR(pg_catalog.~~) '%.ready'";

/// This server's archive backlog: the `.ready` files of pg_wal/archive_status (the
/// server's working directory is its data directory).
fn archive_backlog_here() -> i64 {
    std::fs::read_dir("pg_wal/archive_status")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".ready"))
                .count() as i64
        })
        .unwrap_or(0)
}

/// The pid of a VACUUM at work on table `target` (or one of its partitions) in this
/// database, if any. Run as the owner, who sees every backend's progress.
pub fn vacuum_of(target: pg_sys::Oid) -> Result<Option<i32>> {
    query::one::<i32>(sql::VACUUM_OF, &[target.into()])
}

/// The WAL bytes the slowest streaming standby or replication slot is behind, of this
/// server's or of any Citus worker's.
pub fn replica_lag() -> Result<i64> {
    let here = query::one::<i64>(sql::REPLICA_LAG, &[])?.unwrap_or(0);
    Ok(here.max(greatest_on_workers(sql::REPLICA_LAG)?.unwrap_or(0)))
}

/// The minute of the week (Monday 00:00 is 0) now in `time_zone`; an unknown time zone
/// fails with PostgreSQL's 22023.
pub fn minute_of_week(time_zone: &str) -> Result<u32> {
    Ok(query::one::<i32>(sql::MINUTE_OF_WEEK, &[time_zone.into()])?.unwrap_or(0) as u32)
}

/// Checks that `text`, given as `what` (throttle_query, critical_query), is a single
/// SELECT returning one boolean, as the current user and search_path: a statement that
/// does not parse or names what does not exist fails with PostgreSQL's own error.
pub fn check_query(what: &str, text: &str) -> Result<()> {
    let shape = query::shape(text)?;
    if !shape.reads_only || shape.statements != 1 {
        return Err(BatchError::Syntax {
            what: "a signal query",
            detail: format!(
                "{what} must be a single SELECT that changes nothing (no INSERT, UPDATE, DELETE or MERGE, no FOR UPDATE): it is run at most once per etc_batch.signal_interval while the job runs."
            ),
        });
    }
    if shape.columns != [pg_sys::BOOLOID] {
        return Err(BatchError::TypeMismatch {
            message: format!("{what} must return one boolean column"),
            detail: format!(
                "It returns {} column{}{}; true means the job {}.",
                shape.columns.len(),
                if shape.columns.len() == 1 { "" } else { "s" },
                if shape.columns.len() == 1 {
                    " of another type"
                } else {
                    ""
                },
                if what == "critical_query" {
                    "is paused"
                } else {
                    "waits"
                }
            ),
        });
    }
    Ok(())
}

/// Runs a DBA's query (checked when it was set) for its answer, in a subtransaction
/// always rolled back: Ok(true) when its first row says true; its error, caught, when it
/// fails. The caller runs it as the job's registrant.
pub fn ask(text: &str) -> std::result::Result<bool, Failure> {
    let answered = crate::txn::subtransaction_unless(|| {
        let answer = query::one::<bool>(text, &[]).unwrap_or_else(|e| e.raise());
        // rolled back whatever the answer: the query changes nothing
        Err::<(), _>(answer.unwrap_or(false))
    })?;
    Ok(answered.err().unwrap_or(false))
}
