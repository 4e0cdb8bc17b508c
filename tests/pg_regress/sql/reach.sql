-- What a job that deletes its rows reaches beyond its items, and what guards it:
-- foreign keys that would delete or change rows of other tables refuse the job (at
-- registration, and at a drain when one was made since); a key ON DELETE RESTRICT
-- stops a chunk, which a later drain commits; a purge guarded by nothing is refused;
-- an archive keeps an identity column's values.
CREATE EXTENSION etc_batch;

-- 1. Customers whose orders reference them ON DELETE CASCADE, and whose order lines
-- reference the orders ON DELETE SET NULL: a purge of customers would delete their
-- orders and change their lines, none of which the job keeps. Refused, each key named,
-- nearest first; nothing stored.
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, active boolean NOT NULL);
CREATE TABLE orders (
    id int PRIMARY KEY,
    customer int NOT NULL REFERENCES customers ON DELETE CASCADE,
    total numeric NOT NULL);
CREATE TABLE order_lines (
    id int PRIMARY KEY,
    order_id int REFERENCES orders ON DELETE SET NULL,
    sku text NOT NULL);
INSERT INTO customers SELECT g, 'customer ' || g, g > 2 FROM generate_series(1, 6) g;
INSERT INTO orders SELECT g, 1 + g % 6, g * 10 FROM generate_series(1, 12) g;
INSERT INTO order_lines SELECT g, 1 + g % 12, 'sku-' || g FROM generate_series(1, 24) g;
SELECT * FROM etc_batch.register_job_from_query('purge-inactive', NULL, 'customers',
    'SELECT id FROM customers WHERE NOT active', 10, NULL, '{"active": false}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns', action => 'delete');
\echo :LAST_ERROR_SQLSTATE
-- a move of them, and a purge that keeps nothing, alike
CREATE TABLE customers_archive (LIKE customers);
SELECT * FROM etc_batch.register_job_from_query('archive-inactive', NULL, 'customers',
    'SELECT id FROM customers WHERE NOT active', 10, NULL, '{"active": false}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns',
    action => 'move', archive => 'customers_archive');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('forget-inactive', NULL, 'customers',
    'SELECT id FROM customers WHERE NOT active', 10, NULL, '{"active": false}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns',
    action => 'delete', keep_deleted => false);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM etc_batch.job;
SELECT (SELECT count(*) FROM customers) AS customers, (SELECT count(*) FROM orders) AS orders,
       (SELECT count(order_id) FROM order_lines) AS lines_with_an_order;
-- an update of the same customers reaches nothing: registered
SELECT * FROM etc_batch.register_job_from_query('flag-inactive', NULL, 'customers',
    'SELECT id FROM customers WHERE NOT active', 10, '{"name": "(inactive)"}', '{"active": false}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns');

-- 2. A key that references its own table (a manager and the employees under them) and
-- a referencing table partitioned by month: each key named once, the recursion ending.
CREATE TABLE employees (
    id int PRIMARY KEY,
    manager int REFERENCES employees ON DELETE CASCADE);
CREATE TABLE shifts (
    employee int NOT NULL REFERENCES employees ON DELETE CASCADE,
    day date NOT NULL) PARTITION BY RANGE (day);
CREATE TABLE shifts_2026_01 PARTITION OF shifts FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE shifts_2026_02 PARTITION OF shifts FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
INSERT INTO employees VALUES (1, NULL), (2, 1), (3, 2);
SELECT * FROM etc_batch.register_job('leavers', NULL, 'employees', '[{"id": 3}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete');
\echo :LAST_ERROR_SQLSTATE

-- 3. Invoice lines that reference their invoices ON DELETE NO ACTION (the default; RESTRICT
-- is refused alike, as 23001 from PostgreSQL 18 on): the purge of invoices is
-- registered, and the chunk that meets a line still referencing its order stops with
-- 23503, rolled back whole; the job stays pending, resumed once the line is gone.
CREATE TABLE invoices (id int PRIMARY KEY, paid boolean NOT NULL);
CREATE TABLE invoice_lines (
    id int PRIMARY KEY,
    invoice int NOT NULL REFERENCES invoices);
INSERT INTO invoices SELECT g, true FROM generate_series(1, 6) g;
INSERT INTO invoice_lines VALUES (1, 5);
SELECT * FROM etc_batch.register_job_from_query('purge-paid', NULL, 'invoices',
    'SELECT id FROM invoices WHERE paid', 2, NULL, '{"paid": true}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns', action => 'delete');
\set VERBOSITY terse
CALL etc_batch.drain_job('purge-paid');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT status, next_index, chunks_committed FROM etc_batch.job WHERE job_id = 'purge-paid';
SELECT id FROM invoices ORDER BY id;
DELETE FROM invoice_lines WHERE invoice = 5;
CALL etc_batch.drain_job('purge-paid');
SELECT count(*) AS invoices_left FROM invoices;
SELECT count(*) FILTER (WHERE NOT ok) AS failed_checks FROM etc_batch.verify_job('purge-paid');

