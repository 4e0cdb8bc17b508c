//! The pace of a job (pace_job, sql/pacing.sql): how many rows a second all its drainers
//! together may change, and how many WAL bytes the slowest streaming standby or
//! replication slot may be behind before they wait.
//!
//! A drainer reads the pace before each chunk, in the chunk's own transaction. When it
//! has to wait, it commits first, so that the wait holds nothing: no transaction id, no
//! snapshot, no lock but its virtual transaction id. The rate is a clock shared by the
//! job's drainers in its pace row: each chunk takes the next slot of it (rows /
//! rows_per_second long) and starts no earlier than the slot, so the job as a whole stays
//! at or under the rate on average, however many drainers there are.

use super::sql;
use crate::error::{BatchError, Result};
use crate::own_rows::{self, Compare, Key};
use crate::query;
use crate::roles::{as_owner, current_user};
use std::time::Duration;

/// A pace as pace_job sets it; None: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pace {
    pub rows_per_second: Option<i32>,
    pub max_replica_lag_bytes: Option<i64>,
}

/// What a drainer waits for before its next chunk.
#[derive(Debug, Clone, PartialEq)]
pub enum Wait {
    /// The chunk's slot of the pace's clock begins this much later.
    Slot(Duration),
    /// The replicas are `behind` WAL bytes behind, more than `limit`.
    Replicas { behind: i64, limit: i64 },
}

/// pace_job: sets the pace of job `job_id` (both None: no limit).
pub fn set(job_id: &str, pace: Pace) -> Result<()> {
    if let Some(rate) = pace.rows_per_second.filter(|r| *r <= 0) {
        return Err(BatchError::invalid_because(
            format!("rows_per_second {rate} is out of range"),
            "Give a number of rows per second above 0, or NULL for no limit.",
        ));
    }
    if let Some(lag) = pace.max_replica_lag_bytes.filter(|l| *l < 0) {
        return Err(BatchError::invalid_because(
            format!("max_replica_lag_bytes {lag} is out of range"),
            "Give a number of bytes of 0 or more, or NULL for no limit.",
        ));
    }
    let by = current_user();
    as_owner(|| {
        if query::one::<String>(sql::JOB_STATUS, &[job_id.into()])?.is_none() {
            return Err(BatchError::UnknownJob { job: job_id.into() });
        }
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
            ],
        )
    })
}

/// The pace of job `job_id`, read by its primary key. Run as the owner.
pub fn of(job_id: &str) -> Result<Pace> {
    let pace = own_rows::reading_table("job_pace", |paces| {
        paces.first("job_id", Compare::Equal, Key::Text(job_id), |row| {
            Ok(Pace {
                rows_per_second: row.get::<i32>("rows_per_second")?,
                max_replica_lag_bytes: row.get::<i64>("max_replica_lag_bytes")?,
            })
        })
    })?;
    Ok(pace.unwrap_or_default())
}

/// What the next chunk of `rows` rows must wait for under `pace`, if anything; a chunk
/// under a rate takes its slot of the pace's clock here (its row is then locked until
/// the transaction ends: the caller commits before the chunk). Run as the owner.
pub fn wait_before(job_id: &str, pace: Pace, rows: i32) -> Result<Option<Wait>> {
    if let Some(limit) = pace.max_replica_lag_bytes {
        let behind = query::one::<i64>(sql::REPLICA_LAG, &[])?.unwrap_or(0);
        if behind > limit {
            return Ok(Some(Wait::Replicas { behind, limit }));
        }
    }
    if pace.rows_per_second.is_some() {
        let seconds = query::one::<f64>(sql::TAKE_SLOT, &[job_id.into(), rows.into()])?;
        if let Some(seconds) = seconds.filter(|s| *s > 0.0) {
            return Ok(Some(Wait::Slot(Duration::from_secs_f64(seconds))));
        }
    }
    Ok(None)
}

/// How long a drainer waits before it looks at the replicas again.
pub const REPLICA_RECHECK: Duration = Duration::from_millis(200);
