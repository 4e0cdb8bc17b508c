-- Chains that orchestrate: add_step's commits, timeout and max_attempts. A step that
-- commits is a single CALL run in the runner's own non-atomic context: it can drain a job
-- or run a procedure that commits in batches. A step with a timeout runs with that
-- statement_timeout only; exceeded, it fails as timed_out. A step that fails with
-- 40001, 40P01 or 55P03 is run again, up to max_attempts in all.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

-- The new arguments, checked when the step is added.
SELECT etc_batch.add_step('bad', 'SELECT 1; SELECT 2', commits => true);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('bad', 'SELECT 1', commits => true);
SELECT etc_batch.add_step('bad', 'SELECT 1', max_attempts => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('bad', 'SELECT 1', timeout => '0');
SELECT etc_batch.add_step('bad', 'SELECT 1', commits => NULL);
SELECT count(*) AS added FROM etc_batch.batch_log;

-- A chain that loads, drains an approved job, and runs a procedure of its own that
-- commits every row.
CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1,
                     status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id) SELECT 'X', g FROM generate_series(1, 6) g;
SELECT * FROM etc_batch.register_job('festival', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}');
CREATE TABLE loaded (n int, txid bigint DEFAULT txid_current());
CREATE PROCEDURE load_in_batches(n int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        INSERT INTO loaded (n) VALUES (i);
        COMMIT;
    END LOOP;
END $$;
SELECT etc_batch.add_step('nightly', 'INSERT INTO loaded (n) VALUES (0)', 501);
SELECT etc_batch.add_step('nightly', $$CALL etc_batch.drain_job('festival')$$, 502, commits => true);
SELECT etc_batch.add_step('nightly', 'CALL load_in_batches(3)', 503, commits => true);
CALL etc_batch.exec_batch_from_id(501);
SELECT id, status, attempts, commits FROM etc_batch.batch_log WHERE batch = 'nightly' ORDER BY id;
SELECT status, committed FROM etc_batch.job_progress;
-- each row of the procedure in a transaction of its own
SELECT count(*) AS rows, count(DISTINCT txid) AS transactions FROM loaded WHERE n > 0;
-- run again: every step is done, each is skipped
CALL etc_batch.exec_batch_from_id(501);

-- The lease arguments fence a step that commits: a runner that lost its lease does not
-- start it.
SELECT acquired, generation FROM etc_batch.acquire_lease('nightly-runner', 'w1', '1 hour');
SELECT etc_batch.reset_batch('nightly');
CALL etc_batch.exec_batch_from_id(503, lease_name => 'nightly-runner', lease_holder => 'w1', lease_generation => 7);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS rows FROM loaded WHERE n > 0;
SELECT status FROM etc_batch.batch_log WHERE id = 503;

-- A timeout: the step runs with that statement_timeout, and only it.
SELECT etc_batch.add_step('slow',
    $step$DO $do$ BEGIN RAISE NOTICE 'statement_timeout %', current_setting('statement_timeout'); END $do$$step$,
    601, timeout => '1.5s');
SELECT etc_batch.add_step('slow', 'SELECT pg_sleep(5)', 602, timeout => '100ms');
CALL etc_batch.exec_batch_from_id(601);
\echo :LAST_ERROR_SQLSTATE
SHOW statement_timeout;
SELECT id, status, last_sqlstate, timeout FROM etc_batch.batch_log WHERE batch = 'slow' ORDER BY id;
SELECT step_id, attempt, outcome, sqlstate FROM etc_batch.step_audit WHERE batch = 'slow' ORDER BY audit_id;

-- Transient errors: a step that fails with a deadlock twice (a sequence counts, since it
-- is not rolled back) commits at its third attempt of max_attempts 3; each attempt has
-- its audit row.
CREATE SEQUENCE tries;
CREATE TABLE made (n int);
CREATE FUNCTION deadlock_twice() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO made VALUES (nextval('tries'));
    IF currval('tries') <= 2 THEN
        RAISE EXCEPTION 'deadlock on purpose, %', currval('tries') USING ERRCODE = '40P01';
    END IF;
END $$;
SELECT etc_batch.add_step('flaky', 'SELECT deadlock_twice()', 701, max_attempts => 3);
CALL etc_batch.exec_batch_from_id(701);
SELECT * FROM made;
SELECT id, status, attempts, last_sqlstate FROM etc_batch.batch_log WHERE batch = 'flaky';
SELECT step_id, attempt, outcome, sqlstate FROM etc_batch.step_audit WHERE batch = 'flaky' ORDER BY audit_id;

-- Out of attempts: failed with the last error. Any other error fails at once.
SELECT setval('tries', 1, false);
SELECT etc_batch.add_step('flakier', 'SELECT deadlock_twice()', 801, max_attempts => 2);
CALL etc_batch.exec_batch_from_id(801);
\echo :LAST_ERROR_SQLSTATE
SELECT step_id, attempt, outcome, sqlstate FROM etc_batch.step_audit WHERE batch = 'flakier' ORDER BY audit_id;
SELECT etc_batch.add_step('broken', 'SELECT 1 / 0', 851, max_attempts => 5);
CALL etc_batch.exec_batch_from_id(851);
SELECT step_id, attempt, outcome, sqlstate FROM etc_batch.step_audit WHERE batch = 'broken' ORDER BY audit_id;

-- A chain that would run itself again, directly or through another batch, is refused
-- before anything runs.
SELECT etc_batch.add_step('selfish', 'INSERT INTO made VALUES (-1)', 901);
SELECT etc_batch.add_step('selfish', 'CALL etc_batch.exec_batch_from_id(901)', 902, commits => true);
CALL etc_batch.exec_batch_from_id(901);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.add_step('ping', 'CALL etc_batch.exec_batch_from_id(p_id => 961)', 951, commits => true);
SELECT etc_batch.add_step('pong', 'CALL etc_batch.exec_batch_from_id(951)', 961, commits => true);
CALL etc_batch.exec_batch_from_id(951);
SELECT count(*) AS ran FROM made WHERE n = -1;
SELECT count(*) AS attempts FROM etc_batch.step_audit WHERE batch IN ('selfish', 'ping', 'pong');

-- A step that commits, added by another role, runs in a background worker connected as
-- that role: tests/pg_regress/sql/launches.sql.
