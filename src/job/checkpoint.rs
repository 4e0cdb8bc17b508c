//! The job's row in a chunk's transaction, read and written without statements: the
//! row locked and its checkpoint checked before the chunk (the seal, the counters, one
//! probe of the audit partition for a row at or beyond it), the keys the chunk starts
//! and ends with read from the item partition, and the checkpoint moved past the chunk
//! after its audit rows. What each statement would have cost (a plan found, an executor
//! started and ended) is most of what these small reads and one write cost, so a chunk's
//! only statement is its change. The rules are progress.rs's; `verify_job` checks the
//! same promise in SQL.

use super::progress::Progress;
use super::sql;
use super::tables::JobTables;
use crate::error::{BatchError, Result};
use crate::pauses::{self, Paused};
use crate::query;
use crate::rows::{self, Key, Lock, Tid};
use crate::status::JobStatus;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::IntoDatum;
use std::ops::Range;

/// The job's row, locked, as the chunk's transaction found it.
pub struct Locked {
    pub status: JobStatus,
    pub progress: Progress,
    pub audit_changes: i64,
    pub item_changes: i64,
    pub sealed: bool,
    /// The first audit row at or beyond the checkpoint: there must be none.
    pub audit_beyond: Option<i32>,
    /// The keys of the first and the last item of the next chunk, if there is one.
    pub first_key: String,
    pub last_key: String,
    /// Where the locked version of the job's row lies, for moving the checkpoint.
    pub at: Tid,
    /// Who paused the job, if it is paused.
    pub paused: Option<Paused>,
}

impl Locked {
    /// The cheap, exact check (see progress.rs): why the checkpoint cannot be trusted.
    pub fn untrusted(&self) -> Option<String> {
        let p = &self.progress;
        if let Err(reason) = p.check_position() {
            return Some(reason);
        }
        if !self.sealed {
            return Some(format!(
                "The checkpoint (next_index {}) does not match its seal: it was changed outside etc_batch.",
                p.next_index
            ));
        }
        if self.audit_changes != 0 || self.item_changes != 0 {
            return Some(format!(
                "Since they were written, {} change(s) to the job's audit rows and {} change(s) to \
                 its approved items were made outside etc_batch.",
                self.audit_changes, self.item_changes
            ));
        }
        self.audit_beyond.map(|position| {
            format!(
                "An audit row exists at position {position}, at or beyond the checkpoint {}.",
                p.next_index
            )
        })
    }
}

/// The seal of a checkpoint, as sql::seal! computes it:
/// hashtextextended(job || ':' || next_index || ':' || chunks_committed, 7919).
pub fn seal(job_id: &str, next_index: i32, chunks_committed: i32) -> i64 {
    hash_seal(&format!("{job_id}:{next_index}:{chunks_committed}"))
}

/// hashtextextended(text, 7919), the hash every seal is.
pub fn hash_seal(text: &str) -> i64 {
    // SAFETY: hashtextextended(text, bigint) returns a bigint datum; the text datum lives
    // in the current memory context until the call returns.
    unsafe {
        let datum = pg_sys::OidFunctionCall2Coll(
            pg_sys::Oid::from(pg_sys::F_HASHTEXTEXTENDED),
            pg_sys::Oid::from(pg_sys::DEFAULT_COLLATION_OID),
            text.into_datum().expect("text is never NULL"),
            pg_sys::Datum::from(7919_i64),
        );
        datum.value() as i64
    }
}

/// Locks job `job_id`'s row (waiting for a drainer that holds it: two drainers never
/// pick the same chunk) and reads its checkpoint as the last committed chunk left it.
/// The partitions are read after the lock is granted, in a snapshot taken then, so that
/// they show what the drainer before committed. None: the job is gone.
pub fn lock(job_id: &str, tables: &JobTables) -> Result<Option<Locked>> {
    let row = rows::with_table("job", |jobs| {
        jobs.lock_by_key("job_number", Key::Int8(tables.number), true, |row| {
            let next_index = row.get::<i32>("next_index")?.unwrap_or(0);
            let chunks = row.get::<i32>("chunks_committed")?.unwrap_or(0);
            Ok((
                row.get::<String>("job_id")?.unwrap_or_default(),
                JobStatus::parse(&row.get::<String>("status")?.unwrap_or_default())?,
                Progress {
                    next_index,
                    item_count: row.get::<i32>("item_count")?.unwrap_or(0),
                    chunk_size: row.get::<i32>("chunk_size")?.unwrap_or(1),
                },
                row.get::<i64>("audit_changes")?.unwrap_or(0),
                row.get::<i64>("item_changes")?.unwrap_or(0),
                row.get::<i64>("seal")? == Some(seal(job_id, next_index, chunks)),
            ))
        })
    })?;
    let ((id, status, progress, audit_changes, item_changes, sealed), at) = match row {
        Lock::Row(row, at) => (row, at),
        Lock::Missing => return Ok(None),
        Lock::HeldByAnother => unreachable!("a lock that waits is never skipped"),
    };
    // a job number taken by another job id: this one is gone
    if id != job_id {
        return Ok(None);
    }
    let paused = pauses::of_job(job_id)?;
    let audit_beyond = first_audit_from(tables, progress.next_index)?;
    let (first_key, last_key) = match progress.next_chunk() {
        None => (String::new(), String::new()),
        Some(range) => chunk_keys(tables, &range)?,
    };
    Ok(Some(Locked {
        status,
        progress,
        audit_changes,
        item_changes,
        sealed,
        audit_beyond,
        first_key,
        last_key,
        at,
        paused,
    }))
}

