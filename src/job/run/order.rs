//! How a job's chunks are taken: its `Order`, chosen once from its approval. The drain
//! loop asks it to open a chunk, to close one, and what to do after one was rolled back,
//! and never asks which way it is.

use crate::error::Result;
use crate::halt::Halt;
use crate::job::definition::Definition;
use crate::job::rules::progress::{chunk_count, Progress};
use crate::job::run::checkpoint::{self, Unwritten};
use crate::job::run::chunk::{Mark, OpenChunk, Opening, Recheck};
use crate::job::run::claim::{self, Cursor};
use crate::status::JobStatus;
use pgrx::datum::TimestampWithTimeZone;
use std::ops::Range;

/// How a job's chunks are taken.
pub enum Order {
    /// One after the other, from the checkpoint; with the checkpoint moved past the
    /// chunks of the open transaction and not yet written, when they share it.
    InOrder(Option<Unwritten>),
    /// In any order, each claimed by one of many drainers; where this drainer looks.
    Parallel(Cursor),
}

impl Order {
    pub fn of(def: &Definition) -> Order {
        if def.parallel {
            Order::Parallel(Cursor::new())
        } else {
            Order::InOrder(None)
        }
    }

    /// The next chunk, locked (or claimed) and checked, in the current transaction, unless
    /// the job's pause or `halt` holds it back. Run as the owner.
    pub fn open(&mut self, def: &Definition, halt: &dyn Halt) -> Result<Opening> {
        match self {
            Order::InOrder(None) => checkpoint::open(&def.job_id, &def.tables, halt),
            Order::InOrder(Some(held)) => {
                checkpoint::open_next(&def.job_id, &def.tables, held, halt)
            }
            Order::Parallel(cursor) => claim::open(
                &def.job_id,
                &def.tables,
                Progress {
                    next_index: 0,
                    item_count: def.item_count,
                    chunk_size: def.chunk_size,
                },
                cursor,
                halt,
            ),
        }
    }

    /// Records the chunk committed (the checkpoint moved past it, or its chunk row
    /// marked), once its audit rows are written, with `since`, when its drainer's work
    /// towards it began (job.seconds_at_work). When `shared`, the chunk shares its
    /// transaction with the chunks before and after it (group.rs): a sequential job's
    /// checkpoint is then written once, by `write`, before the COMMIT. Returns whether
    /// the job is done with it. Run as the owner.
    pub fn close(
        &mut self,
        def: &Definition,
        chunk: &OpenChunk,
        since: TimestampWithTimeZone,
        seconds: f64,
        shared: bool,
    ) -> Result<bool> {
        match (chunk.mark, self) {
            (Mark::Checkpoint(at), Order::InOrder(held)) => {
                if let Some(held) = held {
                    held.add(&chunk.range, seconds);
                    return Ok(held.done());
                }
                if shared {
                    let first = Unwritten::first(
                        at,
                        &chunk.range,
                        Progress {
                            next_index: chunk.range.start,
                            item_count: def.item_count,
                            chunk_size: def.chunk_size,
                        },
                        since,
                        seconds,
                    );
                    let done = first.done();
                    *held = Some(first);
                    return Ok(done);
                }
                let status = checkpoint::advance(
                    &def.job_id,
                    &def.tables,
                    at,
                    &chunk.range,
                    1,
                    since,
                    seconds,
                )?;
                Ok(status == JobStatus::Done)
            }
            // a parallel job is done once its row says so (`finish`), not with a chunk
            (Mark::Claim(at), _) => {
                claim::mark_committed(&def.job_id, &def.tables, chunk.number, at, since, seconds)
                    .map(|()| false)
            }
            (Mark::Checkpoint(_), Order::Parallel(_)) => Err(crate::error::BatchError::Internal(
                "a chunk of a sequential job was closed by a parallel job's drainer".into(),
            )),
        }
    }

    /// Before the COMMIT of chunks that shared their transaction: the checkpoint moved
    /// past them written, for a sequential job (a parallel job's chunk rows are marked
    /// one by one). Run as the owner.
    pub fn write(&mut self, def: &Definition) -> Result<()> {
        if let Order::InOrder(held) = self {
            if let Some(held) = held.take() {
                checkpoint::write(&def.job_id, &def.tables, held)?;
            }
        }
        Ok(())
    }

    /// After the chunk `range` was rolled back: whether to record what stopped it. Run as
    /// the owner.
    pub fn recheck(&self, def: &Definition, range: &Range<i32>) -> Result<Recheck> {
        match self {
            Order::InOrder(_) => checkpoint::recheck(&def.job_id, &def.tables, range),
            Order::Parallel(_) => {
                // the chunks in flight commit first, and none starts after
                claim::stop(&def.tables)?;
                claim::recheck(&def.job_id)
            }
        }
    }

    /// Before a stop of the job (conflict, corrupt) is recorded. Run as the owner.
    pub fn before_stop(&self, def: &Definition) -> Result<()> {
        match self {
            Order::InOrder(_) => Ok(()),
            Order::Parallel(_) => claim::stop(&def.tables),
        }
    }

    /// A parallel job whose chunks are all committed: its row says it is done, once the
    /// chunk rows and the audit agree; otherwise why its progress cannot be trusted. Run
    /// as the owner.
    pub fn finish(&self, def: &Definition) -> Result<Option<String>> {
        claim::finish(
            &def.job_id,
            &def.tables,
            chunk_count(def.item_count, def.chunk_size),
            def.item_count,
        )
    }

    /// Chunks that shared a transaction were rolled back with it (group.rs): a
    /// sequential job's checkpoint is where the job's row says, a parallel drainer
    /// looks again from the first chunk, since those it saw committed in that
    /// transaction are not.
    pub fn rolled_back(&mut self) {
        match self {
            Order::InOrder(held) => *held = None,
            Order::Parallel(cursor) => *cursor = Cursor::new(),
        }
    }

    /// Whether a drain that stopped at its max_chunks must look once more whether the
    /// job is complete: a parallel one may have committed its last chunk.
    pub fn looks_again_at_the_end(&self) -> bool {
        matches!(self, Order::Parallel(_))
    }
}
