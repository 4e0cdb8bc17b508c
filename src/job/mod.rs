//! Checkpointed jobs: a frozen, approved list of items, changed chunk by chunk by
//! `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! - `columns`    the target's columns: what each accepts, the roles they play (pure Rust).
//! - `shape`      the target's columns and the roles the job gives them (pure Rust).
//! - `key`        how an item names its row: the job's key, and a key's value.
//! - `guard`      how a row is recognised as unchanged since it was approved: the guard.
//! - `approval`   parsing, checking and normalizing the approved list (pure Rust).
//! - `progress`   what a checkpoint promises and the arithmetic of chunks (pure Rust).
//! - `conflict`   saying what a conflict is (pure Rust).
//! - `target`     the business table: its columns from the catalog, the statements built for it.
//! - `register`   register_job and register_job_from_query.
//! - `items_query` the SELECT register_job_from_query reads the items from.
//! - `freeze`     the frozen list written and read back a batch at a time, fingerprinted.
//! - `ordered`    approvals PostgreSQL puts in order (keys of several columns or of
//!   any type, digests of rows).
//! - `tables`     the job's own partitions of job_item and job_audit.
//! - `definition` a registered job, as drain and the reports read it.
//! - `drain`      the commit loop: lock, verify, change, audit, checkpoint, COMMIT.
//! - `chunk`      a chunk a drainer holds, and what opening one may come to instead.
//! - `order`      how a job's chunks are taken, chosen once: in order, or claimed.
//! - `checkpoint` a sequential job's chunks: its row locked and checked, the checkpoint moved.
//! - `claim`      a parallel job's chunks, each claimed by one of many drainers.
//! - `seal`       the seals written with every record of progress.
//! - `audit`      a chunk's audit rows, written into the job's partition.
//! - `against_rows` a job's items read against their rows now, a batch at a time.
//! - `remainder`  register_remainder: what a job did not change, approved again.
//! - `revert`     register_revert and revert_preview: what a job committed, set back.
//! - `report`     job_report, job_summary, verify_job.
//! - `abort`      abort_job.
//! - `pace`       pace_job: rows per second, the signals, and the waits before a chunk.
//! - `signals`    what the system says: archive backlog, a VACUUM, the DBA's queries.
//! - `window`     the hours a job may run (pure Rust).
//! - `crash`      the crash_at test aid, in test builds only.
//! - `sql`        the fixed statements.

pub mod abort;
pub mod against_rows;
pub mod approval;
pub mod audit;
pub mod checkpoint;
pub mod chunk;
pub mod claim;
pub mod columns;
pub mod conflict;
pub mod crash;
pub mod definition;
pub mod drain;
pub mod freeze;
pub mod guard;
pub mod items_query;
pub mod key;
pub mod order;
pub mod ordered;
pub mod pace;
pub mod progress;
pub mod register;
pub mod remainder;
pub mod report;
pub mod revert;
pub mod seal;
pub mod shape;
pub mod signals;
pub mod sql;
pub mod tables;
pub mod target;
pub mod window;

/// register_remainder and register_revert read what a job committed after its drainers'
/// chunks in flight have committed (they wait for them): a snapshot taken before, as a
/// REPEATABLE READ or SERIALIZABLE transaction keeps, would not see those chunks.
pub fn require_read_committed(what: &str) -> crate::error::Result<()> {
    // SAFETY: reads the backend's isolation level, a plain global
    let repeatable =
        unsafe { pgrx::pg_sys::XactIsoLevel } >= pgrx::pg_sys::XACT_REPEATABLE_READ as i32;
    if repeatable {
        return Err(crate::error::BatchError::Unsupported {
            message: format!("{what} cannot run in a REPEATABLE READ or SERIALIZABLE transaction"),
            detail: "It reads what a job committed once the job's chunks in flight have committed, which the snapshot of such a transaction, taken before, does not see. Call it in a READ COMMITTED transaction.".into(),
        });
    }
    Ok(())
}
