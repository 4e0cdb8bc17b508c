-- The documentation's snippets that show no output of their own, run as they are
-- written; the pages quote them from here: the privileges of security.md, the
-- keepalives of faults.md, a lookup of operations.md, the update of upgrading.md and the
-- orchestrator of ways-of-calling.md.
CREATE EXTENSION etc_batch;
\set SHOW_CONTEXT never

-- security.md, for the roles it names
CREATE ROLE etl_owner;
CREATE ROLE etl_runner;
CREATE ROLE dashboard;
CREATE ROLE clerk;
CREATE ROLE dba;
CREATE ROLE worker;
GRANT USAGE ON SCHEMA etc_batch TO etl_owner, etl_runner, dashboard;
-- may add steps, which will run as themselves
GRANT EXECUTE ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer) TO etl_owner;
-- may run chains, and put them back to pending
GRANT EXECUTE ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean, text, text, bigint) TO etl_runner;
GRANT EXECUTE ON FUNCTION etc_batch.reset_batch(text), etc_batch.retry_step(bigint) TO etl_runner;
-- may define chains that run every night, run their runs, and end a run on purpose
GRANT EXECUTE ON FUNCTION etc_batch.define_chain(text, text, boolean) TO etl_owner;
GRANT EXECUTE ON PROCEDURE etc_batch.run_chain(text, text, text, text, bigint, text, text) TO etl_runner;
GRANT EXECUTE ON FUNCTION etc_batch.abandon_run(text, text) TO etl_runner;
-- may read the state and the history
GRANT SELECT ON etc_batch.batch_log, etc_batch.step_audit TO dashboard;

-- may register jobs (they run as the registering role, which needs SELECT and UPDATE
-- on the target, and SELECT on what an items query reads), drain them, stop them
GRANT EXECUTE ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb,
                                                 jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]),
    etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb,
                                      jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO clerk;
GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, text, text) TO clerk, etl_runner;
GRANT EXECUTE ON FUNCTION etc_batch.abort_job(text, text) TO clerk;
-- may act on every job, not only those of the roles whose privileges it has (below)
GRANT UPDATE ON etc_batch.job TO etl_runner;
-- may read every job (a registering role reads its own with no grant at all): the
-- reports read with the caller's privileges, on etc_batch's tables and on the target
GRANT SELECT ON etc_batch.job, etc_batch.job_item, etc_batch.job_audit, etc_batch.job_chunk,
    etc_batch.job_audit_items, etc_batch.job_item_chunk, etc_batch.job_audit_chunk TO dashboard;
-- the full check may mark a job corrupt
GRANT EXECUTE ON FUNCTION etc_batch.verify_job(text) TO clerk;
-- may launch jobs and chains into background workers that run them as the launching
-- role (which needs EXECUTE on drain_job or exec_batch_from_id too), and stop them
GRANT EXECUTE ON FUNCTION etc_batch.launch_job(text, integer), etc_batch.launch_batch(bigint),
    etc_batch.stop_launch(bigint) TO clerk, etl_runner;
-- may resume the launches a restart left, where etc_batch is not preloaded
GRANT EXECUTE ON FUNCTION etc_batch.resume_launches() TO dba;

-- may hold leases
GRANT EXECUTE ON FUNCTION etc_batch.acquire_lease(text, text, interval),
    etc_batch.release_lease(text, text), etc_batch.check_lease(text, text, bigint) TO worker;
-- may watch leases and locks, and ask the doctor (the doctor reads etc_batch's tables
-- and other sessions' activity: give it a member of pg_monitor)
GRANT SELECT ON etc_batch.leases, etc_batch.locks TO dashboard;
GRANT EXECUTE ON FUNCTION etc_batch.doctor() TO dba;
GRANT SELECT ON ALL TABLES IN SCHEMA etc_batch TO dba;
GRANT pg_monitor TO dba;

-- faults.md
ALTER ROLE etl_runner SET tcp_keepalives_idle = 30;       -- seconds of silence before probing
ALTER ROLE etl_runner SET tcp_keepalives_interval = 10;   -- seconds between probes
ALTER ROLE etl_runner SET tcp_keepalives_count = 3;       -- probes unanswered before giving up
ALTER ROLE etl_runner SET tcp_user_timeout = '60s';       -- data unacknowledged before giving up
ALTER ROLE etl_runner SET client_connection_check_interval = '10s';

-- operations.md
SELECT job_id, status FROM etc_batch.job_progress WHERE job_number = 12;

-- upgrading.md, on a database at the latest version: the update changes nothing
ALTER EXTENSION etc_batch UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'etc_batch';   -- 0.5.0

-- ways-of-calling.md: an orchestrator of two chains and a job, which it needs first
SELECT etc_batch.add_step('sales', 'CREATE TABLE sales_done AS SELECT 1 AS done', 21);
SELECT etc_batch.add_step('reporting', 'CREATE TABLE report_done AS SELECT 1 AS done', 101);
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending');
INSERT INTO orders SELECT g FROM generate_series(1, 10) g;
SELECT * FROM etc_batch.register_job_from_query('festival', NULL, 'orders',
    'SELECT id FROM orders', 5, '{"status": "cancelled"}', revision_column => NULL);
CREATE PROCEDURE nightly() LANGUAGE plpgsql AS $$
DECLARE
  -- PL/pgSQL takes a procedure's results (drain_job's five INOUT arguments) into variables
  chunks integer; items bigint; first_key text; last_key text; status text;
BEGIN
  CALL etc_batch.exec_batch_from_id(21);   -- the sales chain
  COMMIT;
  -- the approved cancellations
  CALL etc_batch.drain_job('festival', NULL, NULL, NULL, NULL,
                           chunks, items, first_key, last_key, status);
  RAISE NOTICE 'festival: % chunks, % items, %', chunks, items, status;
  COMMIT;
  CALL etc_batch.exec_batch_from_id(101);  -- the reporting chain
END $$;
CALL nightly();
SELECT id, batch, status FROM etc_batch.batch_log ORDER BY id;
SELECT job_id, status, committed, approved FROM etc_batch.job_progress;

-- the roles go again (their privileges and settings with them)
DROP OWNED BY etl_owner, etl_runner, dashboard, clerk, dba, worker;
DROP ROLE etl_owner, etl_runner, dashboard, clerk, dba, worker;
