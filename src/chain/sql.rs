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
         LIMIT 1) AS pid
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
/// what the audit row needs. $1 id, $2 started, $3 finished, $4 message, $5 SQLSTATE,
/// $6 detail.
pub const MARK_RETRIED: &str = "\
UPDATE etc_batch.batch_log
   SET attempts = attempts OPERATOR(pg_catalog.+) 1,
       started_at = $2, finished_at = $3, last_error = $4, last_sqlstate = $5,
       last_detail = $6
 WHERE id OPERATOR(pg_catalog.=) $1
RETURNING batch, attempts, added_by::pg_catalog.oid AS added_by";

/// The steps of a batch that commit, and their commands: for the check that a chain
/// never runs itself again. $1 batch.
pub const COMMITTING_STEPS: &str = "\
SELECT b.id, b.command FROM etc_batch.batch_log b
 WHERE b.batch OPERATOR(pg_catalog.=) $1 AND b.commits
 ORDER BY b.id";

/// Marks the step failed with the error; its audit row follows. Returns what the audit
/// row needs. $1 id, $2 started, $3 finished, $4 message, $5 SQLSTATE, $6 detail.
pub const MARK_FAILED: &str = "\
UPDATE etc_batch.batch_log
   SET status = 'failed', attempts = attempts OPERATOR(pg_catalog.+) 1,
       started_at = $2, finished_at = $3, last_error = $4, last_sqlstate = $5,
       last_detail = $6
 WHERE id OPERATOR(pg_catalog.=) $1
RETURNING batch, attempts, added_by::pg_catalog.oid AS added_by";

/// A step found done, for the audit row of the skip, and the next step of the batch.
/// $1 id.
pub const STEP_SKIPPED: &str = concat!(
    "SELECT batch, attempts, added_by::pg_catalog.oid AS added_by, ",
    next_step!(),
    " AS next_step
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

/// retry_step: failed step $1 back to pending; its batch, and the attempts, SQLSTATE and
/// error of the failure it clears (kept in step_audit).
pub const RETRY_STEP: &str = "\
UPDATE etc_batch.batch_log SET status = 'pending'
 WHERE id OPERATOR(pg_catalog.=) $1 AND status OPERATOR(pg_catalog.=) 'failed'
RETURNING batch, attempts, last_sqlstate AS sqlstate, last_error AS error";

pub const STEP_STATUS: &str = "\
SELECT b.status FROM etc_batch.batch_log b WHERE b.id OPERATOR(pg_catalog.=) $1";

/// Whether anything in the database can defer a check to COMMIT.
pub const ANY_DEFERRABLE: &str = "\
SELECT EXISTS (SELECT FROM pg_catalog.pg_constraint c WHERE c.condeferrable)
    OR EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgdeferrable)";

// Chain definitions and their runs (runs.rs).

pub const SESSION_TIME_ZONE: &str = "SELECT pg_catalog.current_setting('TimeZone')";

pub const TIME_ZONE_KNOWN: &str = "\
SELECT EXISTS (SELECT FROM pg_catalog.pg_timezone_names() z(name, abbrev, utc_offset, is_dst)
                WHERE z.name OPERATOR(pg_catalog.=) $1)";

/// The chain whose run batch $1 is, if it is one.
pub const RUN_OF_BATCH: &str = "\
SELECT r.chain FROM etc_batch.chain_run r WHERE r.batch OPERATOR(pg_catalog.=) $1";

/// $1 chain, $2 time zone, $3 overlap, $4 the defining role.
pub const DEFINE_CHAIN: &str = "\
INSERT INTO etc_batch.chain AS c (chain, time_zone, overlap, defined_by)
VALUES ($1, $2, $3, $4)
ON CONFLICT (chain) DO UPDATE
   SET time_zone = excluded.time_zone, overlap = excluded.overlap,
       defined_by = excluded.defined_by, defined_at = pg_catalog.now()";

/// Serializes run_chain calls of chain $1, so that two of them make one run.
pub const LOCK_CHAIN: &str = "\
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('etc_batch.chain ' OPERATOR(pg_catalog.||) $1))";

pub const CHAIN_DEFINITION: &str = "\
SELECT c.time_zone, c.overlap FROM etc_batch.chain c WHERE c.chain OPERATOR(pg_catalog.=) $1";

/// Today's date in time zone $1, the default run key.
pub const TODAY_IN: &str = "\
SELECT pg_catalog.to_char(pg_catalog.timezone($1, pg_catalog.now()), 'YYYY-MM-DD')";

/// Run $2 of chain $1: its batch, first step, number, and who abandoned it when.
pub const FIND_RUN: &str = "\
SELECT r.batch, r.first_step, r.run_number, r.abandoned_by::pg_catalog.text AS abandoned_by,
       r.abandoned_at
  FROM etc_batch.chain_run r
 WHERE r.chain OPERATOR(pg_catalog.=) $1 AND r.run_key OPERATOR(pg_catalog.=) $2";

pub const BATCH_EXISTS: &str = "\
SELECT EXISTS (SELECT FROM etc_batch.batch_log b WHERE b.batch OPERATOR(pg_catalog.=) $1)";

