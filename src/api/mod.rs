//! The SQL surface of etc_batch. Each function here only translates between SQL and the
//! modules that do the work; its SQL declaration and comment live in sql/*.sql or in
//! the `#[pg_extern]` attributes below.

pub mod chain;
pub mod job;
pub mod lease;
