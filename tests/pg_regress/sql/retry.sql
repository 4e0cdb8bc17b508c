-- Transient errors: a chunk that fails with 40001, 40P01 or 55P03 is rolled back and tried
-- again after a backoff that doubles, up to etc_batch.transient_attempts attempts in all;
-- every retry is a NOTICE and a row of job_retry. Any other error fails the call at once.
-- Here a trigger fails the first attempts on purpose: a sequence counts them, since a
-- sequence is not rolled back with the chunk.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

SHOW etc_batch.chunk_lock_timeout;
SHOW etc_batch.transient_attempts;
SET etc_batch.transient_attempts = 0;
-- (PostgreSQL 18 words the range of a setting with units otherwise: only the SQLSTATE)
DO $$ BEGIN SET etc_batch.chunk_lock_timeout = -1;
   EXCEPTION WHEN invalid_parameter_value THEN RAISE NOTICE 'refused: %', SQLSTATE; END $$;
SET etc_batch.chunk_lock_timeout = '2s';
SHOW etc_batch.chunk_lock_timeout;
SET etc_batch.chunk_lock_tmeout = '2s';

CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1,
                     status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id) SELECT 'X', g FROM generate_series(1, 6) g;
CREATE SEQUENCE failures;
CREATE TABLE failing (sqlstate text, times int);
CREATE FUNCTION fail_at_first() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE f failing;
BEGIN
    SELECT * INTO f FROM failing;
    IF NEW.id = 4 AND nextval('failures') <= f.times THEN
        RAISE EXCEPTION 'made to fail, %', currval('failures') USING ERRCODE = f.sqlstate;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_at_first BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION fail_at_first();

SELECT * FROM etc_batch.register_job('retried', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}');

-- Chunk 2 fails twice, with a deadlock, and commits at its third attempt.
INSERT INTO failing VALUES ('40P01', 2);
CALL etc_batch.drain_job('retried');
SELECT job_id, chunk, attempt, sqlstate, message, pid = pg_backend_pid() AS this_session
  FROM etc_batch.job_retry ORDER BY retried_at;
SELECT job_id, status, committed, retries FROM etc_batch.job_progress;
SELECT count(*) AS audited, count(DISTINCT position) AS positions FROM etc_batch.job_audit WHERE job_id = 'retried';
SELECT count(*) FILTER (WHERE status = 'cancelled') AS cancelled FROM orders;

-- The attempts used up: the call fails with the chunk's own error, the job stays pending
-- (not in conflict), and the chunks before it stay committed.
ALTER TABLE orders DISABLE TRIGGER fail_at_first;
UPDATE orders SET status = 'pending', revision = 1;
ALTER TABLE orders ENABLE TRIGGER fail_at_first;
SELECT setval('failures', 1, false);
UPDATE failing SET sqlstate = '55P03', times = 10;
SELECT * FROM etc_batch.register_job('given_up', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}');
SET etc_batch.transient_attempts = 3;
CALL etc_batch.drain_job('given_up');
\echo :LAST_ERROR_SQLSTATE
SELECT job_id, status, committed, retries FROM etc_batch.job_progress WHERE job_id = 'given_up';
SELECT chunk, attempt, sqlstate FROM etc_batch.job_retry WHERE job_id = 'given_up' ORDER BY retried_at;

-- A serialization failure is retried too; the next call finishes the job.
UPDATE failing SET sqlstate = '40001', times = 0;
SELECT setval('failures', 1, false);
UPDATE failing SET times = 1;
CALL etc_batch.drain_job('given_up');
SELECT job_id, status, committed, retries FROM etc_batch.job_progress WHERE job_id = 'given_up';

-- Any other error fails the call at once, with no retry.
ALTER TABLE orders DISABLE TRIGGER fail_at_first;
UPDATE orders SET status = 'pending', revision = 1;
ALTER TABLE orders ENABLE TRIGGER fail_at_first;
SELECT setval('failures', 1, false);
UPDATE failing SET sqlstate = '23514', times = 10;
SELECT * FROM etc_batch.register_job('not_transient', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}');
CALL etc_batch.drain_job('not_transient');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS retries FROM etc_batch.job_retry WHERE job_id = 'not_transient';

-- A parallel job's chunk is retried the same way.
ALTER TABLE orders DISABLE TRIGGER fail_at_first;
UPDATE orders SET status = 'pending', revision = 1;
ALTER TABLE orders ENABLE TRIGGER fail_at_first;
SELECT setval('failures', 1, false);
UPDATE failing SET sqlstate = '40P01', times = 1;
SELECT * FROM etc_batch.register_job('wide', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}', parallel => true);
CALL etc_batch.drain_job('wide');
SELECT job_id, status, committed, retries FROM etc_batch.job_progress WHERE job_id = 'wide';

-- The lock waits of a chunk are bounded by etc_batch.chunk_lock_timeout; a chain's step
-- runs under it too, and 0 leaves the session's lock_timeout in force.
SET etc_batch.chunk_lock_timeout = '1500ms';
SELECT etc_batch.add_step('show',
    $step$DO $do$ BEGIN RAISE NOTICE 'lock_timeout %', current_setting('lock_timeout'); END $do$$step$, 1);
CALL etc_batch.exec_batch_from_id(1);
SET etc_batch.chunk_lock_timeout = 0;
SET lock_timeout = '7s';
SELECT etc_batch.reset_batch('show');
CALL etc_batch.exec_batch_from_id(1);
SHOW lock_timeout;
