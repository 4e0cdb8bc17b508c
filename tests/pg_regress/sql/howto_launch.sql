-- docs/how-to/launch-and-forget.md: a job launched, the client gone, the server
-- finishing it. At the default settings.
\set SHOW_CONTEXT never
CREATE EXTENSION etc_batch;
CREATE TABLE orders (id bigint PRIMARY KEY, total numeric NOT NULL, total_cents bigint);
INSERT INTO orders SELECT g, g * 1.25, NULL FROM generate_series(1, 20000) g;

-- A backfill in parallel, two workers, and the session ends at once.
SELECT * FROM etc_batch.register_job_from_query('cents', NULL, 'orders',
    'SELECT id FROM orders WHERE total_cents IS NULL', 1000,
    set_values => NULL, set_expressions => '{"total_cents": "(total * 100)::bigint"}',
    revision_column => NULL, parallel => true);
SELECT launch_id, workers FROM etc_batch.launch_job('cents', workers => 2);
\connect
-- A new session, later: the launch and its workers.
DO $$ BEGIN
    WHILE EXISTS (SELECT FROM etc_batch.launch_run WHERE ended_at IS NULL)
          OR (SELECT status FROM etc_batch.launch WHERE launch_id = 1) = 'running' LOOP
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
-- (a worker that found no chunk left ends pending, one that committed the last done)
SELECT launch_id, worker, job_id, outcome IN ('done', 'pending') AS ended_well, launch_status
  FROM etc_batch.launches ORDER BY worker;
SELECT job_id, status, committed, approved FROM etc_batch.job_progress;
SELECT count(*) FILTER (WHERE total_cents = total * 100) AS backfilled, count(*) FROM orders;
SELECT check_name, ok FROM etc_batch.verify_job('cents');
