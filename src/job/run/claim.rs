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

use crate::error::{BatchError, Result};
use crate::halt::Halt;
use crate::job::register::tables::JobTables;
use crate::job::rules::progress::Progress;
use crate::job::run::checkpoint::{chunk_items, first_audit_from, outside_changes};
use crate::job::run::chunk::{held_back, OpenChunk, Opening, Recheck};
use crate::job::run::seal;
use crate::job::sql;
use crate::own_rows::{self, Columns, Compare, Key, Lock, RowWriter, Tid};
use crate::query;
use crate::status::JobStatus;
use crate::txn::txid_current;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::IntoDatum;
use std::ops::ControlFlow;

/// A chunk this drainer holds.
struct Claimed {
    chunk: i32,
    at: Tid,
}

/// What looking for a chunk came to.
enum Claim {
    Claimed(Claimed),
    /// Every chunk not yet committed is held by another drainer.
    AllHeld,
    /// Every chunk is committed.
    NoneOpen,
    /// Why the job's progress cannot be trusted.
    Untrusted(String),
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

impl Default for Cursor {
    fn default() -> Cursor {
        Cursor::new()
    }
}

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

/// The next chunk of a parallel job, in the current transaction: claimed (see Cursor for
/// where it looks), and checked at a cost that does not grow with the job (the job's
/// status and counters, read after the chunk partition's lock is granted; the chunk
/// row's seal; one probe of the audit partition for a row inside the chunk), and its
/// keys read; held back by the job's pause or `halt`. `progress` gives the job's item
/// count and chunk size. Run as the owner.
///
/// The chunk partition's ROW EXCLUSIVE lock is taken first and kept to the end of the
/// transaction: a job being stopped holds EXCLUSIVE, and this waits for it.
pub fn open(
    job_id: &str,
    tables: &JobTables,
    progress: Progress,
    cursor: &mut Cursor,
    halt: &dyn Halt,
) -> Result<Opening> {
    let chunks = crate::job::rules::progress::chunk_count(progress.item_count, progress.chunk_size);
    let claimed = own_rows::with_table(&tables.chunks_relname(), |rows_of_chunks| {
        // the job as the transaction that holds the lock sees it: a stop recorded before
        // is seen here
        let job = own_rows::reading_table("job", |jobs| {
            jobs.first(
                "job_number",
                Compare::Equal,
                Key::Int8(tables.number),
                |row| {
                    Ok((
                        row.get::<String>("job_id")?.unwrap_or_default(),
                        JobStatus::parse(&row.get::<String>("status")?.unwrap_or_default())?,
                        row.get::<i64>("audit_changes")?.unwrap_or(0),
                        row.get::<i64>("item_changes")?.unwrap_or(0),
                    ))
                },
            )
        })?;
        let Some((_, status, audit_changes, item_changes)) = job.filter(|j| j.0 == job_id) else {
            return Err(BatchError::UnknownJob {
                job: job_id.to_string(),
            });
        };
        match status {
            JobStatus::Pending => {}
            JobStatus::Done => return Ok(Err(Opening::Done)),
            stopped => return Ok(Err(Opening::Stopped(stopped))),
        }
        if let Some(paused) = held_back(job_id, halt)? {
            return Ok(Err(Opening::Paused(paused)));
        }
        if audit_changes != 0 || item_changes != 0 {
            return Ok(Err(Opening::Untrusted(outside_changes(
                audit_changes,
                item_changes,
            ))));
        }
        let look = Look {
            job_id,
            chunks: rows_of_chunks,
        };
        Ok(match look_for(&look, cursor, chunks)? {
            Claim::Claimed(claimed) => Ok(claimed),
            Claim::AllHeld => Err(Opening::AllHeld),
            Claim::NoneOpen => Err(Opening::AllCommitted),
            Claim::Untrusted(reason) => Err(Opening::Untrusted(reason)),
        })
    })?;
    let claimed = match claimed {
        Ok(claimed) => claimed,
        Err(opening) => return Ok(opening),
    };
    let chunk = Progress {
        next_index: (claimed.chunk - 1).saturating_mul(progress.chunk_size),
        ..progress
    };
    let range = match chunk.next_chunk() {
        Some(range) if chunk.chunk_number().0 == claimed.chunk => range,
        _ => {
            return Ok(Opening::Untrusted(format!(
                "The job has a row for chunk {}, but its {} approved items make {chunks} chunks.",
                claimed.chunk, progress.item_count
            )))
        }
    };
    // no audit row may exist inside a chunk that is not committed
    if let Some(position) = first_audit_from(tables, range.start)?.filter(|p| *p < range.end) {
        return Ok(Opening::Untrusted(format!(
            "An audit row exists at position {position}, inside chunk {}, which is not committed.",
            claimed.chunk
        )));
    }
    let items = match chunk_items(tables, &range)? {
        Ok(items) => items,
        Err(reason) => return Ok(Opening::Untrusted(reason)),
    };
    Ok(OpenChunk::claimed(chunk, items, claimed.at).map_or(Opening::AllCommitted, Opening::Open))
}

/// Looks for a chunk that is neither committed nor held, and claims it.
fn look_for(look: &Look, cursor: &mut Cursor, chunks: i32) -> Result<Claim> {
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
}

/// One look along the chunk rows.
struct Look<'a, 't> {
    job_id: &'a str,
    chunks: &'a own_rows::Table<'t>,
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
            .scan("chunk", Compare::AtLeast, Key::Int4(start), |row, at| {
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
            Some(Some((chunk, sealed, _)))
                if sealed != Some(seal::chunk(self.job_id, chunk, false)) =>
            {
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

/// Marks chunk `chunk`, claimed at `at`, committed, with its new seal, the transaction
/// and its time, and when its drainer's work towards it began (`since`), once its audit
/// rows are written.
pub fn mark_committed(
    job_id: &str,
    tables: &JobTables,
    chunk: i32,
    at: Tid,
    since: TimestampWithTimeZone,
    seconds: f64,
) -> Result<()> {
    let sealed = seal::chunk(job_id, chunk, true);
    let txid = txid_current();
    // the time of the commit, as near as it can be known before it
    let now = pgrx::datum::clock_timestamp();
    own_rows::with_table(&tables.chunks_relname(), |chunks| {
        chunks.update_locked(at, "chunk", Key::Int4(chunk), |row| {
            if row.get::<bool>("committed")? != Some(false) {
                return Err(BatchError::Internal(format!(
                    "chunk {chunk} was committed by another drainer while this one held it"
                )));
            }
            let set = vec![
                ("committed", true.into_datum()),
                ("seal", sealed.into_datum()),
                ("txid", txid.into_datum()),
                ("committed_at", now.into_datum()),
                ("started_at", since.into_datum()),
                ("chunk_seconds", seconds.into_datum()),
            ];
            Ok((set, ()))
        })
    })?
    .ok_or_else(|| BatchError::Internal(format!("the row of chunk {chunk} is gone")))
}

/// Takes the chunk partition's EXCLUSIVE lock, so that a change to the job's status
/// (conflict, corrupt, aborted) is recorded after every chunk in flight has ended and
/// before any other begins (see the module's comment). Run as the owner.
pub fn stop(tables: &JobTables) -> Result<()> {
    query::run(&tables.sql(sql::LOCK_CHUNKS), &[])
}

/// After a chunk was rolled back and the job stopped (`stop`): whether it is still
/// pending, so that what stopped the chunk is to be recorded. Run as the owner.
pub fn recheck(job_id: &str) -> Result<Recheck> {
    let status = query::one::<String>(sql::JOB_STATUS, &[job_id.into()])?.ok_or_else(|| {
        BatchError::UnknownJob {
            job: job_id.to_string(),
        }
    })?;
    Ok(match JobStatus::parse(&status)? {
        JobStatus::Pending => Recheck::Record,
        JobStatus::Done => Recheck::Again,
        stopped => Recheck::Stopped(stopped),
    })
}

/// The columns of a job's chunk partition (sql/jobs.sql).
const CHUNK_COLUMNS: Columns = &[
    ("job_id", pg_sys::TEXTOID),
    ("chunk", pg_sys::INT4OID),
    ("committed", pg_sys::BOOLOID),
    ("seal", pg_sys::INT8OID),
    ("txid", pg_sys::INT8OID),
    ("committed_at", pg_sys::TIMESTAMPTZOID),
    ("started_at", pg_sys::TIMESTAMPTZOID),
    ("chunk_seconds", pg_sys::FLOAT8OID),
];

/// How many chunk rows are written at once.
const CHUNK_ROWS_AT_ONCE: i32 = 1000;

/// A parallel job's `chunks` chunk rows, open, each with its seal, written at
/// registration into its chunk partition. Run as the owner.
pub fn write_chunk_rows(job_id: &str, tables: &JobTables, chunks: i32) -> Result<()> {
    let mut writer = RowWriter::new(&tables.chunks_relname(), CHUNK_COLUMNS)?;
    let job = job_id.into_datum();
    let open = false.into_datum();
    let mut first = 1;
    while first <= chunks {
        let n = CHUNK_ROWS_AT_ONCE.min(chunks - first + 1);
        writer.write(n as usize, |i, values| {
            let chunk = first + i as i32;
            values.copy_from_slice(&[
                job,
                chunk.into_datum(),
                open,
                seal::chunk(job_id, chunk, false).into_datum(),
                None,
                None,
                None,
                None,
            ]);
        })?;
        first += n;
    }
    Ok(())
}

/// A parallel job's chunk rows counted: all of them, the committed ones, and those that
/// do not match their seal.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRows {
    pub rows: i64,
    pub committed: i64,
    pub unsealed: i64,
}

/// Reads every chunk row of a parallel job, in chunk order. Run as the owner.
pub fn chunk_rows(job_id: &str, tables: &JobTables) -> Result<ChunkRows> {
    let mut counted = ChunkRows::default();
    own_rows::reading_table(&tables.chunks_relname(), |chunks| {
        chunks.scan("chunk", Compare::AtLeast, Key::Int4(i32::MIN), |row, _| {
            let chunk = row.get::<i32>("chunk")?.unwrap_or(-1);
            let committed = row.get::<bool>("committed")?.unwrap_or(false);
            counted.rows += 1;
            counted.committed += i64::from(committed);
            if row.get::<i64>("seal")? != Some(seal::chunk(job_id, chunk, committed)) {
                counted.unsealed += 1;
            }
            Ok(ControlFlow::<()>::Continue(()))
        })
    })?;
    Ok(counted)
}

/// Every chunk is committed: the job's row says so (done, next_index at the end, the
/// chunk count, its seal), once the chunk rows and the audit agree, all of them. The
/// reason it cannot be trusted otherwise. Run as the owner.
pub fn finish(job_id: &str, tables: &JobTables, chunks: i32, items: i32) -> Result<Option<String>> {
    let ChunkRows {
        rows,
        committed,
        unsealed,
    } = chunk_rows(job_id, tables)?;
    let audits = query::one::<i64>(&tables.sql(sql::AUDIT_ROWS), &[])?.unwrap_or(0);
    if rows != chunks as i64 || committed != rows || unsealed != 0 || audits != items as i64 {
        return Ok(Some(format!(
            "No chunk is open, but {committed} of {rows} chunk rows (of {chunks} chunks) are \
             committed, {unsealed} do not match their seal, and {audits} audit rows were \
             written for {items} approved items."
        )));
    }
    query::run(
        sql::FINISH,
        &[
            job_id.into(),
            chunks.into(),
            seal::checkpoint(job_id, items, chunks).into(),
        ],
    )?;
    Ok(None)
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
