//! A chunk whose change failed with a transient error (retries.rs), tried again.

use super::drainer::Drainer;
use crate::error::Result;
use crate::job::sql;
use crate::query;
use crate::txn::{Failure, Transactions};
use pgrx::prelude::*;
use pgrx::spi::quote_literal;

impl Drainer {
    /// After attempt `attempt` of chunk `number` failed with a transient error and was
    /// rolled back: the retry recorded (job_retry, and a NOTICE) and committed, then the
    /// backoff slept, holding nothing; or, when the attempts are used up, the error
    /// raised, the job still pending.
    pub(super) fn retry(
        &self,
        tx: &mut impl Transactions,
        number: i32,
        failure: Failure,
        attempt: i32,
    ) -> Result<()> {
        let attempts = crate::retries::attempts();
        let sqlstate = failure.sqlstate();
        if attempt >= attempts {
            tx.item(|_| self.record_failure(number, &failure))?;
            tx.commit();
            let detail = format!(
                "Chunk {number} of job \"{}\" was rolled back after {attempt} attempt{} (etc_batch.transient_attempts); the job is still pending.",
                self.id(),
                if attempt == 1 { "" } else { "s" }
            );
            let hint = format!(
                "Call etc_batch.drain_job({}) again when the contention is over, or raise etc_batch.transient_attempts or etc_batch.chunk_lock_timeout.",
                quote_literal(self.id())
            );
            failure.raise(detail, hint);
        }
        let backoff = crate::retries::backoff(attempt);
        tx.item(|_| {
            self.owner(|| {
                query::run(
                    sql::RECORD_RETRY,
                    &[
                        self.id().into(),
                        number.into(),
                        attempt.into(),
                        sqlstate.as_str().into(),
                        failure.message.as_str().into(),
                    ],
                )
            })
        })?;
        tx.commit();
        notice!(
            "chunk {number} of job \"{}\" was rolled back: {sqlstate} {}; attempt {attempt} of {attempts}, trying again in {} ms",
            self.id(),
            failure.message,
            backoff.as_millis()
        );
        self.activity.report(&format!(
            "job \"{}\": chunk {number} rolled back ({sqlstate}), trying again in {} ms",
            self.id(),
            backoff.as_millis()
        ));
        crate::txn::sleep(backoff);
        Ok(())
    }
}
