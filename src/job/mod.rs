//! Checkpointed jobs: a frozen, approved list of items, changed chunk by chunk by
//! `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! - `columns`    the target's columns: what each accepts, the roles they play (pure Rust).
//! - `approval`   parsing, checking and normalizing the approved list (pure Rust).
//! - `progress`   what a checkpoint promises and the arithmetic of chunks (pure Rust).
//! - `conflict`   saying what a conflict is (pure Rust).
//! - `target`     the business table: its columns from the catalog, the statements built for it.
//! - `register`   register_job and register_job_from_query.
//! - `items_query` the SELECT register_job_from_query reads the items from.
//! - `freeze`     the frozen list written and read back a batch at a time, fingerprinted.
//! - `tables`     the job's own partitions of job_item and job_audit.
//! - `definition` a registered job, as drain and the reports read it.
//! - `drain`      the commit loop: lock, verify, change, audit, checkpoint, COMMIT.
//! - `checkpoint` the job's row in a chunk: locked and checked, the checkpoint moved.
//! - `claim`      a parallel job's chunks, each claimed by one of many drainers.
//! - `audit`      a chunk's audit rows, written into the job's partition.
//! - `report`     job_report, job_summary, verify_job.
//! - `abort`      abort_job.
//! - `pace`       pace_job: rows per second, replica lag, and the waits before a chunk.
//! - `crash`      the crash_at test aid, in test builds only.
//! - `sql`        the fixed statements.

pub mod abort;
pub mod approval;
pub mod audit;
pub mod checkpoint;
pub mod claim;
pub mod columns;
pub mod conflict;
pub mod crash;
pub mod definition;
pub mod drain;
pub mod freeze;
pub mod items_query;
pub mod pace;
pub mod progress;
pub mod register;
pub mod report;
pub mod sql;
pub mod tables;
pub mod target;
