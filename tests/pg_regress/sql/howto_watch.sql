-- docs/how-to/watch-a-job.md: a job at work in a launched worker, watched from a
-- session of its own. The worker is held by the job's throttle_query, so that what
-- the page shows is a job in the middle of its work. At the default settings.
\set SHOW_CONTEXT never
CREATE EXTENSION etc_batch;
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL);
INSERT INTO orders SELECT g, 'paid' FROM generate_series(1, 10000) g;
CREATE TABLE busy_hours (busy boolean NOT NULL);
INSERT INTO busy_hours VALUES (false);
SELECT * FROM etc_batch.register_job_from_query('settle', NULL, 'orders',
    'SELECT id FROM orders', 1000, set_values => '{"status": "settled"}',
    revision_column => NULL);
CALL etc_batch.drain_job('settle', max_chunks => 3);
-- The rest waits while the shop is busy, in a launched worker.
UPDATE busy_hours SET busy = true;
SELECT etc_batch.pace_job('settle', throttle_query => 'SELECT busy FROM busy_hours');
SELECT launch_id, workers FROM etc_batch.launch_job('settle');
DO $$ BEGIN
    -- (what a process does is read once per transaction unless the snapshot is cleared)
    WHILE (SELECT waiting IS NULL FROM etc_batch.job_progress WHERE job_id = 'settle') LOOP
        PERFORM pg_sleep(0.05);
        PERFORM pg_stat_clear_snapshot();
    END LOOP;
END $$;

-- The page's query, as written (its rates and times differ from run to run: not shown).
\o /dev/null
SELECT job_id, status, committed, approved, percent, items_per_second,
       estimated_finish, drainers, waiting, failure_message
  FROM etc_batch.job_progress
 WHERE status NOT IN ('done', 'reverted', 'continued', 'aborted');
\o
-- Every job not finished, and what it does now:
SELECT job_id, status, committed, approved, percent, drainers, waiting
  FROM etc_batch.job_progress
 WHERE status NOT IN ('done', 'reverted', 'continued', 'aborted');

-- The worker itself, in pg_stat_activity:
SELECT backend_type, wait_event FROM pg_stat_activity WHERE backend_type = 'etc_batch worker';

-- The shop is quiet again: the worker goes on by itself.
UPDATE busy_hours SET busy = false;
DO $$ BEGIN
    WHILE (SELECT status <> 'done' FROM etc_batch.job_progress WHERE job_id = 'settle') LOOP
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
SELECT job_id, status, committed, approved, percent, drainers, waiting
  FROM etc_batch.job_progress;
SELECT job_id, waited_for, waits FROM etc_batch.job_wait;
