//! Checkpointed jobs: a frozen, approved list of items, changed chunk by chunk by
//! `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! - `rules`      what needs no database: columns, key, guard, approval, progress,
//!   conflict, window (plain Rust, reached by unit tests alone).
//! - `target`     the business table: its columns from the catalog, the statements built for it.
//! - `change`     the kinds of change, one module each: what registration checks, the
//!   statement a chunk runs, how the change is reverted.
//! - `definition` a registered job, as drain and the reports read it.
//! - `distributed` targets Citus distributes: items frozen by shard, chunks sent to theirs.
//! - `lifecycle`  the checks every routine acting on a job makes: may this role act on
//!   it, its drainers held and its status locked, the refusal by status.
//! - `register`   register_job and register_job_from_query: checked, frozen, partitioned.
//! - `from_jobs`  jobs made from other jobs: register_remainder, register_revert.
//! - `run`        the commit loop and the chunks it takes, in order or claimed.
//! - `pace`       pace_job: rows per second, the signals, and the waits before a chunk.
//! - `report`     job_report, job_summary, verify_job.
//! - `sql`        the fixed statements.

pub(crate) mod change;
pub mod definition;
pub mod distributed;
pub mod from_jobs;
pub(crate) mod lifecycle;
pub mod pace;
pub mod register;
pub mod report;
pub mod rules;
pub mod run;
pub mod sql;
pub mod target;

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
