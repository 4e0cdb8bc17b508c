//! Jobs made from other jobs: each reads what a job committed or left, against the rows
//! as they are now, and registers a new job of what may still be approved.
//!
//! - `against_rows` a job's items read against their rows now, a batch at a time, and
//!   the items left out recorded with their reason.
//! - `remainder`    register_remainder: what a job did not change, approved again.
//! - `revert`       register_revert and revert_preview: what a job committed, set back.

pub(crate) mod against_rows;
pub mod remainder;
pub mod revert;
