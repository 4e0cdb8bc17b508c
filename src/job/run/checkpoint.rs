//! The job's row in a chunk's transaction, read and written without statements: the
//! row locked and its checkpoint checked before the chunk (the seal, the counters, one
//! probe of the audit partition for a row at or beyond it), the chunk's items read from
//! its row of the item partition, and the checkpoint moved past the chunk
//! after its audit rows. What each statement would have cost (a plan found, an executor
//! started and ended) is most of what these small reads and one write cost, so a chunk's
//! only statement is its change. The rules are progress.rs's; `verify_job` checks the
//! same promise in SQL.

use crate::error::{BatchError, Result};
use crate::halt::Halt;
use crate::job::register::tables::JobTables;
use crate::job::rules::progress::Progress;
use crate::job::run::chunk::{held_back, ChunkItems, ItemArrays, OpenChunk, Opening, Recheck};
use crate::job::run::seal;
use crate::own_rows::{self, Compare, Key, Lock, Tid};
use crate::status::JobStatus;
use pgrx::datum::{clock_timestamp, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::IntoDatum;
use std::ops::Range;

/// The job's row, locked, as the chunk's transaction found it.
struct Locked {
    status: JobStatus,
    progress: Progress,
    audit_changes: i64,
    item_changes: i64,
    sealed: bool,
    /// Where the locked version of the job's row lies, for moving the checkpoint.
    at: Tid,
}

impl Locked {
    /// The cheap, exact check (see progress.rs), but for the probe of the audit: why the
    /// checkpoint cannot be trusted.
    fn untrusted(&self) -> Option<String> {
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
            return Some(outside_changes(self.audit_changes, self.item_changes));
        }
        None
    }
}

/// Why a job whose records were changed outside etc_batch cannot be trusted.
pub fn outside_changes(audit_changes: i64, item_changes: i64) -> String {
    format!(
        "Since they were written, {audit_changes} change(s) to the job's audit rows and \
         {item_changes} change(s) to its approved items were made outside etc_batch."
    )
}

