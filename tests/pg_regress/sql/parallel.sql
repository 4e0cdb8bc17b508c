-- The SQL surface of parallel jobs: an approval whose chunks may commit in any order,
-- each claimed by one of any number of drainers. Concurrency is in tests/isolation
-- (exact interleavings) and tests/integration (many drainers, killed ones).
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

CREATE TABLE orders (
    tenant   text,
    id       int,
    revision int NOT NULL DEFAULT 1,
    qty      int,
    status   text NOT NULL DEFAULT 'pending',
    PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id, qty) SELECT 'X', g, g % 4 + 1 FROM generate_series(1, 12) g;

-- Whether chunks may commit in any order is part of the approval.
SELECT * FROM etc_batch.register_job_from_query('backfill', 'X', 'orders',
    $$SELECT id, revision, qty FROM orders WHERE tenant = 'X'$$,
    5, '{"status": "cancelled"}', '{"status": "pending"}', parallel => true);
SELECT job_id, chunk, committed FROM etc_batch.job_chunk ORDER BY chunk;

-- The same request again changes nothing; the same one without parallel is another.
SELECT * FROM etc_batch.register_job_from_query('backfill', 'X', 'orders',
    $$SELECT id, revision, qty FROM orders WHERE tenant = 'X'$$,
    5, '{"status": "cancelled"}', '{"status": "pending"}', parallel => true);
SELECT * FROM etc_batch.register_job_from_query('backfill', 'X', 'orders',
    $$SELECT id, revision, qty FROM orders WHERE tenant = 'X'$$,
    5, '{"status": "cancelled"}', '{"status": "pending"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('backfill', 'X', 'orders',
    $$SELECT id, revision, qty FROM orders WHERE tenant = 'X'$$,
    5, '{"status": "cancelled"}', '{"status": "pending"}', parallel => NULL);
\echo :LAST_ERROR_SQLSTATE

SELECT * FROM etc_batch.job_summary('backfill');

-- One drainer takes the chunks one after the other; what it committed is counted by
-- chunk, not by a prefix.
CALL etc_batch.drain_job('backfill', 1);
SELECT job_id, status, committed, approved, percent, chunks_committed, chunks_total, parallel, drainers
  FROM etc_batch.job_progress;
SELECT chunk, committed, txid IS NOT NULL AS has_txid FROM etc_batch.job_chunk WHERE job_id = 'backfill' ORDER BY chunk;
SELECT * FROM etc_batch.verify_job('backfill');

CALL etc_batch.drain_job('backfill');
SELECT * FROM etc_batch.job_summary('backfill');
SELECT job_id, status, next_index, chunks_committed, finished_at IS NOT NULL AS finished
  FROM etc_batch.job WHERE job_id = 'backfill';
SELECT * FROM etc_batch.verify_job('backfill');
-- a done job again: nothing to do
CALL etc_batch.drain_job('backfill');

-- A chunk row marked not committed again by hand no longer matches its seal: the job is
-- corrupt before anything is changed.
UPDATE orders SET status = 'pending', revision = 1;
SELECT * FROM etc_batch.register_job('tampered', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'X'),
    4, '{"status": "cancelled"}', parallel => true);
CALL etc_batch.drain_job('tampered', 1);
UPDATE etc_batch.job_chunk SET committed = false WHERE job_id = 'tampered' AND chunk = 1;
CALL etc_batch.drain_job('tampered');
\echo :LAST_ERROR_SQLSTATE
SELECT id, revision, status FROM orders WHERE id <= 5 ORDER BY id;
SELECT check_name, ok, detail FROM etc_batch.verify_job('tampered');

-- A conflict stops a parallel job as it stops a sequential one; chunks committed stay.
UPDATE orders SET status = 'pending', revision = 1;
SELECT * FROM etc_batch.register_job('contested', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty)) FROM orders WHERE tenant = 'X'),
    4, '{"status": "cancelled"}', parallel => true);
UPDATE orders SET qty = qty + 1, revision = revision + 1 WHERE id = 10;
CALL etc_batch.drain_job('contested');
\echo :LAST_ERROR_SQLSTATE
SELECT chunk, committed FROM etc_batch.job_chunk WHERE job_id = 'contested' ORDER BY chunk;
SELECT * FROM etc_batch.job_summary('contested');
CALL etc_batch.drain_job('contested');
\echo :LAST_ERROR_SQLSTATE

-- Aborting a parallel job, and pruning: a finished job goes with all three partitions.
UPDATE orders SET status = 'pending', revision = 1;
SELECT * FROM etc_batch.register_job('dropped', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'X'),
    4, '{"status": "cancelled"}', parallel => true);
SELECT etc_batch.abort_job('dropped', 'not needed after all');
CALL etc_batch.drain_job('dropped');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS partitions_before FROM pg_class
 WHERE relnamespace = 'etc_batch'::regnamespace AND relname ~ '^job_(item_chunk|audit_chunk|chunk)_[0-9]+$';
SELECT * FROM etc_batch.prune_history('1 microsecond');
SELECT count(*) AS partitions_after FROM pg_class
 WHERE relnamespace = 'etc_batch'::regnamespace AND relname ~ '^job_(item_chunk|audit_chunk|chunk)_[0-9]+$';
