-- The SQL surface of chains: adding steps, running them, failures, retries, and the
-- places where the runner refuses to start. Concurrency is in tests/isolation and
-- tests/integration.
CREATE EXTENSION etc_batch;
\set SHOW_CONTEXT never

CREATE TABLE sales (step int, loaded_by name DEFAULT current_user, txid bigint DEFAULT txid_current());
CREATE TABLE divisor (d int);
INSERT INTO divisor VALUES (0);

-- Steps get ids after the highest one unless one is given.
SELECT etc_batch.add_step('nightly', 'INSERT INTO sales(step) VALUES (21)', 21);
SELECT etc_batch.add_step('nightly', 'INSERT INTO sales(step) VALUES (22)');
SELECT etc_batch.add_step('nightly', 'INSERT INTO sales(step) VALUES (23); SELECT 1 / d FROM divisor');
SELECT etc_batch.add_step('nightly', 'INSERT INTO sales(step) VALUES (24)');
SELECT id, batch, status, attempts, added_by FROM etc_batch.batch_log ORDER BY id;

-- Step 23 fails: 21 and 22 stay committed, 23's insert is rolled back, 24 never runs.
CALL etc_batch.exec_batch_from_id(21);
\echo :LAST_ERROR_SQLSTATE
SELECT step, count(*) FROM sales GROUP BY step ORDER BY step;
SELECT id, status, attempts, last_error, last_sqlstate FROM etc_batch.batch_log ORDER BY id;
-- each step committed in a transaction of its own
SELECT count(DISTINCT txid) AS transactions FROM sales;

-- A failed step stops every later run until it is retried.
CALL etc_batch.exec_batch_from_id(21);
\echo :LAST_ERROR_SQLSTATE

UPDATE divisor SET d = 1;
SELECT etc_batch.retry_step(23);
CALL etc_batch.exec_batch_from_id(21);
SELECT step, count(*) FROM sales GROUP BY step ORDER BY step;
SELECT id, status, attempts, last_error FROM etc_batch.batch_log ORDER BY id;

-- The audit: one row per attempt and per skip, in order.
SELECT step_id, attempt, outcome, status_seen, sqlstate, run_by, ran_as,
       lock_acquired_at >= lock_requested_at AS lock_times_ordered,
       (outcome = 'skipped') = (started_at IS NULL) AS skip_has_no_run
  FROM etc_batch.step_audit ORDER BY audit_id;

-- Running a finished chain again only skips.
CALL etc_batch.exec_batch_from_id(22);
SELECT count(*) AS sales_rows FROM sales;

-- reset_batch puts everything back to pending for the next run; history stays.
SELECT etc_batch.reset_batch('nightly');
SELECT id, status, attempts FROM etc_batch.batch_log ORDER BY id;
SELECT count(*) AS audit_rows FROM etc_batch.step_audit;

-- Where the runner cannot commit: 2D000 with a hint, before anything runs.
BEGIN;
CALL etc_batch.exec_batch_from_id(21);
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
DO $$ BEGIN CALL etc_batch.exec_batch_from_id(21); EXCEPTION WHEN division_by_zero THEN NULL; END $$;
\echo :LAST_ERROR_SQLSTATE
CREATE FUNCTION run_from_function() RETURNS void LANGUAGE plpgsql
AS $$ BEGIN CALL etc_batch.exec_batch_from_id(21); END $$;
SELECT run_from_function();
\echo :LAST_ERROR_SQLSTATE
CREATE PROCEDURE run_with_set() LANGUAGE plpgsql SET work_mem = '8MB'
AS $$ BEGIN CALL etc_batch.exec_batch_from_id(21); END $$;
CALL run_with_set();
\echo :LAST_ERROR_SQLSTATE
CREATE PROCEDURE run_as_definer() LANGUAGE plpgsql SECURITY DEFINER
AS $$ BEGIN CALL etc_batch.exec_batch_from_id(21); END $$;
CALL run_as_definer();
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS sales_rows, (SELECT count(*) FROM etc_batch.batch_log WHERE status = 'pending') AS pending
  FROM sales;

