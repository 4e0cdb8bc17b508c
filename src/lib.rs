//! etc_batch: exactly-once batch work inside PostgreSQL.
//!
//! Layout:
//! - `api/`      the SQL surface: every function and procedure a DBA calls.
//! - `chain/`    the chain runner behind `exec_batch_from_id` (rules in `chain::step`,
//!               the commit loop in `chain::runner`, bookkeeping SQL in `chain::sql`).
//! - `job/`      checkpointed jobs behind `drain_job` (approval, progress, drain, reports).
//! - `txn`       the one place that talks to SPI in non-atomic mode and commits.
//! - `roles`     running a piece of work as another role, scoped to one transaction.
//! - `error`     the one error type, mapped to SQLSTATEs.
//! - `sql/*.sql` the schema, loaded into the extension script as checked-in SQL.

use pgrx::prelude::*;

pub mod activity;
pub mod api;
pub mod chain;
pub mod clock;
pub mod error;
pub mod job;
pub mod lease;
pub mod query;
pub mod roles;
pub mod txn;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!("../sql/jobs.sql", name = "jobs", requires = ["schema"]);
extension_sql_file!("../sql/leases.sql", name = "leases", requires = ["schema"]);
extension_sql_file!(
    "../sql/doctor.sql",
    name = "doctor",
    requires = ["jobs", "leases"]
);
extension_sql_file!(
    "../sql/progress.sql",
    name = "progress",
    requires = ["jobs"]
);
extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    job::crash::register();
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    // In-transaction tests live next to the code they test; see `api::chain::tests`.
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
