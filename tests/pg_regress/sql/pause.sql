-- Pausing and resuming jobs and batches: a call on a paused job or batch returns at once,
-- normally, saying who paused it (the time is in the DETAIL, hidden here by terse
-- verbosity); nothing committed changes; resuming goes on from the checkpoint.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1,
                     status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id) SELECT 'X', g FROM generate_series(1, 9) g;
SELECT * FROM etc_batch.register_job('backfill', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}');
CALL etc_batch.drain_job('backfill', 1);

SELECT etc_batch.pause_job('backfill');
SELECT etc_batch.pause_job('backfill');
\set VERBOSITY terse
CALL etc_batch.drain_job('backfill');
\set VERBOSITY default
SELECT job_id, status, committed, paused_at IS NOT NULL AS paused, paused_by
  FROM etc_batch.job_progress;
SELECT check_name, status, detail ~ '^The job is paused, by postgres since ' AS says_who, hint
  FROM etc_batch.doctor() WHERE check_name = 'job backfill';
SELECT count(*) FILTER (WHERE status = 'cancelled') AS cancelled FROM orders;

SELECT etc_batch.resume_job('backfill');
SELECT etc_batch.resume_job('backfill');
CALL etc_batch.drain_job('backfill');
SELECT job_id, status, committed, paused_at FROM etc_batch.job_progress;

SELECT etc_batch.pause_job('nope');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pause_job(NULL);
\echo :LAST_ERROR_SQLSTATE

-- A parallel job is paused the same way.
UPDATE orders SET status = 'pending', revision = 1;
SELECT * FROM etc_batch.register_job('wide', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}', parallel => true);
SELECT etc_batch.pause_job('wide');
\set VERBOSITY terse
CALL etc_batch.drain_job('wide');
\set VERBOSITY default
SELECT etc_batch.resume_job('wide');
CALL etc_batch.drain_job('wide');

-- A paused batch: a run stops before its first step, and a step added to it is paused too.
CREATE TABLE side (step int);
SELECT etc_batch.add_step('nightly', 'INSERT INTO side VALUES (1)', 1);
SELECT etc_batch.add_step('nightly', 'INSERT INTO side VALUES (2)', 2);
CALL etc_batch.exec_batch_from_id(1);
SELECT etc_batch.reset_batch('nightly');
SELECT etc_batch.pause_batch('nightly');
SELECT etc_batch.add_step('nightly', 'INSERT INTO side VALUES (3)', 3);
\set VERBOSITY terse
CALL etc_batch.exec_batch_from_id(1);
\set VERBOSITY default
SELECT id, status, paused_at IS NOT NULL AS paused, paused_by FROM etc_batch.batch_log ORDER BY id;
SELECT batch, done, pending, paused_at IS NOT NULL AS paused, paused_by FROM etc_batch.chain_progress;
SELECT etc_batch.resume_batch('nightly');
CALL etc_batch.exec_batch_from_id(1);
SELECT step, count(*) FROM side GROUP BY step ORDER BY step;
SELECT etc_batch.pause_batch('nope');
\echo :LAST_ERROR_SQLSTATE

-- The pace of a job: set, shown, cleared; refused out of range.
UPDATE orders SET status = 'pending', revision = 1;
SELECT * FROM etc_batch.register_job('slow', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}');
SELECT etc_batch.pace_job('slow', 1000, 64 * 1024 * 1024);
SELECT job_id, rows_per_second, max_replica_lag_bytes, waiting FROM etc_batch.job_progress WHERE job_id = 'slow';
SELECT etc_batch.pace_job('slow', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('slow', NULL, -1);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('nope', 10);
\echo :LAST_ERROR_SQLSTATE
CALL etc_batch.drain_job('slow');
SELECT etc_batch.pace_job('slow', NULL, NULL);
SELECT count(*) AS paces FROM etc_batch.job_pace;
