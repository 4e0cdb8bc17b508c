//! Chains: ordered ETL steps run by `CALL etc_batch.exec_batch_from_id(id)`.
//!
//! - `step`    the rules: what a runner does with a step in each status (pure Rust).
//! - `command` checks a step's SQL when it is added.
//! - `sql`     every statement the runner and the chain functions send, in one place.
//! - `runner`  the commit loop: lock, re-check, run, record, COMMIT, next.

pub mod command;
pub mod runner;
pub mod sql;
pub mod step;
