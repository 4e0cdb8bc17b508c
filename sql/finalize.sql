-- Loaded last: the procedures (C functions declared by hand, since they commit),
-- comments, and privileges.

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

CREATE PROCEDURE etc_batch.drain_job(
    job_id text,
    max_chunks integer DEFAULT NULL,
    INOUT committed_keys text[] DEFAULT NULL,
    INOUT committed_chunks integer DEFAULT NULL,
    INOUT status text DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_drain_job';

COMMENT ON PROCEDURE etc_batch.drain_job(text, integer, text[], integer, text) IS
    'Commits the next chunks of a registered job, each in a transaction of its own with its audit rows and checkpoint; returns the keys and chunks this call committed and the job''s status.';
COMMENT ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure) IS
    'Freezes an approved list of items for a job; the same request again changes nothing, a different one under the same job id is refused.';
COMMENT ON FUNCTION etc_batch.job_report(text) IS
    'Every approved item of a job: unprocessed, or committed and now matching, drifted or missing.';
COMMENT ON FUNCTION etc_batch.job_summary(text) IS
    'A job''s status and its items counted by state.';
COMMENT ON FUNCTION etc_batch.verify_job(text) IS
    'Compares every audit row of a job with its approved list; a pending job that fails becomes corrupt.';
COMMENT ON FUNCTION etc_batch.abort_job(text, text) IS
    'Stops a job for good, keeping its approval, audit and checkpoint.';

REVOKE ALL ON PROCEDURE etc_batch.drain_job(text, integer, text[], integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.job_report(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.job_summary(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.verify_job(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.abort_job(text, text) FROM PUBLIC;
