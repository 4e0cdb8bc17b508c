-- Launches: background workers that drain a job or run a chain to the end with no client
-- session held; stopping them; a launch rolled back; every refusal; and a step that
-- commits, added by another role, run by a worker connected as that role. Crashes,
-- restarts, failovers and kills are in tests/workers. docs/launches.md quotes this
-- file's output.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

-- The workers run on their own: this waits until a launch has ended and every run of
-- its workers too (one statement, one snapshot, each time round), and says how the
-- launch ended.
CREATE FUNCTION wait_for(which bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s text;
    busy boolean;
BEGIN
    FOR i IN 1 .. 1200 LOOP
        SELECT l.status, EXISTS (SELECT FROM etc_batch.launch_run r
                                  WHERE r.launch_id = l.launch_id AND r.ended_at IS NULL)
          INTO s, busy
          FROM etc_batch.launch l WHERE l.launch_id = which;
        EXIT WHEN NOT FOUND OR (s IS DISTINCT FROM 'running' AND NOT busy);
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN s;
END $$;

CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending');
INSERT INTO orders SELECT g FROM generate_series(1, 3000) g;

-- 1. A parallel job drained by three workers; the launching session could go at once.
SELECT * FROM etc_batch.register_job_from_query('backfill', NULL, 'orders',
    $$SELECT id FROM orders$$, 100, '{"status": "cancelled"}',
    tenant_column => NULL, revision_column => NULL, parallel => true);
SELECT launch_id, workers, cardinality(pids) AS started FROM etc_batch.launch_job('backfill', 3);
SELECT wait_for(1);
SELECT worker, run, role, started_by, outcome IN ('done', 'pending') AS ended_well, launch_status
  FROM etc_batch.launches WHERE launch_id = 1 ORDER BY worker;
SELECT count(*) FILTER (WHERE status = 'cancelled') AS cancelled, count(*) FROM orders;
SELECT check_name, ok FROM etc_batch.verify_job('backfill');

-- 2. Refused, with nothing launched.
UPDATE orders SET status = 'pending';
SELECT * FROM etc_batch.register_job_from_query('in-order', NULL, 'orders',
    $$SELECT id FROM orders WHERE id <= 500$$, 100, '{"status": "shipped"}',
    tenant_column => NULL, revision_column => NULL);
SELECT * FROM etc_batch.launch_job('in-order', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.launch_job('in-order', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.launch_job('backfill');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.launch_job('nobody registered it');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.launch_batch(424242);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.stop_launch(424242);
\echo :LAST_ERROR_SQLSTATE
-- etc_batch.max_workers is the cluster's, set in its configuration
SET etc_batch.max_workers = 2;
SHOW etc_batch.max_workers;
SELECT count(*) AS launches FROM etc_batch.launch;

-- 3. A launch in a transaction that rolls back runs nothing: its worker waits for the
-- transaction, finds no launch, and ends.
BEGIN;
SELECT launch_id FROM etc_batch.launch_job('in-order');
ROLLBACK;
SELECT pg_sleep(1);
SELECT count(*) AS launches, (SELECT committed FROM etc_batch.job_progress WHERE job_id = 'in-order')
  FROM etc_batch.launch;

-- 4. Stopped: its worker ends after the chunk in flight; the job stays pending.
CREATE FUNCTION slowly() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$;
CREATE TRIGGER slowly AFTER UPDATE ON orders FOR EACH STATEMENT EXECUTE FUNCTION slowly();
SELECT launch_id, workers FROM etc_batch.launch_job('in-order');
SELECT pg_sleep(0.3);
SELECT etc_batch.stop_launch(3);
SELECT wait_for(3);
SELECT worker, outcome, launch_status FROM etc_batch.launches WHERE launch_id = 3;
SELECT status, stopped_by, ended_at IS NOT NULL AS ended FROM etc_batch.launch WHERE launch_id = 3;
SELECT status, committed > 0 AND committed < 500 AS part_done FROM etc_batch.job_progress WHERE job_id = 'in-order';
SELECT etc_batch.stop_launch(3);
DROP TRIGGER slowly ON orders;

-- 5. Paused, a launch's workers stop as drainers do; resumed, the launch goes on by
-- itself (its database's supervisor starts the workers again).
SELECT etc_batch.pause_job('in-order');
SELECT launch_id FROM etc_batch.launch_job('in-order');
SELECT wait_for(4);
SELECT worker, outcome FROM etc_batch.launches WHERE launch_id = 4;
SELECT etc_batch.resume_job('in-order');
SELECT wait_for(4);
SELECT run, started_by, outcome FROM etc_batch.launches WHERE launch_id = 4 ORDER BY run;
SELECT status, committed FROM etc_batch.job_progress WHERE job_id = 'in-order';

-- 6. A chain launched from a step: one worker runs it to the end, as
-- exec_batch_from_id would.
CREATE TABLE made (n int);
SELECT etc_batch.add_step('nightly', 'INSERT INTO made VALUES (1)', 1);
SELECT etc_batch.add_step('nightly', 'INSERT INTO made VALUES (2)', 2);
SELECT launch_id FROM etc_batch.launch_batch(1);
SELECT wait_for(5);
SELECT id, status FROM etc_batch.batch_log WHERE batch = 'nightly' ORDER BY id;
SELECT n FROM made ORDER BY n;

-- 7. A step that commits, added by another role, run by a chain's runner: a worker
-- connected as the role that added it runs it, and the runner goes on from it.
CREATE ROLE regress_etc_batch_author LOGIN;
GRANT USAGE ON SCHEMA etc_batch TO regress_etc_batch_author;
GRANT EXECUTE ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer),
    etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name,
                                      name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]),
    etc_batch.stop_launch(bigint)
    TO regress_etc_batch_author;
GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, text, text)
    TO regress_etc_batch_author;
