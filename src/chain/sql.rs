//! Every statement the chain functions send, in one place.
//!
//! They run as the extension's owner, under whatever search_path the caller has, so
//! each names its schema, and each operator is spelled OPERATOR(pg_catalog.x): a role
//! that creates a look-alike table, function or operator earlier on the search_path
//! changes nothing here.

/// The batch a step belongs to.
pub const STEP_BATCH: &str = "\
SELECT b.batch FROM etc_batch.batch_log b WHERE b.id OPERATOR(pg_catalog.=) $1";

/// The backend holding a step's row lock: the row's xmax is the locker's transaction.
/// No row means the step is gone; a NULL pid means the holder finished meanwhile.
pub const STEP_HOLDER: &str = "\
SELECT (SELECT l.pid FROM pg_catalog.pg_locks l
         WHERE l.locktype OPERATOR(pg_catalog.=) 'transactionid'
           AND l.granted
           AND l.transactionid OPERATOR(pg_catalog.=) b.xmax
         LIMIT 1)
  FROM etc_batch.batch_log b
 WHERE b.id OPERATOR(pg_catalog.=) $1";

/// The next step of the step's batch, if any: a subquery of the statements below, where
/// `batch_log` is the step's row. The step after it by id is looked up first, in the
/// primary key, whose integer keys cost little to compare: it belongs to the same batch
/// unless batches interleave, and only then is the batch's own index read.
macro_rules! next_step {
    () => {
        "(SELECT CASE WHEN n.batch OPERATOR(pg_catalog.=) batch_log.batch THEN n.id
             ELSE (SELECT m.id FROM etc_batch.batch_log m
                    WHERE m.batch OPERATOR(pg_catalog.=) batch_log.batch
                      AND m.id OPERATOR(pg_catalog.>) batch_log.id
                    ORDER BY m.id LIMIT 1) END
          FROM etc_batch.batch_log n
         WHERE n.id OPERATOR(pg_catalog.>) batch_log.id
         ORDER BY n.id LIMIT 1)"
    };
}

/// Records a failed attempt that will be tried again: the step stays pending. Returns
/// what the audit row needs. $1 id, $2 started, $3 finished, $4 message, $5 SQLSTATE.
pub const MARK_RETRIED: &str = "\
UPDATE etc_batch.batch_log
   SET attempts = attempts OPERATOR(pg_catalog.+) 1,
       started_at = $2, finished_at = $3, last_error = $4, last_sqlstate = $5
 WHERE id OPERATOR(pg_catalog.=) $1
RETURNING batch, attempts, added_by::pg_catalog.oid";

/// The steps of a batch that commit, and their commands: for the check that a chain
/// never runs itself again. $1 batch.
pub const COMMITTING_STEPS: &str = "\
SELECT b.id, b.command FROM etc_batch.batch_log b
 WHERE b.batch OPERATOR(pg_catalog.=) $1 AND b.commits
 ORDER BY b.id";

/// Marks the step failed with the error; its audit row follows. Returns what the audit
/// row needs. $1 id, $2 started, $3 finished, $4 message, $5 SQLSTATE.
pub const MARK_FAILED: &str = "\
UPDATE etc_batch.batch_log
   SET status = 'failed', attempts = attempts OPERATOR(pg_catalog.+) 1,
       started_at = $2, finished_at = $3, last_error = $4, last_sqlstate = $5
 WHERE id OPERATOR(pg_catalog.=) $1
RETURNING batch, attempts, added_by::pg_catalog.oid";

/// A step found done, for the audit row of the skip, and the next step of the batch.
/// $1 id.
pub const STEP_SKIPPED: &str = concat!(
    "SELECT batch, attempts, added_by::pg_catalog.oid, ",
    next_step!(),
    "
  FROM etc_batch.batch_log
 WHERE id OPERATOR(pg_catalog.=) $1"
);

/// The next step of batch $1 after step $2.
pub const NEXT_IN_BATCH: &str = "\
SELECT b.id FROM etc_batch.batch_log b
 WHERE b.batch OPERATOR(pg_catalog.=) $1 AND b.id OPERATOR(pg_catalog.>) $2
 ORDER BY b.id LIMIT 1";

/// The sequence behind step_audit's audit_id.
pub const STEP_AUDIT_SEQUENCE: &str = "\
SELECT pg_catalog.pg_get_serial_sequence('etc_batch.step_audit', 'audit_id')::pg_catalog.regclass::pg_catalog.oid";

/// Serializes add_step calls that let etc_batch choose the id, so that two of them
/// never pick the same one. Transaction-scoped, like every lock etc_batch takes.
pub const LOCK_STEP_IDS: &str = "\
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('etc_batch.batch_log.id'))";

pub const NEXT_FREE_ID: &str = "\
SELECT pg_catalog.max(b.id) FROM etc_batch.batch_log b";

/// $1 id, $2 batch, $3 command, $4 the adding role. The step keeps the adding session's
/// search_path, to run with.
pub const INSERT_STEP: &str = "\
INSERT INTO etc_batch.batch_log (id, batch, command, added_by, search_path, paused_at, paused_by,
                                 commits, timeout, max_attempts)
SELECT $1, $2, $3, $4, pg_catalog.current_setting('search_path'), p.paused_at, p.paused_by,
       $5, $6, $7
  FROM (SELECT) n
  -- a step added to a paused batch is paused with it
  LEFT JOIN LATERAL (SELECT b.paused_at, b.paused_by FROM etc_batch.batch_log b
                      WHERE b.batch OPERATOR(pg_catalog.=) $2 AND b.paused_at IS NOT NULL
                      LIMIT 1) p ON true
RETURNING id";

pub const RESET_BATCH: &str = "\
WITH r AS (
  UPDATE etc_batch.batch_log
     SET status = 'pending', attempts = 0, started_at = NULL, finished_at = NULL,
         last_error = NULL, last_sqlstate = NULL
   WHERE batch OPERATOR(pg_catalog.=) $1
  RETURNING 1)
SELECT pg_catalog.count(*)::pg_catalog.int4 FROM r";

pub const RETRY_STEP: &str = "\
UPDATE etc_batch.batch_log SET status = 'pending'
 WHERE id OPERATOR(pg_catalog.=) $1 AND status OPERATOR(pg_catalog.=) 'failed'
RETURNING id";

pub const STEP_STATUS: &str = "\
SELECT b.status FROM etc_batch.batch_log b WHERE b.id OPERATOR(pg_catalog.=) $1";

/// Whether anything in the database can defer a check to COMMIT.
pub const ANY_DEFERRABLE: &str = "\
SELECT EXISTS (SELECT FROM pg_catalog.pg_constraint c WHERE c.condeferrable)
    OR EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgdeferrable)";
