//! The SQL surface of etc_batch. Each function here only translates between SQL and the
//! modules that do the work. Functions are declared by their `#[pg_extern]` attributes,
//! with comments and privileges in sql/api.sql; the two procedures that commit are
//! declared in sql/procedures.sql and described here by their `Signature`.

pub mod chain;
pub mod job;
pub mod lease;

use crate::procedure::Signature;

/// Every procedure etc_batch declares, for the test that compares each with the catalog.
pub const PROCEDURES: &[&Signature] = &[&chain::EXEC_BATCH_FROM_ID, &job::DRAIN_JOB];

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// What sql/procedures.sql declares is what the library reads: the same arguments,
    /// in the same order, with the same types, modes and defaults.
    #[pg_test]
    fn every_procedure_is_declared_as_the_library_reads_it() {
        for signature in super::PROCEDURES {
            let declared = Spi::get_one_with_args::<String>(
                "SELECT pg_catalog.pg_get_function_arguments(p.oid) FROM pg_catalog.pg_proc p
                  WHERE p.oid = pg_catalog.to_regproc($1) AND p.prokind = 'p'",
                &[signature.name.into()],
            )
            .unwrap();
            assert_eq!(
                declared.as_deref(),
                Some(signature.arguments().as_str()),
                "{}",
                signature.name
            );
        }
        let procedures = Spi::get_one::<i64>(
            "SELECT count(*) FROM pg_catalog.pg_proc
              WHERE pronamespace = 'etc_batch'::regnamespace AND prokind = 'p'",
        )
        .unwrap();
        assert_eq!(procedures, Some(super::PROCEDURES.len() as i64));
    }
}