GRANT SELECT, UPDATE ON orders TO regress_etc_batch_author;
GRANT INSERT ON made TO regress_etc_batch_author;
SET ROLE regress_etc_batch_author;
UPDATE orders SET status = 'pending' WHERE id > 2900;
SELECT * FROM etc_batch.register_job_from_query('theirs', NULL, 'orders',
    $$SELECT id FROM orders WHERE id > 2900$$, 50, '{"status": "theirs"}',
    tenant_column => NULL, revision_column => NULL);
SELECT etc_batch.add_step('etl', 'INSERT INTO made VALUES (3)', 11);
SELECT etc_batch.add_step('etl', 'CALL etc_batch.drain_job(''theirs'')', 12, commits => true);
SELECT etc_batch.add_step('etl', 'INSERT INTO made VALUES (4)', 13);
RESET ROLE;
CALL etc_batch.exec_batch_from_id(11);
SELECT id, status FROM etc_batch.batch_log WHERE batch = 'etl' ORDER BY id;
SELECT step_id, attempt, run_by::text, ran_as::text, outcome FROM etc_batch.step_audit
 WHERE batch = 'etl' ORDER BY audit_id;
SELECT status, committed FROM etc_batch.job_progress WHERE job_id = 'theirs';

-- Who may stop a launch: the role that launched it, or a member of it.
UPDATE orders SET status = 'pending' WHERE id <= 500;
SELECT * FROM etc_batch.register_job_from_query('again', NULL, 'orders',
    $$SELECT id FROM orders WHERE id <= 500$$, 100, '{"status": "shipped"}',
    tenant_column => NULL, revision_column => NULL);
SELECT launch_id FROM etc_batch.launch_job('again');
SET ROLE regress_etc_batch_author;
SELECT etc_batch.stop_launch(6);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT wait_for(6);
SELECT launch_id, workers, launched_by::text, status FROM etc_batch.launch ORDER BY launch_id;

-- prune_history forgets the launches that ended before the cutoff, with their runs; a
-- launch still running is kept whatever its age (in a transaction rolled back, so that
-- no supervisor ever sees it).
BEGIN;
INSERT INTO etc_batch.launch (job_id, workers, launched_by, launched_at, launching_xid, client_min_messages)
VALUES ('again', 1, 'postgres', now() - interval '2 days', pg_current_xact_id(), 'notice');
UPDATE etc_batch.launch SET ended_at = now() - interval '2 days' WHERE launch_id <= 3;
SELECT * FROM etc_batch.prune_history('1 day');
SELECT launch_id, status FROM etc_batch.launch ORDER BY launch_id;
SELECT DISTINCT launch_id FROM etc_batch.launch_run ORDER BY launch_id;
ROLLBACK;

-- A step that commits, added by another role, that fails in the worker connected as
-- that role: the caller gets the step's own error, SQLSTATE and message, as from any
-- step, not a step that "has failed".
CREATE PROCEDURE only_the_owner() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$;
REVOKE EXECUTE ON PROCEDURE only_the_owner() FROM PUBLIC;
SET ROLE regress_etc_batch_author;
SELECT etc_batch.add_step('theirs-failing', 'CALL only_the_owner()', 21, commits => true);
RESET ROLE;
CALL etc_batch.exec_batch_from_id(21);
\echo :LAST_ERROR_SQLSTATE
SELECT id, status, last_sqlstate, last_error FROM etc_batch.batch_log WHERE batch = 'theirs-failing';
-- and again, the step still failed: the runner stops at it, as at any failed step
CALL etc_batch.exec_batch_from_id(21);
\echo :LAST_ERROR_SQLSTATE

DROP OWNED BY regress_etc_batch_author;
DROP ROLE regress_etc_batch_author;
