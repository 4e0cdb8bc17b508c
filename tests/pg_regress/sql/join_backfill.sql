-- Backfills from another table (set_from_query): the items query joins and names the
-- value each row is set to; that value, frozen per item at registration, is set by the
-- chunk's one guarded UPDATE. What each row held before in the column is recorded with
-- its item, checked before the row is changed, and set back by the revert.
CREATE EXTENSION etc_batch;

-- 1. Orders keyed by uuid, no tenant and no revision column (guarded by a digest of each
-- row): each order's region copied from its customer. The application changes one order
-- after the approval: that row is skipped, never overwritten.
CREATE TABLE customers (customer_id int PRIMARY KEY, region text NOT NULL);
INSERT INTO customers SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END
  FROM generate_series(1, 4) g;
CREATE TABLE orders (
    id          uuid PRIMARY KEY,
    customer_id int NOT NULL REFERENCES customers,
    region      text,
    total       numeric(10, 2) NOT NULL);
INSERT INTO orders
SELECT ('00000000-0000-0000-0000-0000000000' || lpad(g::text, 2, '0'))::uuid, 1 + g % 4,
       CASE WHEN g = 3 THEN 'legacy' END, g * 10
  FROM generate_series(1, 10) g;
SELECT * FROM etc_batch.register_job_from_query('backfill-region', NULL, 'orders',
    $$SELECT o.id, c.region FROM orders o JOIN customers c USING (customer_id)
       WHERE o.region IS DISTINCT FROM c.region$$, 4, NULL,
    tenant_column => NULL, revision_column => NULL, set_from_query => '{region}',
    on_drift => 'skip');
-- each item holds the value to set under the column's name, and what its row held
-- before under the empty name
SELECT position, item_key, guards FROM etc_batch.job_item
 WHERE job_id = 'backfill-region' ORDER BY position;
UPDATE orders SET total = total + 1 WHERE id = '00000000-0000-0000-0000-000000000005';
CALL etc_batch.drain_job('backfill-region');
SELECT o.id, o.customer_id, o.region, c.region AS customer_region
  FROM orders o JOIN customers c USING (customer_id) ORDER BY o.id;
SELECT position, item_key, state FROM etc_batch.job_report('backfill-region') ORDER BY position;
SELECT status, approved, committed, matching, drifted, missing, skipped
  FROM etc_batch.job_summary('backfill-region');
SELECT check_name, ok FROM etc_batch.verify_job('backfill-region') ORDER BY check_name;

-- 2. The revert sets back what each row held (NULL, or 'legacy'), on rows that still
-- hold what the job set; its own revert sets the customers' regions again.
SELECT items, drifted, gone, set_back, set_back_per_item, expected
  FROM etc_batch.revert_preview('backfill-region');
SELECT * FROM etc_batch.register_revert('backfill-region', 'backfill-region-back');
CALL etc_batch.drain_job('backfill-region-back');
SELECT id, region FROM orders ORDER BY id;
SELECT * FROM etc_batch.register_revert('backfill-region-back', 'backfill-region-again');
CALL etc_batch.drain_job('backfill-region-again');
SELECT id, region FROM orders ORDER BY id;
SELECT job_id, status, record_before, set_from_items FROM etc_batch.job
 WHERE job_id LIKE 'backfill-region%' ORDER BY job_id;
-- a row changed since the revert's job set it is left out of the next revert, named
UPDATE orders SET region = 'apac' WHERE id = '00000000-0000-0000-0000-000000000002';
SELECT items, drifted, gone FROM etc_batch.revert_preview('backfill-region-again');

-- 3. Per-item values given in the list of register_job, on a table with a composite
-- key, guarded by named columns: a row whose column set changed since the approval
-- (the value recorded before no longer holds) is a conflict, and the conflict says what
-- was expected.
CREATE TABLE prices (
    shop  text NOT NULL,
    sku   int NOT NULL,
    price numeric(8, 2) NOT NULL,
    note  text,
    PRIMARY KEY (shop, sku));
INSERT INTO prices VALUES ('north', 1, 9.99, NULL), ('north', 2, 19.99, NULL),
                          ('south', 1, 8.49, 'promo'), ('south', 2, 18.49, NULL);