/// The steps of definition $1 copied into batch $2, in their order, with ids after $3;
/// returns the first one's id (no row: the definition has no steps).
pub const COPY_STEPS: &str = "\
WITH copied AS (
  INSERT INTO etc_batch.batch_log (id, batch, command, added_by, search_path,
                                   commits, timeout, max_attempts)
  SELECT $3 OPERATOR(pg_catalog.+) pg_catalog.row_number() OVER (ORDER BY d.id), $2, d.command,
         d.added_by, d.search_path, d.commits, d.timeout, d.max_attempts
    FROM etc_batch.batch_log d
   WHERE d.batch OPERATOR(pg_catalog.=) $1
  RETURNING id)
SELECT pg_catalog.min(id) FROM copied";

/// $1 chain, $2 run key, $3 batch, $4 first step, $5 the creating role.
pub const INSERT_RUN: &str = "\
INSERT INTO etc_batch.chain_run (chain, run_key, batch, first_step, created_by)
VALUES ($1, $2, $3, $4, $5)
RETURNING run_number";

/// The first run of chain $1 made before run number $2 that is not abandoned and has a
/// step that is not done: its batch, key, and that step, its status and error.
pub const UNFINISHED_BEFORE: &str = "\
SELECT r.batch, r.run_key, s.id AS step, s.status, s.last_error AS error
  FROM etc_batch.chain_run r
  JOIN LATERAL (SELECT b.id, b.status::pg_catalog.text, b.last_error FROM etc_batch.batch_log b
                 WHERE b.batch OPERATOR(pg_catalog.=) r.batch
                   AND b.status OPERATOR(pg_catalog.<>) 'done'
                 ORDER BY b.id LIMIT 1) s ON true
 WHERE r.chain OPERATOR(pg_catalog.=) $1 AND r.run_number OPERATOR(pg_catalog.<) $2
   AND r.abandoned_at IS NULL
 ORDER BY r.run_number LIMIT 1";

/// Run $2 of chain $1: its batch, whether it was abandoned, whether every step is done.
pub const RUN_STATE: &str = "\
SELECT r.batch, r.abandoned_at IS NOT NULL AS abandoned,
       NOT EXISTS (SELECT FROM etc_batch.batch_log b
                    WHERE b.batch OPERATOR(pg_catalog.=) r.batch
                      AND b.status OPERATOR(pg_catalog.<>) 'done') AS done
  FROM etc_batch.chain_run r
 WHERE r.chain OPERATOR(pg_catalog.=) $1 AND r.run_key OPERATOR(pg_catalog.=) $2";

/// $1 chain, $2 run key, $3 the abandoning role.
pub const ABANDON_RUN: &str = "\
UPDATE etc_batch.chain_run SET abandoned_by = $3, abandoned_at = pg_catalog.now()
 WHERE chain OPERATOR(pg_catalog.=) $1 AND run_key OPERATOR(pg_catalog.=) $2";

/// What batch $1 is: whether it is a chain's definition; the chain and key of the run it
/// is, and who abandoned that run when.
pub const BATCH_KIND: &str = "\
SELECT EXISTS (SELECT FROM etc_batch.chain c WHERE c.chain OPERATOR(pg_catalog.=) $1) AS definition,
       r.chain, r.run_key, r.abandoned_by::pg_catalog.text AS abandoned_by, r.abandoned_at
  FROM (SELECT) n
  LEFT JOIN etc_batch.chain_run r ON r.batch OPERATOR(pg_catalog.=) $1";

/// reset_batch: every step of batch $1 back to pending; each one that was not, with
/// what it was, in id order.
pub const RESET_BATCH_STEPS: &str = "\
WITH was AS (
  SELECT b.id, b.status::pg_catalog.text AS status, b.attempts, b.last_sqlstate, b.last_error
    FROM etc_batch.batch_log b
   WHERE b.batch OPERATOR(pg_catalog.=) $1
     FOR UPDATE),
reset AS (
  UPDATE etc_batch.batch_log b
     SET status = 'pending', attempts = 0, started_at = NULL, finished_at = NULL,
         last_error = NULL, last_sqlstate = NULL, last_detail = NULL
    FROM was
   WHERE b.id OPERATOR(pg_catalog.=) was.id
  RETURNING b.id)
SELECT was.id, was.status, was.attempts, was.last_sqlstate AS sqlstate, was.last_error AS error
  FROM was JOIN reset ON reset.id OPERATOR(pg_catalog.=) was.id
 ORDER BY was.id";

/// How run batch $1 stands after a runner returned: done, paused or pending.
pub const RUN_STATUS: &str = "\
SELECT CASE WHEN pg_catalog.bool_and(b.status OPERATOR(pg_catalog.=) 'done') THEN 'done'
            WHEN pg_catalog.bool_or(b.paused_at IS NOT NULL) THEN 'paused'
            ELSE 'pending' END
  FROM etc_batch.batch_log b WHERE b.batch OPERATOR(pg_catalog.=) $1";
