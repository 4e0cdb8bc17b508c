-- docs/tour.md, as a DBA meets etc_batch: a chain and a job. The page quotes this file
-- and tests/pg_regress/expected/tour.out, so what it shows is what ran.
CREATE EXTENSION etc_batch;
\set SHOW_CONTEXT never

-- A small ETL in the shape DBAs already have: load procedures, and steps that call them.
CREATE SCHEMA df;
CREATE TABLE df.raw_sales (day date, store int, amount numeric);
CREATE TABLE df.daily_sales (day date, store int, amount numeric);
CREATE TABLE df.store_totals (store int PRIMARY KEY, amount numeric);
CREATE TABLE df.exchange_rate (rate numeric);
INSERT INTO df.raw_sales
SELECT DATE '2026-11-01' + (g % 28), g % 7, (g * 37) % 1000 FROM generate_series(1, 5000) g;
CREATE PROCEDURE df.load_sales() LANGUAGE sql
AS $$ INSERT INTO df.daily_sales SELECT day, store, sum(amount) FROM df.raw_sales GROUP BY day, store $$;
CREATE PROCEDURE df.build_totals() LANGUAGE sql
AS $$ INSERT INTO df.store_totals SELECT store, sum(amount) FROM df.daily_sales GROUP BY store $$;
CREATE PROCEDURE df.convert_currency() LANGUAGE plpgsql
AS $$
DECLARE r numeric;
BEGIN
  SELECT rate INTO STRICT r FROM df.exchange_rate;   -- fails until a rate is loaded
  UPDATE df.store_totals SET amount = amount / r;
END $$;

SELECT etc_batch.add_step('nightly', 'CALL df.load_sales()', 21);
SELECT etc_batch.add_step('nightly', 'CALL df.build_totals()', 22);
SELECT etc_batch.add_step('nightly', 'CALL df.convert_currency()', 23);

-- Run it: each step in a transaction of its own; step 23 fails, 21 and 22 stay committed.
CALL etc_batch.exec_batch_from_id(21);
SELECT id, status, attempts, last_sqlstate, last_error FROM etc_batch.batch_log ORDER BY id;
SELECT step_id, attempt, outcome, status_seen, sqlstate, run_by, ran_as
  FROM etc_batch.step_audit ORDER BY audit_id;

-- Fix the cause, retry the failed step, run the chain again: what is done is skipped.
INSERT INTO df.exchange_rate VALUES (1.08);
SELECT etc_batch.retry_step(23);
CALL etc_batch.exec_batch_from_id(21);
SELECT store, round(amount, 2) AS amount FROM df.store_totals ORDER BY store LIMIT 3;
-- the next night
SELECT etc_batch.reset_batch('nightly');

-- A job: cancel the pending orders of one customer, five at a time, keeping finished
-- chunks even if a later one fails.
CREATE TABLE orders (
    tenant   text,
    id       int,
    revision int  NOT NULL DEFAULT 1,
    qty      int  NOT NULL,
    status   text NOT NULL DEFAULT 'pending',
    PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id, qty)
SELECT t, g, 1 + g % 3 FROM unnest(ARRAY['alien-fest', 'other']) t, generate_series(1, 12) g;

SELECT * FROM etc_batch.register_job('festival', 'alien-fest', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty))
       FROM orders WHERE tenant = 'alien-fest' AND status = 'pending'),
    5, set_values => '{"status": "cancelled"}', expect => '{"status": "pending"}');
CALL etc_batch.drain_job('festival', 1);

-- Someone changes order 8 before its chunk runs: that chunk rolls back whole, the job
-- stops in conflict, and the first chunk stays committed.
UPDATE orders SET qty = qty + 1, revision = revision + 1 WHERE tenant = 'alien-fest' AND id = 8;
CALL etc_batch.drain_job('festival');
SELECT status, approved, committed, unprocessed, matching, drifted, missing, parallel FROM etc_batch.job_summary('festival');
SELECT tenant, status, count(*) FROM orders GROUP BY 1, 2 ORDER BY 1, 2;
SELECT job_id, status, committed, approved, percent, chunks_committed, chunks_total
  FROM etc_batch.job_progress;
