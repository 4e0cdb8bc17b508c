//! Every statement the chain functions send, in one place.
//!
//! They run as the extension's owner, under whatever search_path the caller has, so
//! each names its schema, and each operator is spelled OPERATOR(pg_catalog.x): a role
//! that creates a look-alike table, function or operator earlier on the search_path
//! changes nothing here.

/// The batch a step belongs to.
pub const STEP_BATCH: &str = "\
SELECT b.batch FROM etc_batch.batch_log b WHERE b.id OPERATOR(pg_catalog.=) $1";

/// Takes the step's row lock and reads the step again: the row returned is the latest
/// committed version, even when another runner changed it while this one waited. A row
/// lock never blocks a plain SELECT. `$suffix` chooses between waiting and SKIP LOCKED.
macro_rules! lock_step {
    ($suffix:literal) => {
        concat!(
            "SELECT b.status, b.command, b.added_by::pg_catalog.oid, b.attempts,
       b.last_sqlstate, b.last_error,
       EXISTS (SELECT FROM pg_catalog.pg_roles r
               WHERE r.oid OPERATOR(pg_catalog.=) b.added_by::pg_catalog.oid),
       b.search_path
  FROM etc_batch.batch_log b
 WHERE b.id OPERATOR(pg_catalog.=) $1
   FOR UPDATE OF b",
            $suffix
        )
    };
}

/// Waits for a runner that holds the step.
pub const LOCK_STEP: &str = lock_step!("");

/// Returns no row at once when another runner holds the step.
pub const LOCK_STEP_NOWAIT: &str = lock_step!(" SKIP LOCKED");

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

/// Marks the step done and writes its audit row in one statement, so the step's own
/// writes, its done mark and its audit row are in the same transaction; returns the next
/// step of the batch, if any.
/// $1 id, $2 started, $3 finished, $4 caller, $5 lock requested, $6 lock acquired.
pub const MARK_DONE: &str = "\
WITH s AS (
  UPDATE etc_batch.batch_log
     SET status = 'done', attempts = attempts OPERATOR(pg_catalog.+) 1,
         started_at = $2, finished_at = $3
   WHERE id OPERATOR(pg_catalog.=) $1
  RETURNING id, batch, attempts, added_by),
a AS (
  INSERT INTO etc_batch.step_audit
    (step_id, batch, attempt, pid, run_by, ran_as, lock_requested_at, lock_acquired_at,
     status_seen, outcome, started_at, finished_at, txid)
  SELECT s.id, s.batch, s.attempts, pg_catalog.pg_backend_pid(), $4, s.added_by, $5, $6,
         'pending', 'done', $2, $3, pg_catalog.txid_current()
    FROM s)
SELECT (SELECT b.id FROM etc_batch.batch_log b
         WHERE b.batch OPERATOR(pg_catalog.=) s.batch AND b.id OPERATOR(pg_catalog.>) s.id
         ORDER BY b.id LIMIT 1)
  FROM s";

/// Marks the step failed with the error and writes its audit row.
/// $1..$6 as MARK_DONE, $7 message, $8 SQLSTATE.
pub const MARK_FAILED: &str = "\
WITH s AS (
  UPDATE etc_batch.batch_log
     SET status = 'failed', attempts = attempts OPERATOR(pg_catalog.+) 1,
         started_at = $2, finished_at = $3, last_error = $7, last_sqlstate = $8
   WHERE id OPERATOR(pg_catalog.=) $1
  RETURNING id, batch, attempts, added_by)
INSERT INTO etc_batch.step_audit
  (step_id, batch, attempt, pid, run_by, ran_as, lock_requested_at, lock_acquired_at,
   status_seen, outcome, started_at, finished_at, error, sqlstate, txid)
SELECT s.id, s.batch, s.attempts, pg_catalog.pg_backend_pid(), $4, s.added_by, $5, $6,
       'pending', 'failed', $2, $3, $7, $8, pg_catalog.txid_current()
  FROM s
RETURNING attempt";

/// Records that a runner found the step already done; returns the next step of the
/// batch, if any. $1 id, $2 caller, $3 lock requested, $4 lock acquired.
pub const RECORD_SKIP: &str = "\
WITH a AS (
  INSERT INTO etc_batch.step_audit
    (step_id, batch, attempt, pid, run_by, ran_as, lock_requested_at, lock_acquired_at,
     status_seen, outcome, txid)
  SELECT b.id, b.batch, b.attempts, pg_catalog.pg_backend_pid(), $2, b.added_by, $3, $4,
         'done', 'skipped', pg_catalog.txid_current()
    FROM etc_batch.batch_log b
   WHERE b.id OPERATOR(pg_catalog.=) $1
  RETURNING batch)
SELECT (SELECT b.id FROM etc_batch.batch_log b
         WHERE b.batch OPERATOR(pg_catalog.=) a.batch AND b.id OPERATOR(pg_catalog.>) $1
         ORDER BY b.id LIMIT 1)
  FROM a";

/// Serializes add_step calls that let etc_batch choose the id, so that two of them
/// never pick the same one. Transaction-scoped, like every lock etc_batch takes.
pub const LOCK_STEP_IDS: &str = "\
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('etc_batch.batch_log.id'))";

pub const NEXT_FREE_ID: &str = "\
SELECT pg_catalog.max(b.id) FROM etc_batch.batch_log b";

/// $1 id, $2 batch, $3 command, $4 the adding role. The step keeps the adding session's
/// search_path, to run with.
pub const INSERT_STEP: &str = "\
INSERT INTO etc_batch.batch_log (id, batch, command, added_by, search_path)
VALUES ($1, $2, $3, $4, pg_catalog.current_setting('search_path'))
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
