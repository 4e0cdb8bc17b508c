//! Pauses of jobs and batches (job_pause in sql/pacing.sql, batch_log's paused_at): pause_job, resume_job, pause_batch,
//! resume_batch, and what a drain or a run reads before each chunk or step.
//!
//! A job's pause is a row of its own table, never a change to the job's row: a pause
//! that had to update the row a drainer holds for each chunk would wait for that chunk,
//! and then lose the row to the drainer's next chunk, and the next, to the end of the
//! job. So pausing waits for nothing, and a drainer sees the pause at its next chunk, by
//! one probe of the pause table's primary key. A batch's pause marks its steps' rows,
//! skipping the one a runner holds: a runner reads the mark with the next step's row,
//! which it locks anyway, for nothing.

use crate::access::{self, Of, Right};
use crate::error::{BatchError, Result};
use crate::own_rows::{self, Compare, Key};
use crate::query;
use crate::roles::{as_owner, current_user};
use crate::status::LaunchStatus;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;

/// Who paused a job or a batch, and when; or, for a worker of a launch, the launch that
/// no longer runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paused {
    pub by: String,
    pub at: String,
    /// The worker's launch and its status, when that is what stops the work.
    pub launch: Option<(i64, LaunchStatus)>,
    /// Why etc_batch itself paused it (a critical signal of its pace); None: a person
    /// did.
    pub reason: Option<String>,
}

impl Paused {
    /// From a row's paused_at and paused_by: None unless paused.
    pub fn from_row(at: Option<TimestampWithTimeZone>, by: Option<pg_sys::Oid>) -> Option<Paused> {
        at.map(|at| Paused {
            by: by.map(role_name).unwrap_or_default(),
            at: at.to_string(),
            launch: None,
            reason: None,
        })
    }

    /// As `from_row`, with etc_batch's reason for a pause it made itself.
    pub fn with_reason(mut self, reason: Option<String>) -> Paused {
        self.reason = reason;
        self
    }

    /// A worker's launch that ended, with its status, who stopped it (if stop_launch
    /// did), and when.
    pub fn launch_ended(
        launch_id: i64,
        status: LaunchStatus,
        by: Option<pg_sys::Oid>,
        at: Option<TimestampWithTimeZone>,
    ) -> Paused {
        Paused {
            by: by.map(role_name).unwrap_or_default(),
            at: at.map(|at| at.to_string()).unwrap_or_default(),
            launch: Some((launch_id, status)),
            reason: None,
        }
    }

    /// Whether it is a pause, and not a worker's launch that ended.
    pub fn is_pause(&self) -> bool {
        self.launch.is_none()
    }

    /// The NOTICE a call that stops for it sends: `what` is paused, by whom and when.
    pub fn notice(&self, what: &str, resume: &str) {
        let (message, detail) = match &self.launch {
            None => (
                format!("{what} is paused; this call stops here"),
                match &self.reason {
                    None => format!(
                        "It was paused by {} at {}. {resume} lets it go on.",
                        self.by, self.at
                    ),
                    Some(reason) => format!(
                        "etc_batch paused it at {}: {reason}. {resume} lets it go on.",
                        self.at
                    ),
                },
            ),
            Some((launch_id, status)) => (
                format!("launch {launch_id} is {status}; its worker stops before {what} goes on"),
                if self.by.is_empty() {
                    format!("It ended at {}.", self.at)
                } else {
                    format!("It was stopped by {} at {}.", self.by, self.at)
                },
            ),
        };
        pgrx::ereport!(
            NOTICE,
            pgrx::PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
            message,
            detail
        );
    }
}

/// The pause of job `job_id`, if it is paused. Run as the owner.
pub fn of_job(job_id: &str) -> Result<Option<Paused>> {
    read("job_pause", "job_id", job_id)
}

fn read(table: &str, column: &str, name: &str) -> Result<Option<Paused>> {
    let found = own_rows::reading_table(table, |pauses| {
        pauses.first(column, Compare::Equal, Key::Text(name), |row| {
            let reason = match table {
                "job_pause" => row.get::<String>("reason")?,
                _ => None,
            };
            Ok(Paused::from_row(
                row.get::<TimestampWithTimeZone>("paused_at")?,
                row.get::<pg_sys::Oid>("paused_by")?,
            )
            .map(|paused| paused.with_reason(reason)))
        })
    })?;
    Ok(found.flatten())
}

