-- The chain runner and the privileges of the chain functions.

CREATE PROCEDURE etc_batch.exec_batch_from_id(p_id bigint, wait boolean DEFAULT true)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_exec_batch_from_id';

COMMENT ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean) IS
    'Runs step p_id and every later step of its batch, each exactly once in a transaction of its own; wait => false returns at once when another runner holds the step.';
COMMENT ON FUNCTION etc_batch.add_step(text, text, bigint) IS
    'Adds a step to a batch and returns its id; the step will run with the privileges of the role that adds it.';
COMMENT ON FUNCTION etc_batch.reset_batch(text) IS
    'Puts every step of a batch back to pending for its next run and returns how many; step_audit keeps the history.';
COMMENT ON FUNCTION etc_batch.retry_step(bigint) IS
    'Puts a failed step back to pending.';

-- Who may run and change chains is the administrator's decision, as with pg_cron.
REVOKE ALL ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.add_step(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.reset_batch(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.retry_step(bigint) FROM PUBLIC;