-- An orchestrator CALLed at top level may call the runner, twice, with no COMMIT
-- between: every step still runs once.
TRUNCATE sales;
CREATE PROCEDURE orchestrate() LANGUAGE plpgsql
AS $$ BEGIN
  CALL etc_batch.exec_batch_from_id(21);
  CALL etc_batch.exec_batch_from_id(21);
END $$;
CALL orchestrate();
SELECT step, count(*) FROM sales GROUP BY step ORDER BY step;

-- Bad input: a clear error and nothing changed.
SELECT count(*) AS steps_before FROM etc_batch.batch_log;
CALL etc_batch.exec_batch_from_id(NULL);
\echo :LAST_ERROR_SQLSTATE
CALL etc_batch.exec_batch_from_id(9999);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step(NULL, 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('nightly', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('nightly', 'SELEC 1');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('nightly', '  -- only a comment');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('nightly', 'INSERT INTO sales(step) VALUES (1); COMMIT');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('nightly', 'SELECT 1', 22);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('nightly', 'SELECT 1', -5);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.retry_step(22);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.retry_step(9999);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.reset_batch('no such batch');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS steps_after FROM etc_batch.batch_log;

-- A step runs as the role that added it, whoever runs the chain.
CREATE ROLE etl_owner;
CREATE TABLE secrets (v int);
GRANT USAGE ON SCHEMA etc_batch TO etl_owner;
GRANT EXECUTE ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer) TO etl_owner;
GRANT INSERT ON sales TO etl_owner;
SET ROLE etl_owner;
SELECT etc_batch.add_step('owned', 'INSERT INTO sales(step) VALUES (101)', 101);
SELECT etc_batch.add_step('owned', 'INSERT INTO secrets VALUES (1)', 102);
-- and cannot write the bookkeeping tables directly
UPDATE etc_batch.batch_log SET command = 'SELECT 1' WHERE id = 102;
RESET ROLE;
CALL etc_batch.exec_batch_from_id(101);
\echo :LAST_ERROR_SQLSTATE
SELECT step, loaded_by FROM sales WHERE step = 101;
SELECT count(*) AS secrets_rows FROM secrets;
SELECT step_id, outcome, sqlstate, run_by, ran_as FROM etc_batch.step_audit WHERE batch = 'owned' ORDER BY audit_id;

-- A deferred constraint that a step violates fails the step, not the COMMIT after it.
CREATE TABLE parents (id int PRIMARY KEY);
CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED);
SELECT etc_batch.add_step('deferred', 'INSERT INTO children VALUES (7)', 401);
CALL etc_batch.exec_batch_from_id(401);
\echo :LAST_ERROR_SQLSTATE
SELECT status, last_sqlstate FROM etc_batch.batch_log WHERE id = 401;
SELECT count(*) AS children_rows FROM children;

-- A step cannot change who it runs as.
SELECT etc_batch.add_step('escalate', 'SET ROLE etl_owner', 301);
CALL etc_batch.exec_batch_from_id(301);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('escalate2', 'SET SESSION AUTHORIZATION etl_owner', 302);
CALL etc_batch.exec_batch_from_id(302);
\echo :LAST_ERROR_SQLSTATE

-- A step's SET does not leak into the next step or the session.
SELECT etc_batch.add_step('settings', 'SET work_mem = ''7MB''', 201);
SELECT etc_batch.add_step('settings', 'INSERT INTO sales(step, loaded_by) SELECT 202, current_setting(''work_mem'')', 202);
CALL etc_batch.exec_batch_from_id(201);
SELECT loaded_by AS work_mem_in_next_step FROM sales WHERE step = 202;
SELECT current_setting('work_mem') = '7MB' AS leaked_into_session;
SELECT etc_batch.add_step('settings', 'SET LOCAL search_path = nowhere', 203);
SELECT etc_batch.add_step('settings', 'INSERT INTO sales(step, loaded_by) SELECT 204, current_setting(''search_path'')', 204);
CALL etc_batch.exec_batch_from_id(203);
SELECT loaded_by AS search_path_in_next_step FROM sales WHERE step = 204;

DROP OWNED BY etl_owner;
DROP ROLE etl_owner;