/// A role's name, or what it was when the role is gone.
pub fn role_name(oid: pg_sys::Oid) -> String {
    // SAFETY: a catalog lookup; a role dropped since gives NULL (noerr)
    let name = unsafe { pg_sys::GetUserNameFromId(oid, true) };
    if name.is_null() {
        return format!("a dropped role (oid {})", oid.to_u32());
    }
    // SAFETY: a NUL-terminated name palloc'd by GetUserNameFromId
    unsafe { std::ffi::CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// Pauses job $1 as role $2. Returns whether the job exists, whether it was paused
/// now (not already), and its number.
const PAUSE_JOB: &str = "\
WITH j AS (SELECT j.job_id, j.job_number FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1),
p AS (INSERT INTO etc_batch.job_pause (job_id, paused_at, paused_by)
      SELECT j.job_id, pg_catalog.now(), $2::pg_catalog.oid::pg_catalog.regrole FROM j
      ON CONFLICT (job_id) DO NOTHING
      RETURNING job_id)
SELECT EXISTS (SELECT FROM j) AS found, EXISTS (SELECT FROM p) AS changed,
       (SELECT j.job_number FROM j) AS job_number";

/// Resumes job $1. Returns whether the job exists, whether it was paused, and its
/// number.
const RESUME_JOB: &str = "\
WITH j AS (SELECT j.job_id, j.job_number FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1),
p AS (DELETE FROM etc_batch.job_pause p WHERE p.job_id OPERATOR(pg_catalog.=) $1
      RETURNING p.job_id)
SELECT EXISTS (SELECT FROM j) AS found, EXISTS (SELECT FROM p) AS changed,
       (SELECT j.job_number FROM j) AS job_number";

/// Pauses batch $1 as role $2: marks every step of it not yet paused, but the one a
/// runner holds (SKIP LOCKED: that step is in flight, and the runner stops at the next,
/// which is marked), so that pausing waits for nothing. A runner reads the mark with the
/// step's row it locks anyway. Returns whether the batch has steps, and whether any was
/// marked now.
const PAUSE_BATCH: &str = "\
WITH b AS (SELECT FROM etc_batch.batch_log b WHERE b.batch OPERATOR(pg_catalog.=) $1 LIMIT 1),
s AS (SELECT b.id FROM etc_batch.batch_log b
       WHERE b.batch OPERATOR(pg_catalog.=) $1 AND b.paused_at IS NULL
         FOR UPDATE SKIP LOCKED),
p AS (UPDATE etc_batch.batch_log b
         SET paused_at = pg_catalog.now(), paused_by = $2::pg_catalog.oid::pg_catalog.regrole
        FROM s WHERE b.id OPERATOR(pg_catalog.=) s.id
      RETURNING b.id)
SELECT EXISTS (SELECT FROM b) AS found, EXISTS (SELECT FROM p) AS changed,
       NULL::pg_catalog.int8 AS job_number";

/// Resumes batch $1: its steps' marks removed. Returns whether the batch has steps, and
/// whether any was paused.
const RESUME_BATCH: &str = "\
WITH b AS (SELECT FROM etc_batch.batch_log b WHERE b.batch OPERATOR(pg_catalog.=) $1 LIMIT 1),
p AS (UPDATE etc_batch.batch_log b SET paused_at = NULL, paused_by = NULL
       WHERE b.batch OPERATOR(pg_catalog.=) $1 AND b.paused_at IS NOT NULL
      RETURNING b.id)
SELECT EXISTS (SELECT FROM b) AS found, EXISTS (SELECT FROM p) AS changed,
       NULL::pg_catalog.int8 AS job_number";

/// Runs one of the statements above; (exists, changed, the job's number).
fn change(sql: &str, name: &str, with_role: bool) -> Result<(bool, bool, i64)> {
    let by = current_user();
    as_owner(|| {
        let mut args = vec![name.into()];
        if with_role {
            args.push(by.into());
        }
        query::row(sql, &args, |r| {
            let r = Changed::read(r)?;
            Ok((r.found, r.changed, r.job_number))
        })
    })
    .map(Option::unwrap_or_default)
}

query::row_reader! {
    /// What a statement above returns.
    struct Changed {
        /// Whether the job or the batch exists.
        found: bool = false,
        /// Whether it was changed now (not paused or resumed already).
        changed: bool = false,
        job_number: i64 = 0,
    }
}

/// Pauses a job; returns whether anything changed (false: it was paused already).
pub fn pause_job(job_id: &str) -> Result<bool> {
    hold_job(job_id, true)
}

/// Lets a paused job go on; returns whether anything changed (false: it was not paused).
pub fn resume_job(job_id: &str) -> Result<bool> {
    hold_job(job_id, false)
}

/// Pauses the job (`paused`) or lets it go on, saying so when that changed anything.
fn hold_job(job_id: &str, paused: bool) -> Result<bool> {
    let (act, statement, event) = if paused {
        ("pause", PAUSE_JOB, "paused")
    } else {
        ("resume", RESUME_JOB, "resumed")
    };
    access::require(Of::Job(job_id), Right::Act(act))?;
    match change(statement, job_id, paused)? {
        (false, ..) => Err(BatchError::UnknownJob { job: job_id.into() }),
        (true, changed, number) => {
            if changed {
                crate::events::job(
                    number,
                    job_id,
                    event,
                    serde_json::json!({"by": role_name(current_user())}),
                );
            }
            Ok(changed)
        }
    }
}

/// Pauses a batch; returns whether anything changed (false: it was paused already).
pub fn pause_batch(batch: &str) -> Result<bool> {
    match change(PAUSE_BATCH, batch, true)? {
        (false, ..) => Err(BatchError::UnknownBatch {
            batch: batch.into(),
        }),
        (true, changed, _) => Ok(changed),
    }
}

/// Lets a paused batch go on; returns whether anything changed (false: it was not
/// paused).
pub fn resume_batch(batch: &str) -> Result<bool> {
    match change(RESUME_BATCH, batch, false)? {
        (false, ..) => Err(BatchError::UnknownBatch {
            batch: batch.into(),
        }),
        (true, changed, _) => Ok(changed),
    }
}
