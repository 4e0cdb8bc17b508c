-- docs/how-to/nightly-chain.md, as a DBA runs it with psql in the database of the work
-- (here shop); tests/cron runs this file and then the schedule it makes.

-- The table of the example: orders, some unpaid for more than a week.
CREATE TABLE orders (
    id        bigint PRIMARY KEY,
    status    text NOT NULL,
    placed_at timestamptz NOT NULL
);
INSERT INTO orders
SELECT g, CASE WHEN g % 3 = 0 THEN 'unpaid' ELSE 'paid' END, now() - g * interval '1 hour'
  FROM generate_series(1, 500) g;

CREATE EXTENSION IF NOT EXISTS etc_batch;

-- The chain, defined once; each night's run is a copy of its steps.
SELECT etc_batch.define_chain('nightly', time_zone => 'Europe/Berlin');

-- Step 1: tonight's approval, a job named after the night.
SELECT etc_batch.add_step('nightly', $$
    SELECT etc_batch.register_job_from_query(
        'cancel-unpaid-' || etc_batch.current_run(), NULL, 'orders',
        'SELECT id FROM orders WHERE status = ''unpaid''
            AND placed_at < now() - interval ''7 days''',
        1000, set_values => '{"status": "cancelled"}', expect => '{"status": "unpaid"}',
        revision_column => NULL)
$$);

-- Step 2: the job drained, a COMMIT per chunk (a step that commits).
SELECT etc_batch.add_step('nightly',
    $$CALL etc_batch.drain_job('cancel-unpaid-' || etc_batch.current_run())$$,
    commits => true);

-- Step 3: history older than 90 days pruned.
SELECT etc_batch.add_step('nightly', $$SELECT etc_batch.prune_history('90 days')$$);

-- The schedule, in the database pg_cron is installed in (cron.database_name):
-- every night at 02:05 (pg_cron's time zone, GMT unless cron.timezone says otherwise).
\connect postgres
SELECT cron.schedule_in_database('etc_batch nightly', '5 2 * * *',
    $$CALL etc_batch.run_chain('nightly')$$, 'shop');
