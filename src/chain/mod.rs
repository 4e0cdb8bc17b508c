//! Chains: ordered ETL steps run by `CALL etc_batch.exec_batch_from_id(id)`.
//!
//! - `step`    the rules: what a runner does with a step in each status (pure Rust).
//! - `command` checks a step's SQL when it is added.
//! - `steps`   add_step, reset_batch, retry_step.
//! - `runs`    chain definitions and their runs: define_chain, run_chain, abandon_run.
//! - `runner`  the commit loop: lock, re-check, run, record, COMMIT, next.
//! - `audit`   a step's audit row.
//! - `timer`   a step's timeout, on PostgreSQL's statement timer.
//! - `step_lock` the session lock that keeps a step that commits to one runner.
//! - `running` the check that a chain never runs itself again.
//! - `sql`     every statement the runner and the chain functions send, in one place.

pub mod audit;
pub mod command;
pub mod runner;
pub mod running;
pub mod runs;
pub mod sql;
pub mod step;
pub mod step_lock;
pub mod steps;
pub mod timer;
