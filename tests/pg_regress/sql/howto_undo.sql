-- docs/how-to/undo-a-job.md: a job registered so that it can be undone, and undone.
-- At the default settings.
\set SHOW_CONTEXT never
CREATE EXTENSION etc_batch;
CREATE TABLE prices (sku text PRIMARY KEY, price numeric NOT NULL);
INSERT INTO prices SELECT 'sku-' || g, 10 + g FROM generate_series(1, 1000) g;

-- Each row's own price is recorded before the change: record_before => true.
SELECT * FROM etc_batch.register_job_from_query('raise-10pct', NULL, 'prices',
    'SELECT sku FROM prices', 200,
    set_values => NULL, set_expressions => '{"price": "round(price * 1.10, 2)"}',
    revision_column => NULL, record_before => true);
CALL etc_batch.drain_job('raise-10pct');
SELECT sku, price FROM prices WHERE sku IN ('sku-1', 'sku-1000') ORDER BY sku;

-- Meanwhile the application changes one price by hand.
UPDATE prices SET price = 99 WHERE sku = 'sku-7';

-- What an undo would do, registering nothing:
SELECT items, drifted, gone, set_back, set_back_per_item FROM etc_batch.revert_preview('raise-10pct');
SELECT * FROM etc_batch.revert_preview_left_out('raise-10pct');

-- The undo, a job of its own: each row back to its recorded price, only if it still
-- holds the price the job set.
SELECT * FROM etc_batch.register_revert('raise-10pct', 'raise-10pct-undo');
CALL etc_batch.drain_job('raise-10pct-undo');
SELECT sku, price FROM prices WHERE sku IN ('sku-1', 'sku-7', 'sku-1000') ORDER BY sku;
SELECT job_id, position, item_key, state FROM etc_batch.job_left_out;
SELECT job_id, status FROM etc_batch.job_progress ORDER BY job_number;
