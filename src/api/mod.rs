//! The SQL surface of etc_batch. Each function here only translates between SQL and the
//! modules that do the work. Functions are declared by their `#[pg_extern]` attributes,
//! with comments and privileges in sql/api.sql; the two procedures that commit are
//! declared in sql/procedures.sql, and their library side here with `c_procedure!`.

pub mod chain;
pub mod job;
pub mod launch;
pub mod lease;
pub mod types;

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::procedure::Results;
    use pgrx::prelude::*;

    /// drain_job's results are placed by name: its result struct has exactly the INOUT
    /// arguments sql/procedures.sql declares.
    #[pg_test]
    fn drain_job_returns_what_it_declares() {
        let declared = Spi::get_one::<Vec<String>>(
            "SELECT array_agg(n ORDER BY i) FROM pg_proc p,
                    unnest(p.proargnames, p.proargmodes) WITH ORDINALITY AS a(n, m, i)
              WHERE p.oid = 'etc_batch.drain_job'::regproc AND m = 'b'",
        )
        .unwrap()
        .unwrap();
        let returned: Vec<String> = super::job::DrainResult {
            committed_chunks: 0,
            committed_items: 0,
            first_key: None,
            last_key: None,
            status: "pending",
        }
        .named()
        .into_iter()
        .map(|(name, _)| name.to_string())
        .collect();
        assert_eq!(declared, returned);
    }
}
