//! A parallel job's chunks, claimed by any number of drainers at once.
//!
//! A parallel job has one row per chunk in its partition of etc_batch.job_chunk
//! (`job_chunk_<job_number>`): the chunk's number, whether it is committed, and a seal of
//! that. A drainer claims a chunk by locking its row, skipping the rows other drainers
//! hold (as `FOR UPDATE SKIP LOCKED` does), and commits the chunk's change, its audit rows
//! and `committed = true` in the one transaction the lock lives in. So:
//! - no two drainers ever hold one chunk, and none waits for another's chunk;
//! - a drainer that dies (terminated, crashed, its connection lost) ends its transaction,
//!   which releases the row and leaves nothing of the chunk written: the chunk is
//!   claimable at once, with no timeout to wait out;
//! - the promise is about which chunks are committed, not a prefix: chunks commit in
//!   whatever order their drainers finish.
//!
//! Before its change, a drainer checks the promise for its chunk, at a cost that does not
//! grow with the job: the job's status and its counters of changes made outside etc_batch
//! (read after the chunk partition's lock is granted, see `stop`), the chunk row's seal,
//! and one probe of the audit partition for a row inside the chunk (there must be none).
//!
//! Stopping a parallel job (a conflict, corrupt progress, abort_job, verify_job) takes the
//! chunk partition's EXCLUSIVE lock first: it waits for the chunks in flight, which commit
//! before the stop is recorded, and every drainer that comes after waits for it and then
//! reads the job's new status, and stops.

use super::checkpoint::hash_seal;
use super::sql;
use super::tables::JobTables;
use crate::error::{BatchError, Result};
use crate::query;
use crate::rows::{self, Key, Lock, Tid};
use crate::status::JobStatus;
use crate::txn::txid_current;
use pgrx::IntoDatum;
use std::ops::ControlFlow;

/// The seal of a chunk row: hashtextextended(job || ':chunk:' || chunk || ':' ||
/// committed as 0 or 1, 7919), as sql/jobs.sql writes it for an open chunk.
pub fn chunk_seal(job_id: &str, chunk: i32, committed: bool) -> i64 {
    hash_seal(&format!("{job_id}:chunk:{chunk}:{}", committed as i32))
}

/// A chunk this drainer holds.
pub struct Claimed {
    pub chunk: i32,
    at: Tid,
}

/// What looking for a chunk came to.
pub enum Claim {
    Claimed(Claimed),
    /// Every chunk not yet committed is held by another drainer.
    AllHeld,
    /// Every chunk is committed.
    NoneOpen,
    /// The job is no longer pending.
    Stopped(JobStatus),
    /// Why the job's progress cannot be trusted.
    Untrusted(String),
}

/// Looks for the first chunk from `from` on that is neither committed nor held, and
/// claims it; `from` moves up to the first chunk not committed, so that the next look
/// starts there. The chunk partition's ROW EXCLUSIVE lock is taken first and kept to the
/// end of the transaction: a job being stopped holds EXCLUSIVE, and this waits for it.
pub fn claim(job_id: &str, tables: &JobTables, from: &mut i32) -> Result<Claim> {
    rows::with_table(&tables.chunks_relname(), |chunks| {
        // the job as the transaction that holds the lock sees it: a stop recorded before
        // is seen here
        let job = rows::reading_table("job", |jobs| {
            jobs.find("job_number", Key::Int8(tables.number), |row| {
                Ok((
                    row.get::<String>("job_id")?.unwrap_or_default(),
                    JobStatus::parse(&row.get::<String>("status")?.unwrap_or_default())?,
                    row.get::<i64>("audit_changes")?.unwrap_or(0),
                    row.get::<i64>("item_changes")?.unwrap_or(0),
                ))
            })
        })?;
        let Some((id, status, audit_changes, item_changes)) = job.filter(|j| j.0 == job_id) else {
            return Err(BatchError::UnknownJob {
                job: job_id.to_string(),
            });
        };
        let _ = id;
        if status != JobStatus::Pending {
            return Ok(Claim::Stopped(status));
        }
        if audit_changes != 0 || item_changes != 0 {
            return Ok(Claim::Untrusted(format!(
                "Since they were written, {audit_changes} change(s) to the job's audit rows and \
                 {item_changes} change(s) to its approved items were made outside etc_batch."
            )));
        }
        let mut held = false;
        let mut first_open = None;
        let found = chunks.scan_from("chunk", Key::Int4(*from), |row, at| {
            if row.get::<bool>("committed")? == Some(true) {
                return Ok(ControlFlow::Continue(()));
            }
            let chunk = row.get::<i32>("chunk")?.unwrap_or(-1);
            first_open.get_or_insert(chunk);
            let locked = chunks.lock_at(at, false, |row| {
                Ok((
                    row.get::<bool>("committed")?.unwrap_or(false),
                    row.get::<i64>("seal")?,
                ))
            })?;
            Ok(match locked {
                // committed by another drainer since this snapshot was taken
                Lock::Row((true, _), _) | Lock::Missing => ControlFlow::Continue(()),
                Lock::HeldByAnother => {
                    held = true;
                    ControlFlow::Continue(())
                }
                Lock::Row((false, seal), at) => ControlFlow::Break((chunk, seal, at)),
            })
        })?;
        if let Some(open) = first_open {
            *from = open;
        }
        Ok(match found {
            Some((chunk, seal, _)) if seal != Some(chunk_seal(job_id, chunk, false)) => {
                Claim::Untrusted(format!(
                    "The row of chunk {chunk} says it is not committed, but does not match its \
                     seal: it was changed outside etc_batch."
                ))
            }
            Some((chunk, _, at)) => Claim::Claimed(Claimed { chunk, at }),
            None if held => Claim::AllHeld,
            None => Claim::NoneOpen,
        })
    })
}

