-- The README's quick start, as a DBA pastes it into psql on a fresh database: five
-- steps. The README quotes this file and tests/pg_regress/expected/quickstart.out.

-- 1. A plain table: a primary key, no tenant, no revision column.
CREATE EXTENSION etc_batch;
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL);
INSERT INTO orders
SELECT g, CASE WHEN g % 4 = 0 THEN 'unpaid' ELSE 'paid' END FROM generate_series(1, 1000) g;

-- 2. Approve: the unpaid orders, frozen now, to be cancelled 100 at a time, each only
-- if it is still unpaid when its chunk comes.
SELECT * FROM etc_batch.register_job_from_query('cancel-unpaid', NULL, 'orders',
    'SELECT id FROM orders WHERE status = ''unpaid''', 100,
    set_values => '{"status": "cancelled"}', expect => '{"status": "unpaid"}',
    revision_column => NULL);

-- 3. Run it: a chunk a transaction; run it again after a crash and it goes on where
-- the last commit left it.
CALL etc_batch.drain_job('cancel-unpaid');

-- 4. Watch it (from any session, while it runs).
SELECT job_id, status, committed, approved, percent FROM etc_batch.job_progress;

-- 5. Undo it: a new approved job that sets back what the first one changed.
SELECT * FROM etc_batch.register_revert('cancel-unpaid', 'cancel-unpaid-undo');
CALL etc_batch.drain_job('cancel-unpaid-undo');
SELECT status, count(*) FROM orders GROUP BY status ORDER BY status;
