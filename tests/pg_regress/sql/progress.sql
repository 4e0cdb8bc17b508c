-- How often a drain and a chain tell where they stand: etc_batch.progress_interval. The
-- test clusters run at 0 (every chunk and step told, the output the other files
-- compare); here a long interval makes the default's output deterministic: no call
-- lasts an hour, so each says only, at its end, how it ended.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

SELECT boot_val, unit, min_val, context FROM pg_settings WHERE name = 'etc_batch.progress_interval';
\set VERBOSITY sqlstate
SET etc_batch.progress_interval = -1;
\set VERBOSITY default
SET etc_batch.progress_interval = '1h';

CREATE TABLE orders (
    tenant   text,
    id       int,
    revision int NOT NULL DEFAULT 1,
    status   text NOT NULL DEFAULT 'pending',
    PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id) SELECT 'X', g FROM generate_series(1, 40) g;
SELECT chunks FROM etc_batch.register_job('festival', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    10, '{"status": "cancelled"}', '{"status": "pending"}');

-- two chunks, then the rest: one NOTICE per call, at its end
CALL etc_batch.drain_job('festival', 2);
CALL etc_batch.drain_job('festival');
-- a call with nothing left to do says so too
CALL etc_batch.drain_job('festival');

-- paused: the pause is told at once, as always, and the end says so
SELECT chunks FROM etc_batch.register_job('festival-2', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    10, '{"status": "shipped"}', '{"status": "cancelled"}');
SELECT etc_batch.pause_job('festival-2');
\set VERBOSITY terse
CALL etc_batch.drain_job('festival-2');
\set VERBOSITY default
SELECT etc_batch.resume_job('festival-2');

-- nobody listening: nothing is told (and nothing is put together)
SET client_min_messages = warning;
CALL etc_batch.drain_job('festival-2');
RESET client_min_messages;
SELECT status, count(*) FROM orders GROUP BY status;

-- a chain: one NOTICE at the end, counting the steps committed and those skipped
CREATE TABLE sales (step int);
SELECT etc_batch.add_step('nightly', 'INSERT INTO sales VALUES (' || g || ')', CASE WHEN g = 1 THEN 1 END) IS NOT NULL
  FROM generate_series(1, 5) g;
CALL etc_batch.exec_batch_from_id(1);
CALL etc_batch.exec_batch_from_id(1);
-- what goes wrong is told at once, whatever the setting
SELECT etc_batch.add_step('failing', 'SELECT 1 / 0', 100) IS NOT NULL;
CALL etc_batch.exec_batch_from_id(100);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pause_batch('nightly');
SELECT etc_batch.reset_batch('nightly');
\set VERBOSITY terse
CALL etc_batch.exec_batch_from_id(1);
\set VERBOSITY default
SELECT count(*) AS steps_run FROM sales;

-- 0: every chunk and step, as it commits, and no summary
SET etc_batch.progress_interval = 0;
SELECT etc_batch.resume_batch('nightly');
CALL etc_batch.exec_batch_from_id(1);
SELECT chunks FROM etc_batch.register_job('festival-3', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE id <= 20),
    10, '{"status": "pending"}', '{"status": "shipped"}');
CALL etc_batch.drain_job('festival-3');
