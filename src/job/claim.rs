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
use crate::pauses::{self, Paused};
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
    /// The job is paused.
    Paused(Paused),
}

/// Where a drainer looks for its next chunk, for the span of one call.
///
/// Drainers that take neighbouring chunks change neighbouring rows: the same pages of
/// the target, of its indexes and of the job's own tables, whose buffer locks they would
/// then queue on. So a drainer goes on from the chunk after the one it last took, and
/// when the free chunk it finds lies right after one another drainer holds, it tries
/// places spread evenly over the chunks not yet seen committed (half of the way, a
/// quarter, three quarters, an eighth, ...), and takes the first free chunk it finds
/// there that is not right after a held one: the first drainer takes chunk 1, the second
/// the middle of the job, the third a quarter of the way, and each keeps its distance as
/// it goes on. Only when that fails some times over does it take chunks side by side.
pub struct Cursor {
    /// Every chunk below it was seen committed.
    first_open: i32,
    /// Where the next look begins.
    next: Option<i32>,
}

/// How many places a look tries before it takes a chunk next to one another drainer
/// holds: enough for a few dozen drainers to find places of their own.
const MOVES_PER_LOOK: u32 = 12;

impl Cursor {
    pub fn new() -> Cursor {
        Cursor {
            first_open: 1,
            next: None,
        }
    }

    /// The `n`th place (1 on) to try in chunks [first_open, chunks]: at the `n`th
    /// fraction of the van der Corput sequence (1/2, 1/4, 3/4, 1/8, 5/8, ...), which
    /// spreads any number of places evenly.
    fn place(&self, n: u32, chunks: i32) -> i32 {
        let (mut fraction, mut denominator, mut k) = (0u64, 1u64, n as u64);
        while k > 0 {
            denominator *= 2;
            fraction = fraction * 2 + (k & 1);
            k >>= 1;
        }
        let span = (chunks - self.first_open + 1).max(1) as u64;
        self.first_open + (span * fraction / denominator) as i32
    }
}

/// Looks for a chunk that is neither committed nor held, and claims it (see Cursor for
/// where it looks). The chunk partition's ROW EXCLUSIVE lock is taken first and kept to
/// the end of the transaction: a job being stopped holds EXCLUSIVE, and this waits for it.
pub fn claim(job_id: &str, tables: &JobTables, chunks: i32, cursor: &mut Cursor) -> Result<Claim> {
    rows::with_table(&tables.chunks_relname(), |rows_of_chunks| {
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
        let Some((_, status, audit_changes, item_changes)) = job.filter(|j| j.0 == job_id) else {
            return Err(BatchError::UnknownJob {
                job: job_id.to_string(),
            });
        };
        if status != JobStatus::Pending {
            return Ok(Claim::Stopped(status));
        }
        if let Some(paused) = pauses::of_job(job_id)? {
            return Ok(Claim::Paused(paused));
        }
        if audit_changes != 0 || item_changes != 0 {
            return Ok(Claim::Untrusted(format!(
                "Since they were written, {audit_changes} change(s) to the job's audit rows and \
                 {item_changes} change(s) to its approved items were made outside etc_batch."
            )));
        }
        let look = Look {
            job_id,
            chunks: rows_of_chunks,
        };
        let mut moves = 0;
        let mut start = cursor.next.unwrap_or(cursor.first_open);
        let mut held = false;
        loop {
            // from `start` to the end; then, if nothing was found, from the first chunk
            // not seen committed (the look that tells the job is complete)
            let found = look.from(start, moves < MOVES_PER_LOOK)?;
            held |= found.held;
            match found.outcome {
                Found::Claimed(claim) => {
                    cursor.next = Some(claim.chunk + 1);
                    return Ok(Claim::Claimed(claim));
                }
                Found::Untrusted(reason) => return Ok(Claim::Untrusted(reason)),
                Found::NextToAnother => {
                    moves += 1;
                    start = cursor.place(moves, chunks);
                }
                Found::End if start > cursor.first_open => {
                    let whole = look.from(cursor.first_open, false)?;
                    held |= whole.held;
                    if let Some(open) = whole.first_open {
                        cursor.first_open = open;
                    }
                    return Ok(match whole.outcome {
                        Found::Claimed(claim) => {
                            cursor.next = Some(claim.chunk + 1);
                            Claim::Claimed(claim)
                        }
                        Found::Untrusted(reason) => Claim::Untrusted(reason),
                        _ if held => Claim::AllHeld,
                        _ => Claim::NoneOpen,
                    });
                }
                Found::End => {
                    if let Some(open) = found.first_open {
                        cursor.first_open = open;
                    }
                    return Ok(if held {
                        Claim::AllHeld
                    } else {
                        Claim::NoneOpen
                    });
                }
            }
        }
    })
}