/// Marks the claimed chunk committed, with its new seal, the transaction and its time,
/// once its audit rows are written; where the partition has a trigger for it (a DBA's),
/// by a statement, so that it fires.
pub fn mark_committed(job_id: &str, tables: &JobTables, claimed: &Claimed) -> Result<()> {
    let seal = chunk_seal(job_id, claimed.chunk, true);
    let txid = txid_current();
    // the time of the commit, as near as it can be known before it
    let now = pgrx::datum::clock_timestamp();
    let direct = rows::with_table(&tables.chunks_relname(), |chunks| {
        if chunks.fires_on_update() {
            return Ok(None);
        }
        let updated =
            chunks.update_locked(claimed.at, "chunk", Key::Int4(claimed.chunk), |row| {
                if row.get::<bool>("committed")? != Some(false) {
                    return Err(BatchError::Internal(format!(
                        "chunk {} was committed by another drainer while this one held it",
                        claimed.chunk
                    )));
                }
                let set = vec![
                    ("committed", true.into_datum()),
                    ("seal", seal.into_datum()),
                    ("txid", txid.into_datum()),
                    ("committed_at", now.into_datum()),
                ];
                Ok((set, ()))
            })?;
        Ok(Some(updated))
    })?;
    match direct {
        Some(Some(())) => Ok(()),
        Some(None) => Err(BatchError::Internal(format!(
            "the row of chunk {} is gone",
            claimed.chunk
        ))),
        None => {
            let marked = query::one::<i32>(
                &tables.sql(sql::MARK_CHUNK),
                &[claimed.chunk.into(), seal.into(), txid.into(), now.into()],
            )?;
            marked.map(|_| ()).ok_or_else(|| {
                BatchError::Internal(format!("chunk {} was not marked", claimed.chunk))
            })
        }
    }
}

/// Takes the chunk partition's EXCLUSIVE lock, so that a change to the job's status
/// (conflict, corrupt, aborted) is recorded after every chunk in flight has ended and
/// before any other begins (see the module's comment). Run as the owner.
pub fn stop(tables: &JobTables) -> Result<()> {
    query::run(&tables.sql(sql::LOCK_CHUNKS), &[])
}

/// Every chunk is committed: the job's row says so (done, next_index at the end, the
/// chunk count, its seal), once the chunk rows and the audit agree, all of them. The
/// reason it cannot be trusted otherwise. Run as the owner.
pub fn finish(job_id: &str, tables: &JobTables, chunks: i32, items: i32) -> Result<Option<String>> {
    let (rows, committed, unsealed, audits) =
        query::row(&tables.sql(sql::CHUNKS_DONE), &[job_id.into()], |r| {
            Ok((
                r.get::<i64>(1)?.unwrap_or(0),
                r.get::<i64>(2)?.unwrap_or(0),
                r.get::<i64>(3)?.unwrap_or(0),
                r.get::<i64>(4)?.unwrap_or(0),
            ))
        })?
        .unwrap_or_default();
    if rows != chunks as i64 || committed != rows || unsealed != 0 || audits != items as i64 {
        return Ok(Some(format!(
            "No chunk is open, but {committed} of {rows} chunk rows (of {chunks} chunks) are \
             committed, {unsealed} do not match their seal, and {audits} audit rows were \
             written for {items} approved items."
        )));
    }
    query::run(sql::FINISH_PARALLEL, &[job_id.into(), chunks.into()])?;
    Ok(None)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn the_chunk_seal_is_the_one_sql_writes() {
        for (job, chunk, committed) in [
            ("festival", 1, false),
            ("festival", 1, true),
            ("a:b", 77, false),
        ] {
            let sql = Spi::get_one_with_args::<i64>(
                "SELECT pg_catalog.hashtextextended($1 || ':chunk:' || $2 || ':' || $3::int, 7919)",
                &[job.into(), chunk.into(), committed.into()],
            )
            .unwrap()
            .unwrap();
            assert_eq!(super::chunk_seal(job, chunk, committed), sql);
        }
    }
}
