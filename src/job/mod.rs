//! Checkpointed jobs: a frozen, approved list of items, changed chunk by chunk by
//! `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! - `approval`   parsing, checking and normalizing the approved list (pure Rust).
//! - `progress`   what a checkpoint promises and the arithmetic of chunks (pure Rust).
//! - `conflict`   saying what a conflict is (pure Rust).
//! - `target`     the business table: its columns and the statements built for it.
//! - `register`   register_job.
//! - `definition` a registered job, as drain and the reports read it.
//! - `drain`      the commit loop: lock, verify, change, audit, checkpoint, COMMIT.
//! - `report`     job_report, job_summary, verify_job, abort_job.
//! - `crash`      the test aid etc_batch.crash_at.
//! - `sql`        the fixed statements.

pub mod approval;
pub mod conflict;
pub mod crash;
pub mod definition;
pub mod drain;
pub mod progress;
pub mod register;
pub mod report;
pub mod sql;
pub mod target;
