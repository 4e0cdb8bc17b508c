-- register_job_from_query: the approved items are the rows of a SELECT, frozen
-- set-based in key order; after that the job is a job like any other.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never
CREATE TABLE orders (
    tenant   text,
    id       int,
    revision int NOT NULL DEFAULT 1,
    qty      int,
    status   text NOT NULL DEFAULT 'pending',
    placed   date NOT NULL DEFAULT DATE '2026-11-01',
    PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id, qty) SELECT 'X', g * 3, g % 4 + 1 FROM generate_series(1, 12) g;
INSERT INTO orders (tenant, id, qty) SELECT 'Y', g * 3, 1 FROM generate_series(1, 12) g;
UPDATE orders SET status = 'shipped' WHERE tenant = 'X' AND id IN (6, 30);

-- The rows of the query, in key order, with qty a guard.
SELECT * FROM etc_batch.register_job_from_query('fest', 'X', 'orders',
    $$SELECT id, revision, qty FROM orders WHERE tenant = 'X' AND status = 'pending' ORDER BY id DESC$$,
    4, '{"status": "cancelled"}', '{"status": "pending"}');
SELECT position, item_key, revision, guards FROM etc_batch.job_item WHERE job_id = 'fest' ORDER BY position;
SELECT guard_columns, item_count FROM etc_batch.job WHERE job_id = 'fest';

-- The same rows again, in any order, from the same query or another: the same request.
SELECT * FROM etc_batch.register_job_from_query('fest', 'X', 'orders',
    $$SELECT qty, revision, id FROM orders WHERE tenant = 'X' AND id NOT IN (6, 30)$$,
    4, '{"status": "cancelled"}', '{"status": "pending"}');
-- and the same content as a jsonb list
SELECT * FROM etc_batch.register_job('fest', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty))
       FROM orders WHERE tenant = 'X' AND status = 'pending'),
    4, '{"status": "cancelled"}', '{"status": "pending"}');
-- Other content under the same job id: refused, naming the first difference.
SELECT * FROM etc_batch.register_job_from_query('fest', 'X', 'orders',
    $$SELECT id, revision, qty + (id = 9)::int AS qty FROM orders WHERE tenant = 'X' AND status = 'pending'$$,
    4, '{"status": "cancelled"}', '{"status": "pending"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('fest', 'X', 'orders',
    $$SELECT id, revision, qty FROM orders WHERE tenant = 'X'$$,
    4, '{"status": "cancelled"}', '{"status": "pending"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('fest', 'X', 'orders',
    $$SELECT id, revision FROM orders WHERE tenant = 'X' AND status = 'pending'$$,
    4, '{"status": "cancelled"}', '{"status": "pending"}');
\echo :LAST_ERROR_SQLSTATE

-- Drained like any job: a chunk, then another operator changes item 21, in chunk 2.
CALL etc_batch.drain_job('fest', 1);
UPDATE orders SET qty = qty + 1, revision = revision + 1 WHERE tenant = 'X' AND id = 21;
CALL etc_batch.drain_job('fest');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.job_summary('fest');
SELECT check_name, ok FROM etc_batch.verify_job('fest');

-- A query over a view and a join; a date guard; keys of another type than the column's.
CREATE TABLE customers (tenant text PRIMARY KEY, tier text);
INSERT INTO customers VALUES ('Y', 'gold');
CREATE VIEW open_orders AS SELECT * FROM orders WHERE status = 'pending';
SELECT * FROM etc_batch.register_job_from_query('gold', 'Y', 'orders',
    $$SELECT o.id::bigint AS id, o.revision, o.placed
        FROM open_orders o JOIN customers c USING (tenant)
       WHERE c.tier = 'gold' AND o.id <= 12$$,
    2, '{"status": "cancelled"}');
SELECT item_key, guards FROM etc_batch.job_item WHERE job_id = 'gold' ORDER BY position;
CALL etc_batch.drain_job('gold');
SELECT id, revision, status FROM orders WHERE tenant = 'Y' AND id <= 12 ORDER BY id;