/// One look along the chunk rows.
struct Look<'a, 't> {
    job_id: &'a str,
    chunks: &'a rows::Table<'t>,
}

enum Found {
    Claimed(Claimed),
    Untrusted(String),
    /// The free chunk found lies right after one another drainer holds.
    NextToAnother,
    /// No free chunk to the end.
    End,
}

struct Looked {
    outcome: Found,
    /// Whether a chunk not committed was held by another drainer.
    held: bool,
    /// The first chunk seen not committed.
    first_open: Option<i32>,
}

impl Look<'_, '_> {
    /// From chunk `start` on: the first chunk neither committed nor held, claimed,
    /// unless `spread` and it lies right after a chunk another drainer holds.
    fn from(&self, start: i32, spread: bool) -> Result<Looked> {
        let mut held = false;
        let mut after_held = false;
        let mut first_open = None;
        let found = self
            .chunks
            .scan_from("chunk", Key::Int4(start), |row, at| {
                if row.get::<bool>("committed")? == Some(true) {
                    after_held = false;
                    return Ok(ControlFlow::Continue(()));
                }
                let chunk = row.get::<i32>("chunk")?.unwrap_or(-1);
                first_open.get_or_insert(chunk);
                if spread && after_held {
                    // not locked: a free chunk right behind another drainer is left to it
                    return Ok(ControlFlow::Break(None));
                }
                let locked = self.chunks.lock_at(at, false, |row| {
                    Ok((
                        row.get::<bool>("committed")?.unwrap_or(false),
                        row.get::<i64>("seal")?,
                    ))
                })?;
                Ok(match locked {
                    // committed by another drainer since this snapshot was taken
                    Lock::Row((true, _), _) | Lock::Missing => {
                        after_held = false;
                        ControlFlow::Continue(())
                    }
                    Lock::HeldByAnother => {
                        held = true;
                        after_held = true;
                        ControlFlow::Continue(())
                    }
                    Lock::Row((false, seal), at) => ControlFlow::Break(Some((chunk, seal, at))),
                })
            })?;
        let outcome = match found {
            None => Found::End,
            Some(None) => Found::NextToAnother,
            Some(Some((chunk, seal, _))) if seal != Some(chunk_seal(self.job_id, chunk, false)) => {
                Found::Untrusted(format!(
                    "The row of chunk {chunk} says it is not committed, but does not match its \
                     seal: it was changed outside etc_batch."
                ))
            }
            Some(Some((chunk, _, at))) => Found::Claimed(Claimed { chunk, at }),
        };
        Ok(Looked {
            outcome,
            held,
            first_open,
        })
    }
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

#[cfg(test)]
mod places {
    use super::Cursor;

    #[test]
    fn places_spread_evenly_over_the_open_chunks() {
        let cursor = Cursor {
            first_open: 1,
            next: None,
        };
        let places: Vec<i32> = (1..=7).map(|n| cursor.place(n, 800)).collect();
        assert_eq!(places, vec![401, 201, 601, 101, 501, 301, 701]);
        let later = Cursor {
            first_open: 101,
            next: None,
        };
        assert_eq!(later.place(1, 200), 151);
        // a job of one chunk has one place
        assert_eq!(
            Cursor {
                first_open: 1,
                next: None
            }
            .place(3, 1),
            1
        );
    }
}
