//! A chunk a drainer holds, in the one transaction that will commit it, whichever way
//! the job's chunks are taken (order.rs): in order, the next one after the checkpoint
//! (checkpoint.rs), or in any order, each claimed by one of many drainers (claim.rs);
//! and what opening one may come to instead.

use crate::error::Result;
use crate::halt::Halt;
use crate::job::distributed::Distributed;
use crate::job::rules::progress::Progress;
use crate::own_rows::Tid;
use crate::pauses::{self, Paused};
use crate::query::Opaque;
use crate::status::JobStatus;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use std::ops::Range;

/// What holds a drainer back before its next chunk: the job's pause, or what its caller
/// halts it for (a launch's worker: the launch no longer running).
pub fn held_back(job_id: &str, halt: &dyn Halt) -> Result<Option<Paused>> {
    match pauses::of_job(job_id)? {
        Some(paused) => Ok(Some(paused)),
        None => halt.halted(),
    }
}

/// A chunk this drainer holds: checked before it was handed out (see `Opening`), its
/// change still to be made.
pub struct OpenChunk {
    /// 1-based, and how many chunks the job has.
    pub number: i32,
    pub total: i32,
    /// Its positions in the frozen list.
    pub range: Range<i32>,
    /// The keys of its first and last item.
    pub first_key: String,
    pub last_key: String,
    /// Its items, bound to its change.
    pub items: ItemArrays,
    pub mark: Mark,
}

/// A chunk's approved items as its row of the frozen list holds them (sql/jobs.sql,
/// job_item_chunk), with the keys of its first and last item read from them.
pub struct ChunkItems {
    pub first_key: String,
    pub last_key: String,
    pub arrays: ItemArrays,
}

/// The arrays of a chunk's row, as they are, for its change to unfold (change/set_values.rs,
/// chunk_sql): the planner then knows how many items the chunk has.
pub struct ItemArrays {
    pub keys: Opaque,
    pub revisions: Opaque,
    /// NULL when none of the chunk's items has guards.
    pub guards: Option<Opaque>,
}

impl ItemArrays {
    /// The arrays as the change's last three parameters: text[], bigint[], text[].
    pub fn args(&self) -> [DatumWithOid<'static>; 3] {
        [
            self.keys.arg(),
            self.revisions.arg(),
            match &self.guards {
                Some(guards) => guards.arg(),
                None => DatumWithOid::null_oid(pg_sys::TEXTARRAYOID),
            },
        ]
    }

    /// The distinct values of the distribution column of `d` among the items, as text[]
    /// (NULL when their keys cannot be read so), bound after the arrays.
    pub fn distribution_values(
        &self,
        d: &Distributed,
        key_columns: usize,
    ) -> DatumWithOid<'static> {
        // SAFETY: a flat copy of the row's text[] column, alive in the current context
        let keys =
            unsafe { <pgrx::Array<&str> as pgrx::FromDatum>::from_datum(self.keys.datum(), false) };
        let values =
            keys.and_then(|keys| d.values(keys.iter().map(Option::unwrap_or_default), key_columns));
        match values {
            Some(values) => values.into(),
            None => DatumWithOid::null_oid(pg_sys::TEXTARRAYOID),
        }
    }
}

/// What records a chunk as committed, besides its audit rows.
#[derive(Clone, Copy)]
pub enum Mark {
    /// The sequential job's checkpoint, moved past the chunk, in the job's row, locked
    /// where this lies.
    Checkpoint(Tid),
    /// The parallel job's row for the chunk, claimed where this lies.
    Claim(Tid),
}

impl OpenChunk {
    /// The chunk that begins at `progress.next_index`, with its keys.
    pub fn checkpoint(progress: Progress, items: ChunkItems, at: Tid) -> Option<OpenChunk> {
        Self::new(progress, items, Mark::Checkpoint(at))
    }

    /// The chunk a parallel job's drainer claimed at `at`.
    pub fn claimed(progress: Progress, items: ChunkItems, at: Tid) -> Option<OpenChunk> {
        Self::new(progress, items, Mark::Claim(at))
    }

    fn new(progress: Progress, items: ChunkItems, mark: Mark) -> Option<OpenChunk> {
        let range = progress.next_chunk()?;
        let (number, total) = progress.chunk_number();
        Some(OpenChunk {
            number,
            total,
            range,
            first_key: items.first_key,
            last_key: items.last_key,
            items: items.arrays,
            mark,
        })
    }
}

/// What looking for the next chunk came to.
pub enum Opening {
    /// A chunk to change.
    Open(OpenChunk),
    /// The job is done.
    Done,
    /// Every chunk of a parallel job is committed; its row does not say it is done yet.
    AllCommitted,
    /// Every chunk of a parallel job not yet committed is held by another drainer.
    AllHeld,
    Paused(Paused),
    /// The job is stopped for good: in conflict, corrupt or aborted.
    Stopped(JobStatus),
    /// Why the job's progress cannot be trusted: it becomes corrupt.
    Untrusted(String),
}

/// After a chunk was rolled back because fewer rows matched than it has items, seen
/// again in the next transaction, under the job's lock.
pub enum Recheck {
    /// Nothing moved meanwhile: what stopped the chunk is to be recorded.
    Record,
    /// Another drainer committed the chunk, or finished the job: go on.
    Again,
    /// Another drainer stopped the job, whose record stands.
    Stopped(JobStatus),
}
