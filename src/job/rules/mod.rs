//! The rules of a job that need no database: plain Rust, reached by unit tests alone.
//!
//! - `columns`    the target's columns: what each accepts, the roles they play.
//! - `shape`      the target's columns and the roles the job gives them.
//! - `key`        how an item names its row: the job's key, and a key's value.
//! - `guard`      how a row is recognised as unchanged since it was approved: the guard.
//! - `approval`   parsing, checking and normalizing the approved list.
//! - `progress`   what a checkpoint promises and the arithmetic of chunks.
//! - `conflict`   saying what a conflict is.
//! - `window`     the hours a job may run.

pub mod approval;
pub mod columns;
pub mod conflict;
pub mod guard;
pub mod key;
pub mod progress;
pub mod shape;
pub mod window;
