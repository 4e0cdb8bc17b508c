-- docs/how-to/backfill-purge-move.md: a computed backfill, a backfill from a join, a
-- purge and an archive move, each an approved job drained a chunk at a time. At the
-- default settings.
\set SHOW_CONTEXT never
CREATE EXTENSION etc_batch;
CREATE TABLE customers (id bigint PRIMARY KEY, country text NOT NULL);
INSERT INTO customers SELECT g, (ARRAY['DE', 'FR', 'VN'])[g % 3 + 1] FROM generate_series(1, 100) g;
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers,
    qty         integer NOT NULL,
    unit_price  numeric NOT NULL,
    total       numeric,
    country     text,
    status      text NOT NULL,
    placed_at   date NOT NULL
);
INSERT INTO orders
SELECT g, g % 100 + 1, g % 5 + 1, 9.99, NULL, NULL,
       CASE WHEN g % 10 = 0 THEN 'cancelled' ELSE 'shipped' END,
       date '2026-12-01' - (g % 900)
  FROM generate_series(1, 5000) g;
CREATE TABLE orders_archive (LIKE orders INCLUDING ALL);

-- 1. A computed backfill: total from the row's own columns.
SELECT * FROM etc_batch.register_job_from_query('backfill-total', NULL, 'orders',
    'SELECT id FROM orders WHERE total IS NULL', 1000,
    set_values => NULL, set_expressions => '{"total": "qty * unit_price"}',
    revision_column => NULL, record_before => true);
CALL etc_batch.drain_job('backfill-total');

-- 2. A backfill from a join: each order's country, frozen from customers now.
SELECT * FROM etc_batch.register_job_from_query('backfill-country', NULL, 'orders',
    'SELECT o.id, c.country FROM orders o JOIN customers c ON c.id = o.customer_id
      WHERE o.country IS NULL', 1000,
    set_values => NULL, set_from_query => ARRAY['country'], revision_column => NULL);
CALL etc_batch.drain_job('backfill-country');
SELECT country, count(*), sum(total) FROM orders GROUP BY country ORDER BY country;

-- 3. A purge: cancelled orders, each kept with the audit so that it can be put back.
SELECT * FROM etc_batch.register_job_from_query('purge-cancelled', NULL, 'orders',
    'SELECT id FROM orders WHERE status = ''cancelled''', 1000,
    set_values => NULL, expect => '{"status": "cancelled"}',
    revision_column => NULL, action => 'delete');
CALL etc_batch.drain_job('purge-cancelled');

-- 4. An archive move: orders placed before 2025, into orders_archive.
SELECT * FROM etc_batch.register_job_from_query('archive-2024', NULL, 'orders',
    'SELECT id FROM orders WHERE placed_at < date ''2025-01-01''', 1000,
    set_values => NULL, revision_column => NULL,
    action => 'move', archive => 'orders_archive');
CALL etc_batch.drain_job('archive-2024');

SELECT (SELECT count(*) FROM orders) AS orders, (SELECT count(*) FROM orders_archive) AS archived,
       (SELECT min(placed_at) FROM orders) AS oldest_kept;
SELECT job_id, status, committed, approved FROM etc_batch.job_progress ORDER BY job_number;