/// Locks job `job_id`'s row (waiting for a drainer that holds it: two drainers never
/// pick the same chunk) and reads its checkpoint as the last committed chunk left it.
/// The partitions are read after the lock is granted, in a snapshot taken then, so that
/// they show what the drainer before committed. None: the job is gone.
fn lock(job_id: &str, tables: &JobTables) -> Result<Option<Locked>> {
    let row = own_rows::with_table("job", |jobs| {
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
                row.get::<i64>("seal")? == Some(seal::checkpoint(job_id, next_index, chunks)),
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
    Ok(Some(Locked {
        status,
        progress,
        audit_changes,
        item_changes,
        sealed,
        at,
    }))
}

/// The next chunk of a sequential job, in the current transaction: the job's row locked,
/// its checkpoint checked (position, seal, counters, one probe of the audit partition
/// for a row at or beyond it), and the chunk's keys read; held back by the job's pause or
/// `halt`. Run as the owner.
pub fn open(job_id: &str, tables: &JobTables, halt: &dyn Halt) -> Result<Opening> {
    let locked = lock(job_id, tables)?.ok_or_else(|| BatchError::UnknownJob {
        job: job_id.to_string(),
    })?;
    match locked.status {
        JobStatus::Pending => {}
        JobStatus::Done => return Ok(Opening::Done),
        stopped => return Ok(Opening::Stopped(stopped)),
    }
    if let Some(paused) = held_back(job_id, halt)? {
        return Ok(Opening::Paused(paused));
    }
    if let Some(reason) = locked.untrusted() {
        return Ok(Opening::Untrusted(reason));
    }
    let progress = locked.progress;
    if let Some(position) = first_audit_from(tables, progress.next_index)? {
        return Ok(Opening::Untrusted(format!(
            "An audit row exists at position {position}, at or beyond the checkpoint {}.",
            progress.next_index
        )));
    }
    let Some(range) = progress.next_chunk() else {
        return Ok(Opening::Untrusted(format!(
            "The checkpoint is at the end of the {} approved items, but the job is not done.",
            progress.item_count
        )));
    };
    let items = match chunk_items(tables, &range)? {
        Ok(items) => items,
        Err(reason) => return Ok(Opening::Untrusted(reason)),
    };
    Ok(OpenChunk::checkpoint(progress, items, locked.at).map_or(Opening::Done, Opening::Open))
}

/// The checkpoint of a sequential job moved past the chunks of the open transaction,
/// when they share it (job/run/group.rs), and not yet written: the job's row stays
/// locked from the first chunk's `open` to the transaction's end, so nobody else moves
/// it meanwhile, and it is written once (`write`) before the COMMIT. Writing it after
/// every chunk would leave one dead version of the row per chunk in the transaction,
/// each a step more for the next lookup of the row.
pub struct Unwritten {
    /// The locked version of the job's row.
    at: Tid,
    /// The checkpoint as the transaction found it, and past its last chunk now.
    from: i32,
    to: i32,
    item_count: i32,
    chunk_size: i32,
    chunks: i32,
    /// When the drainer's work towards the first chunk began, and the chunks' own
    /// seconds added up.
    since: TimestampWithTimeZone,
    seconds: f64,
}

impl Unwritten {
    /// The first chunk of the transaction, `range`, closed at `at`.
    pub fn first(
        at: Tid,
        range: &Range<i32>,
        progress: Progress,
        since: TimestampWithTimeZone,
        seconds: f64,
    ) -> Unwritten {
        Unwritten {
            at,
            from: range.start,
            to: range.end,
            item_count: progress.item_count,
            chunk_size: progress.chunk_size,
            chunks: 1,
            since,
            seconds,
        }
    }

    /// The next chunk of the transaction, `range`, closed.
    pub fn add(&mut self, range: &Range<i32>, seconds: f64) {
        debug_assert_eq!(range.start, self.to);
        self.to = range.end;
        self.chunks += 1;
        self.seconds += seconds;
    }

    /// Whether the job is done with the chunks so far.
    pub fn done(&self) -> bool {
        self.to == self.item_count
    }

    fn progress(&self) -> Progress {
        Progress {
            next_index: self.to,
            item_count: self.item_count,
            chunk_size: self.chunk_size,
        }
    }
}

/// The next chunk of a sequential job in a transaction that has chunks before it
/// (`Unwritten`): the job's row is locked since the first of them and was checked then,
/// and the audit rows past the checkpoint it found are this transaction's own; only the
/// job's pause or `halt` and the chunk's items are read. Run as the owner.
pub fn open_next(
    job_id: &str,
    tables: &JobTables,
    held: &Unwritten,
    halt: &dyn Halt,
) -> Result<Opening> {
    if let Some(paused) = held_back(job_id, halt)? {
        return Ok(Opening::Paused(paused));
    }
    let progress = held.progress();
    let Some(range) = progress.next_chunk() else {
        return Ok(Opening::Done);
    };
    let items = match chunk_items(tables, &range)? {
        Ok(items) => items,
        Err(reason) => return Ok(Opening::Untrusted(reason)),
    };
    Ok(OpenChunk::checkpoint(progress, items, held.at).map_or(Opening::Done, Opening::Open))
}

/// Writes the checkpoint moved past the transaction's chunks (`Unwritten`), as
/// `advance` does for one chunk. Returns the job's status after it. Run as the owner.
pub fn write(job_id: &str, tables: &JobTables, held: Unwritten) -> Result<JobStatus> {
    advance(
        job_id,
        tables,
        held.at,
        &(held.from..held.to),
        held.chunks,
        held.since,
        held.seconds,
    )
}

/// After the chunk `range` was rolled back: the job's row locked again, and whether the
/// checkpoint is still where the chunk began. Run as the owner.
pub fn recheck(job_id: &str, tables: &JobTables, range: &Range<i32>) -> Result<Recheck> {
    let locked = lock(job_id, tables)?.ok_or_else(|| BatchError::UnknownJob {
        job: job_id.to_string(),
    })?;
    Ok(match locked.status {
        JobStatus::Pending if locked.progress.next_index == range.start => Recheck::Record,
        JobStatus::Pending | JobStatus::Done => Recheck::Again,
        stopped => Recheck::Stopped(stopped),
    })
}

/// The first position at or beyond `position` that the audit holds, by one probe of the
/// job's audit partition: the first chunk row that ends there or later.
pub fn first_audit_from(tables: &JobTables, position: i32) -> Result<Option<i32>> {
    own_rows::reading_table(&tables.audit_relname(), |audit| {
        audit.first(
            "last_position",
            Compare::AtLeast,
            Key::Int4(position),
            |row| {
                Ok(row
                    .get::<i32>("first_position")?
                    .unwrap_or(-1)
                    .max(position))
            },
        )
    })
}

/// The chunk `range`'s approved items, as its row of the job's item partition holds
/// them, found by its primary key; or, when that row is gone or does not hold the
/// chunk's positions (changed with the counting triggers bypassed), why the frozen list
/// cannot be trusted.
pub fn chunk_items(
    tables: &JobTables,
    range: &Range<i32>,
) -> Result<std::result::Result<ChunkItems, String>> {
    let row = own_rows::reading_table(&tables.items_relname(), |items| {
        items.first(
            "first_position",
            Compare::Equal,
            Key::Int4(range.start),
            |row| {
                Ok((
                    row.value("keys")?,
                    row.value("revisions")?,
                    row.value("guards")?,
                ))
            },
        )
    })?;
    let Some((Some(keys), Some(revisions), guards)) = row else {
        return Ok(Err(short_list(range, 0)));
    };
    // SAFETY: a flat copy of the row's text[] column, alive in the current context
    let keys_read =
        unsafe { <pgrx::Array<&str> as pgrx::FromDatum>::from_datum(keys.datum(), false) };
    let (count, first_key, last_key) = match keys_read {
        Some(read) => {
            let key = |i: usize| read.get(i).flatten().unwrap_or_default().to_string();
            (read.len(), key(0), key(read.len().saturating_sub(1)))
        }
        None => (0, String::new(), String::new()),
    };
    if count != range.len() {
        return Ok(Err(short_list(range, count)));
    }
    Ok(Ok(ChunkItems {
        first_key,
        last_key,
        arrays: ItemArrays {
            keys,
            revisions,
            guards,
        },
    }))
}

/// Why a chunk's positions `range` cannot be trusted when the frozen list holds `found`
/// items there.
pub fn short_list(range: &Range<i32>, found: usize) -> String {
    format!(
        "Positions {} to {} should hold {} approved items, but {found} were found.",
        range.start,
        range.end - 1,
        range.len(),
    )
}

/// Moves the checkpoint of the locked job past `range`, the positions of the `chunks`
/// chunks of this transaction, with its new seal, once their audit rows are written,
/// and adds the time at work on them: from `since` (when its drainer's work towards the
/// first began) or the commit before it, whichever is later, to now; and the chunks' own
/// `seconds`, from opening to checkpoint, to the job's chunk_seconds. Returns the job's
/// status after it.
pub fn advance(
    job_id: &str,
    tables: &JobTables,
    at: Tid,
    range: &Range<i32>,
    chunks: i32,
    since: TimestampWithTimeZone,
    seconds: f64,
) -> Result<JobStatus> {
    // SAFETY: reads the start of the current transaction, now()
    let start = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    let now = pg_sys::Datum::from(start);
    own_rows::with_table("job", |jobs| {
        jobs.update_locked(at, "job_number", Key::Int8(tables.number), |row| {
            let next_index = row.get::<i32>("next_index")?.unwrap_or(-1);
            if next_index != range.start {
                return Err(BatchError::Internal("the checkpoint did not move".into()));
            }
            let in_transaction = chunks;
            let chunks = row.get::<i32>("chunks_committed")?.unwrap_or(0) + chunks;
            let done = range.end == row.get::<i32>("item_count")?.unwrap_or(-1);
            let status = if done {
                JobStatus::Done
            } else {
                JobStatus::parse(&row.get::<String>("status")?.unwrap_or_default())?
            };
            let started = row.get::<TimestampWithTimeZone>("started_at")?;
            let previous = row.get::<TimestampWithTimeZone>("last_commit_at")?;
            let worked = row.get::<f64>("seconds_at_work")?.unwrap_or(0.0)
                + seconds_since(since, previous, clock_timestamp());
            let chunk_seconds = row.get::<f64>("chunk_seconds")?.unwrap_or(0.0) + seconds;
            let set = vec![
                ("next_index", range.end.into_datum()),
                ("chunks_committed", chunks.into_datum()),
                (
                    "seal",
                    seal::checkpoint(job_id, range.end, chunks).into_datum(),
                ),
                ("started_at", started.map_or(Some(now), |s| s.into_datum())),
                ("last_commit_at", Some(now)),
                ("status", status.as_str().into_datum()),
                ("finished_at", done.then_some(now)),
                ("seconds_at_work", worked.into_datum()),
                ("chunk_seconds", chunk_seconds.into_datum()),
                ("chunks_per_transaction", in_transaction.into_datum()),
            ];
            Ok((set, status))
        })
    })?
    .ok_or_else(|| BatchError::UnknownJob {
        job: job_id.to_string(),
    })
}

/// Seconds from `since`, or from `previous` (the job's commit before) if that is later, to
/// `now`: a drainer's time at work on a chunk, not counting time another drainer's chunk
/// already counted.
pub fn seconds_since(
    since: TimestampWithTimeZone,
    previous: Option<TimestampWithTimeZone>,
    now: TimestampWithTimeZone,
) -> f64 {
    let micros = |t: TimestampWithTimeZone| pg_sys::TimestampTz::from(t);
    let from = previous.map_or(micros(since), |p| micros(p).max(micros(since)));
    ((micros(now) - from).max(0)) as f64 / 1e6
}
