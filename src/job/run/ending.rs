//! How a drain ends, and what each round of its loop comes to: the values the loop
//! (drain.rs) and the drainer's parts beside it (drainer.rs, mismatch.rs, pace_wait.rs,
//! notices.rs) pass between them, kept apart so that each part depends on them and none
//! on the loop.

use crate::error::BatchError;
use crate::pauses::Paused;
use crate::status::JobStatus;
use crate::txn::Failure;
use std::ops::Range;

/// What one CALL did, in numbers that do not grow with the job: the chunks and items it
/// committed, the first and last key of them, and how it ended. The keys themselves are
/// in the audit.
#[derive(Debug)]
pub struct Drained {
    pub chunks: i32,
    pub items: i64,
    /// Of them, the items skipped because their rows had drifted (on_drift 'skip').
    pub skipped: i64,
    pub first_key: Option<String>,
    pub last_key: Option<String>,
    pub ended: Ended,
}

/// How a drain ended, as drain_job's status says it (`as_str`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// With the job's status after it: done; pending when it stopped at max_chunks, or
    /// found every chunk left held by other drainers; as the job's row says when
    /// max_chunks 0 kept it from looking.
    Job(JobStatus),
    /// The job is paused (pause_job, a critical signal of its pace), or the drain's halt
    /// stopped it. The job is pending.
    Paused,
    /// The job's windows closed, and the call returned (AtWindowClose::Return), with
    /// the job's status then: pending, or done when other drainers of a parallel job
    /// committed its last chunks meanwhile.
    OutsideWindows(JobStatus),
}

impl Ended {
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Job(status) => status.as_str(),
            Ended::Paused => "paused",
            Ended::OutsideWindows(_) => "outside_windows",
        }
    }

    /// The job's status after the drain.
    pub fn job_status(self) -> JobStatus {
        match self {
            Ended::Job(status) | Ended::OutsideWindows(status) => status,
            Ended::Paused => JobStatus::Pending,
        }
    }
}

/// What a drain does when its job's windows close: a CALL returns, status
/// outside_windows; a launched worker waits, holding nothing, until one opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtWindowClose {
    Return,
    Wait,
}

impl Round {
    /// Whether the round leaves its transaction to be committed as it is: a chunk done,
    /// or nothing to do (the job done, every chunk held by others, a pause). A group of
    /// chunks before it commits with it; any other round rolls the group back (group.rs).
    pub(super) fn keeps_the_transaction(&self) -> bool {
        matches!(
            self,
            Round::Committed(_) | Round::Finished | Round::AllHeld | Round::Paused(_)
        )
    }

    /// Whether an error was raised and caught in the round: its transaction is broken,
    /// and only a rollback may follow.
    pub(super) fn broke_the_transaction(&self) -> bool {
        matches!(self, Round::Transient { .. } | Round::Failed { .. })
    }
}

/// A chunk done in the open transaction: what its caller is told once it commits.
pub(super) struct Committed {
    pub number: i32,
    pub total: i32,
    pub items: i64,
    /// Of those, the items left unchanged for their rows had drifted (on_drift skip).
    pub skipped: usize,
    pub first_key: String,
    pub last_key: String,
    /// The job is done with it.
    pub last: bool,
}

/// What one round of the loop came to, for the loop to end its transaction.
pub(super) enum Round {
    /// A chunk's change, audit rows and mark are written: commit (with the chunks before
    /// it in its transaction, group.rs), then tell the caller.
    Committed(Committed),
    /// Nothing left to do: the job is done. Commit (what the round wrote says so).
    Finished,
    /// Every chunk of a parallel job not yet committed is held by other drainers: this
    /// one is not needed, and does not wait. Commit.
    AllHeld,
    /// The job is paused: commit, and the call stops here.
    Paused(Paused),
    /// Fewer rows matched than the chunk has items: roll back, then see why
    /// (`after_mismatch`) in the next transaction.
    Mismatch {
        range: Range<i32>,
        /// The first item that did not match, where it is already known (a handler that
        /// returned NULL).
        known: Option<i32>,
    },
    /// The chunk's change failed with a transient error (retries.rs); its transaction is
    /// broken: roll it back, record the retry, wait, and try again.
    Transient { number: i32, failure: Failure },
    /// The job is stopped: commit what the round recorded of it (conflict, corrupt), then
    /// raise the error.
    Stopped(BatchError),
    /// The chunk's change failed for another reason (a constraint, a trigger, a
    /// permission, a timeout); its transaction is broken: roll it back, record the
    /// failure where the job's views show it, and raise the error, the job still pending.
    Failed { number: i32, failure: Failure },
}