SELECT * FROM etc_batch.register_job('reprice', NULL, 'prices',
    '[{"shop": "north", "sku": 1, "price": 10.49},
      {"shop": "north", "sku": 2, "price": 20.99},
      {"shop": "south", "sku": 1, "price": 8.99, "note": "promo"},
      {"shop": "south", "sku": 2, "price": 18.99}]', 2, NULL,
    tenant_column => NULL, revision_column => NULL, guard => 'columns',
    set_from_query => '{price}');
UPDATE prices SET price = 21.00 WHERE shop = 'north' AND sku = 2;
CALL etc_batch.drain_job('reprice');
SELECT status, status_reason FROM etc_batch.job WHERE job_id = 'reprice';
SELECT * FROM prices ORDER BY shop, sku;
-- the same approval again changes nothing; another value for an item is another approval
SELECT * FROM etc_batch.register_job('reprice', NULL, 'prices',
    '[{"shop": "north", "sku": 1, "price": 10.49},
      {"shop": "north", "sku": 2, "price": 20.99},
      {"shop": "south", "sku": 1, "price": 8.99, "note": "promo"},
      {"shop": "south", "sku": 2, "price": 18.99}]', 2, NULL,
    tenant_column => NULL, revision_column => NULL, guard => 'columns',
    set_from_query => '{price}');
SELECT * FROM etc_batch.register_job('reprice', NULL, 'prices',
    '[{"shop": "north", "sku": 1, "price": 10.59},
      {"shop": "north", "sku": 2, "price": 20.99},
      {"shop": "south", "sku": 1, "price": 8.99, "note": "promo"},
      {"shop": "south", "sku": 2, "price": 18.99}]', 2, NULL,
    tenant_column => NULL, revision_column => NULL, guard => 'columns',
    set_from_query => '{price}');
\echo :LAST_ERROR_SQLSTATE

-- 4. What is refused, before anything is stored.
-- an item without the value
SELECT * FROM etc_batch.register_job('bad', NULL, 'prices',
    '[{"shop": "north", "sku": 1, "price": 1}, {"shop": "north", "sku": 2}]', 2, NULL,
    tenant_column => NULL, revision_column => NULL, set_from_query => '{price}');
\echo :LAST_ERROR_SQLSTATE
-- a query without the column
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'orders',
    'SELECT id FROM orders', 2, NULL, tenant_column => NULL, revision_column => NULL,
    set_from_query => '{region}');
\echo :LAST_ERROR_SQLSTATE
-- a column the table does not have, a key column, one named twice, one also in set_values
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'orders',
    'SELECT id, region AS area FROM orders', 2, NULL, tenant_column => NULL,
    revision_column => NULL, set_from_query => '{area}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'orders',
    'SELECT id FROM orders', 2, NULL, tenant_column => NULL, revision_column => NULL,
    set_from_query => '{id}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'orders',
    'SELECT id, region FROM orders', 2, NULL, tenant_column => NULL,
    revision_column => NULL, set_from_query => '{region,region}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'orders',
    'SELECT id, region FROM orders', 2, '{"region": "eu"}', tenant_column => NULL,
    revision_column => NULL, set_from_query => '{region}');
\echo :LAST_ERROR_SQLSTATE
-- a value the column cannot take
SELECT * FROM etc_batch.register_job('bad', NULL, 'prices',
    '[{"shop": "north", "sku": 1, "price": "cheap"}]', 2, NULL,
    tenant_column => NULL, revision_column => NULL, set_from_query => '{price}');
\echo :LAST_ERROR_SQLSTATE
-- with a handler, or with a delete
CREATE FUNCTION noop(item jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT item';
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'orders',
    'SELECT id, region FROM orders', 2, NULL, tenant_column => NULL,
    revision_column => NULL, handler => 'noop(jsonb)', set_from_query => '{region}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'orders',
    'SELECT id, region FROM orders', 2, NULL, tenant_column => NULL,
    revision_column => NULL, action => 'delete', set_from_query => '{region}');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS jobs_named_bad FROM etc_batch.job WHERE job_id = 'bad';