/// The position of the first audit row at or beyond `position`, by one probe of the
/// job's audit partition.
pub fn first_audit_from(tables: &JobTables, position: i32) -> Result<Option<i32>> {
    rows::reading_table(&tables.audit_relname(), |audit| {
        audit.first_from("position", Key::Int4(position), |row| {
            Ok(row.get::<i32>("position")?.unwrap_or(-1))
        })
    })
}

/// The keys of the first and the last item of the chunk `range`, read from the job's
/// item partition by its primary key, in one opening of it.
pub fn chunk_keys(tables: &JobTables, range: &Range<i32>) -> Result<(String, String)> {
    rows::reading_table(&tables.items_relname(), |items| {
        let key = |position: i32| {
            items
                .find("position", Key::Int4(position), |row| {
                    row.get::<String>("item_key")
                })
                .map(|key| key.flatten().unwrap_or_default())
        };
        Ok((key(range.start)?, key(range.end - 1)?))
    })
}

/// Moves the checkpoint of the locked job past the chunk `range`, with its new seal,
/// once the chunk's audit rows are written; where etc_batch.job has a trigger for it (a
/// DBA's), by sql::ADVANCE, so that it fires. Returns the job's status after it.
pub fn advance(job_id: &str, tables: &JobTables, at: Tid, range: &Range<i32>) -> Result<JobStatus> {
    let moved = rows::with_table("job", |jobs| {
        if jobs.fires_on_update() {
            return Ok(None);
        }
        // SAFETY: reads the start of the current transaction, now()
        let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
        let now = pg_sys::Datum::from(now);
        let updated = jobs.update_locked(at, "job_number", Key::Int8(tables.number), |row| {
            let next_index = row.get::<i32>("next_index")?.unwrap_or(-1);
            if next_index != range.start {
                return Err(BatchError::Internal("the checkpoint did not move".into()));
            }
            let chunks = row.get::<i32>("chunks_committed")?.unwrap_or(0) + 1;
            let done = range.end == row.get::<i32>("item_count")?.unwrap_or(-1);
            let status = if done {
                JobStatus::Done
            } else {
                JobStatus::parse(&row.get::<String>("status")?.unwrap_or_default())?
            };
            let started = row.get::<TimestampWithTimeZone>("started_at")?;
            let set = vec![
                ("next_index", range.end.into_datum()),
                ("chunks_committed", chunks.into_datum()),
                ("seal", seal(job_id, range.end, chunks).into_datum()),
                ("started_at", started.map_or(Some(now), |s| s.into_datum())),
                ("last_commit_at", Some(now)),
                ("status", status.as_str().into_datum()),
                ("finished_at", done.then_some(now)),
            ];
            Ok((set, status))
        })?;
        Ok(Some(updated))
    })?;
    match moved {
        Some(Some(status)) => Ok(status),
        Some(None) => Err(BatchError::UnknownJob {
            job: job_id.to_string(),
        }),
        None => {
            let status = query::one::<String>(
                sql::ADVANCE,
                &[job_id.into(), range.start.into(), range.end.into()],
            )?
            .ok_or_else(|| BatchError::Internal("the checkpoint did not move".into()))?;
            JobStatus::parse(&status)
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::job::sql::SEAL;
    use pgrx::prelude::*;

    #[pg_test]
    fn the_seal_is_the_one_the_statements_compute() {
        for (job, next, chunks) in [("festival", 40, 4), ("", 0, 0), ("a:b \"c\"", 7, 1)] {
            let sql =
                Spi::get_one_with_args::<i64>(SEAL, &[job.into(), next.into(), chunks.into()])
                    .unwrap()
                    .unwrap();
            assert_eq!(super::seal(job, next, chunks), sql);
        }
    }
}
