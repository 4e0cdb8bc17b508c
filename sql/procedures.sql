-- The procedures that commit: C functions declared by hand as procedures, since
-- #[pg_extern] declares functions, which always run atomically. This is their only
-- declaration: the library reads each argument by the name given here, and places
-- each INOUT result by its name (src/procedure.rs).
--
-- Who may run chains and drain jobs is the administrator's decision, as with pg_cron.

CREATE PROCEDURE etc_batch.exec_batch_from_id(
    p_id bigint,
    wait boolean DEFAULT true,
    lease_name text DEFAULT NULL,
    lease_holder text DEFAULT NULL,
    lease_generation bigint DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_exec_batch_from_id';

COMMENT ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean, text, text, bigint) IS
    'Runs step p_id and every later step of its batch, each exactly once in a transaction of its own; wait => false returns at once when another runner holds the step.';

REVOKE ALL ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean, text, text, bigint) FROM PUBLIC;

CREATE PROCEDURE etc_batch.run_chain(
    chain text,
    run_key text DEFAULT NULL,
    lease_name text DEFAULT NULL,
    lease_holder text DEFAULT NULL,
    lease_generation bigint DEFAULT NULL,
    INOUT run text DEFAULT NULL,
    INOUT status text DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_run_chain';

COMMENT ON PROCEDURE etc_batch.run_chain(text, text, text, text, bigint, text, text) IS
    'Runs the run run_key (by default the date of today in the chain''s time zone) of a chain definition, created the first time with copies of its steps, as exec_batch_from_id runs a chain: each step exactly once, however many callers; waits its turn (status waiting) while an earlier run is unfinished, unless the chain allows overlapping runs.';

REVOKE ALL ON PROCEDURE etc_batch.run_chain(text, text, text, text, bigint, text, text) FROM PUBLIC;

CREATE PROCEDURE etc_batch.drain_job(
    job_id text,
    max_chunks integer DEFAULT NULL,
    lease_name text DEFAULT NULL,
    lease_holder text DEFAULT NULL,
    lease_generation bigint DEFAULT NULL,
    INOUT committed_chunks integer DEFAULT NULL,
    INOUT committed_items bigint DEFAULT NULL,
    INOUT first_key text DEFAULT NULL,
    INOUT last_key text DEFAULT NULL,
    INOUT status text DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_drain_job';

COMMENT ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, text, text) IS
    'Commits the next chunks of a registered job, each in a transaction of its own with its audit rows and checkpoint; returns how many chunks and items this call committed, the first and last key of them, and the job''s status.';

REVOKE ALL ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, text, text) FROM PUBLIC;