-- An items query that finds nothing approves nothing: a job done at once, which a
-- NOTICE says; drained, it does nothing; registered again the same, it changes nothing;
-- a list of no items is the same approval.
SELECT * FROM etc_batch.register_job_from_query('quiet', 'X', 'orders',
    $$SELECT id, revision FROM orders WHERE false$$, 4, '{"status": "x"}');
SELECT status, item_count, next_index FROM etc_batch.job WHERE job_id = 'quiet';
SELECT status, approved, committed, unprocessed, matching FROM etc_batch.job_summary('quiet');
SELECT job_id, status, committed, approved, percent, chunks_total, estimated_finish FROM etc_batch.job_progress WHERE job_id = 'quiet';
SELECT check_name, ok FROM etc_batch.verify_job('quiet') ORDER BY check_name;
CALL etc_batch.drain_job('quiet');
SELECT * FROM etc_batch.register_job_from_query('quiet', 'X', 'orders',
    $$SELECT id, revision FROM orders WHERE false$$, 4, '{"status": "x"}');
SELECT * FROM etc_batch.register_job('quiet', 'X', 'orders', '[]', 4, '{"status": "x"}');
SELECT * FROM etc_batch.register_job('quiet', 'X', 'orders', '[]', 4, '{"status": "y"}');
\echo :LAST_ERROR_SQLSTATE

-- Refused, with nothing stored.
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id % 2 AS id, revision FROM orders WHERE tenant = 'X'$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id, revision, 'red' AS colour FROM orders WHERE tenant = 'X'$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id, revision, qty::text AS qty FROM orders WHERE tenant = 'X'$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id, revision, tenant FROM orders WHERE tenant = 'X'$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id FROM orders WHERE tenant = 'X'$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id, revision, revision AS revision FROM orders$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT NULL::int AS id, revision FROM orders WHERE tenant = 'X'$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELEC id, revision FROM orders$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$UPDATE orders SET qty = 0 RETURNING id, revision$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$WITH gone AS (DELETE FROM orders RETURNING id, revision) SELECT * FROM gone$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id, revision INTO stolen FROM orders$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id, revision FROM orders; SELECT 1$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders', '  ', 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders', NULL, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', 'X', 'orders',
    $$SELECT id, revision FROM no_such_table$$, 4, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
-- a read-only WITH is a SELECT, and a trailing semicolon or comment is no second statement
SELECT * FROM etc_batch.register_job_from_query('with', 'Y', 'orders',
    $$WITH y AS (SELECT id, revision FROM orders WHERE tenant = 'Y' AND id > 30) SELECT * FROM y; -- the rest$$,
    4, '{"qty": 0}');
SELECT count(*) AS stored_for_bad FROM etc_batch.job WHERE job_id = 'bad';
SELECT count(*) AS tables_left FROM pg_class
 WHERE relnamespace = 'etc_batch'::regnamespace AND relname ~ '^job_(item|audit)_[0-9]+$'
   AND NOT relispartition;

-- Odd identifiers: a key, tenant, revision and guard column that need quoting.
CREATE TABLE "Odd ""Orders""" ("Ten,ant" text, "k;ey" text, "rev'n" bigint NOT NULL, "Qty" int,
    st text, PRIMARY KEY ("Ten,ant", "k;ey"));
INSERT INTO "Odd ""Orders""" VALUES ('t', 'b', 1, 2, 'new'), ('t', 'B', 1, 3, 'new'), ('t', 'a', 1, 4, 'new');
SELECT * FROM etc_batch.register_job_from_query('odd''job', 't', '"Odd ""Orders"""',
    $$SELECT "k;ey", "rev'n", "Qty" FROM "Odd ""Orders"""$$, 2, '{"st": "done"}',
    key_column => 'k;ey', tenant_column => 'Ten,ant', revision_column => 'rev''n');
SELECT position, item_key, guards FROM etc_batch.job_item WHERE job_id = 'odd''job' ORDER BY position;
CALL etc_batch.drain_job('odd''job');
SELECT * FROM "Odd ""Orders""" ORDER BY "k;ey" COLLATE "C";