-- 4. A key ON DELETE CASCADE made after registration: the drain stops before its first
-- chunk, nothing deleted; with the key dropped again, the drain goes on.
INSERT INTO invoices SELECT g, true FROM generate_series(11, 14) g;
SELECT * FROM etc_batch.register_job_from_query('purge-paid-later', NULL, 'invoices',
    'SELECT id FROM invoices WHERE paid', 2, NULL, '{"paid": true}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns', action => 'delete');
CREATE TABLE payments (invoice int REFERENCES invoices ON DELETE CASCADE);
INSERT INTO payments VALUES (12);
CALL etc_batch.drain_job('purge-paid-later');
\echo :LAST_ERROR_SQLSTATE
SELECT status, next_index FROM etc_batch.job WHERE job_id = 'purge-paid-later';
SELECT (SELECT count(*) FROM invoices) AS invoices, (SELECT count(*) FROM payments) AS payments;
DROP TABLE payments;
CALL etc_batch.drain_job('purge-paid-later');
SELECT count(*) AS invoices_left FROM invoices;

-- 5. A purge guarded by nothing: named columns (guard 'columns'), items that name only
-- their keys and no expect. Refused, nothing stored; with expect, registered.
CREATE TABLE tokens (id int PRIMARY KEY, expired boolean NOT NULL);
INSERT INTO tokens SELECT g, g % 2 = 0 FROM generate_series(1, 8) g;
SELECT * FROM etc_batch.register_job_from_query('purge-tokens', NULL, 'tokens',
    'SELECT id FROM tokens WHERE expired', 10, NULL,
    tenant_column => NULL, revision_column => NULL, guard => 'columns', action => 'delete');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS stored FROM etc_batch.job WHERE job_id = 'purge-tokens';
SELECT * FROM etc_batch.register_job_from_query('purge-tokens', NULL, 'tokens',
    'SELECT id FROM tokens WHERE expired', 10, NULL, '{"expired": true}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns', action => 'delete',
    on_drift => 'skip');
-- the guard guards: a token renewed after the approval is skipped, not deleted
UPDATE tokens SET expired = false WHERE id = 4;
CALL etc_batch.drain_job('purge-tokens');
SELECT id, expired FROM tokens ORDER BY id;

-- 6. A move into an archive whose identity column is GENERATED ALWAYS (made LIKE the
-- target INCLUDING ALL): every row archived with its own id, and put back with it by the
-- revert. An archive that already holds an approved key under a unique index stops the
-- chunk with 23505, rolled back whole: nothing moved twice, nothing lost.
CREATE TABLE events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL,
    at timestamptz NOT NULL);
INSERT INTO events (kind, at)
SELECT 'kind ' || g, timestamptz '2026-01-01 00:00+00' + g * interval '1 hour' FROM generate_series(1, 6) g;
CREATE TABLE events_before AS SELECT * FROM events;
CREATE TABLE events_archive (LIKE events INCLUDING ALL);
SELECT attname, attidentity FROM pg_attribute WHERE attrelid = 'events_archive'::regclass AND attname = 'id';
SELECT * FROM etc_batch.register_job_from_query('archive-events', NULL, 'events',
    $$SELECT id FROM events WHERE id <= 4$$, 2, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'events_archive');
CALL etc_batch.drain_job('archive-events');
SELECT id, kind FROM events_archive ORDER BY id;
SELECT * FROM etc_batch.register_revert('archive-events', 'archive-events-back');
CALL etc_batch.drain_job('archive-events-back');
SELECT count(*) AS back_as_they_were FROM events e JOIN events_before b USING (id)
 WHERE (e.*) IS NOT DISTINCT FROM (b.*);
SELECT count(*) AS still_archived FROM events_archive;
-- the archive holds key 6 already
INSERT INTO events_archive (id, kind, at) OVERRIDING SYSTEM VALUE VALUES (6, 'kept by hand', now());
SELECT * FROM etc_batch.register_job_from_query('archive-late-events', NULL, 'events',
    $$SELECT id FROM events WHERE id > 4$$, 2, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'events_archive');
\set VERBOSITY terse
CALL etc_batch.drain_job('archive-late-events');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT status, next_index FROM etc_batch.job WHERE job_id = 'archive-late-events';
SELECT id, kind FROM events WHERE id > 4 ORDER BY id;
SELECT id, kind FROM events_archive ORDER BY id;
-- an archive made LIKE a target with a generated column: refused, saying how to make it
CREATE TABLE parcels (id int PRIMARY KEY, grams int NOT NULL, kilos numeric GENERATED ALWAYS AS (grams / 1000.0) STORED);
CREATE TABLE parcels_archive (LIKE parcels INCLUDING ALL);
INSERT INTO parcels VALUES (1, 1500), (2, 250);
SELECT * FROM etc_batch.register_job('archive-parcels', NULL, 'parcels', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'parcels_archive');
\echo :LAST_ERROR_SQLSTATE
-- made as the hint says, it takes the generated value as a plain one
DROP TABLE parcels_archive;
CREATE TABLE parcels_archive (LIKE parcels INCLUDING ALL EXCLUDING GENERATED);
SELECT * FROM etc_batch.register_job('archive-parcels', NULL, 'parcels', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'parcels_archive');
CALL etc_batch.drain_job('archive-parcels');
SELECT id, grams, kilos FROM parcels_archive;
