//! Running a job: the chunks a drainer takes, each changed, audited and checkpointed in
//! a transaction of its own.
//!
//! - `drain`      the commit loop: lock, check the status after the lock, verify, change,
//!   audit, checkpoint, COMMIT.
//! - `drainer`    one job's statements and roles, built once per call, and its change.
//! - `ending`     how a drain ends, and what each round of its loop comes to.
//! - `pace_wait`  the wait before a chunk, until the pace lets it go.
//! - `group`      chunks committed together, as many as fit the job's transaction_time.
//! - `retry`      a chunk that failed with a transient error, tried again.
//! - `mismatch`   a chunk that changed fewer rows than it has items, explained.
//! - `notices`    what a drain tells its caller.
//! - `chunk`      a chunk a drainer holds, and what opening one may come to instead.
//! - `order`      how a job's chunks are taken, chosen once: in order, or claimed.
//! - `checkpoint` a sequential job's chunks: its row locked and checked, the checkpoint moved.
//! - `claim`      a parallel job's chunks, each claimed by one of many drainers.
//! - `seal`       the seals written with every record of progress.
//! - `audit`      a chunk's audit rows, written into the job's partition.
//! - `abort`      abort_job.
//! - `crash`      the crash_at test aid, in test builds only.

pub mod abort;
pub(crate) mod audit;
pub(crate) mod checkpoint;
pub mod chunk;
pub(crate) mod claim;
pub mod crash;
pub mod drain;
mod drainer;
pub mod ending;
mod group;
mod mismatch;
mod notices;
pub(crate) mod order;
mod pace_wait;
mod retry;
pub(crate) mod seal;
