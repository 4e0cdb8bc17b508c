-- Jobs on the tables DBAs have: no tenant, no revision column, keys of one or more
-- columns of any btree type, partitioned tables; what the approval says about drifted
-- items; the rest approved again; a dropped target; a failed drain; and every refusal
-- at registration. docs/jobs.md quotes this file's output.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never
SET TimeZone = 'UTC';

-- 1. A table with a primary key and nothing else: no tenant, no revision column.
-- The key is the primary key; a row is recognised as unchanged by a digest of all of
-- it, taken at registration.
CREATE TABLE accounts (
    id     bigint PRIMARY KEY,
    plan   text NOT NULL,
    note   text);
INSERT INTO accounts SELECT g, 'basic', NULL FROM generate_series(1, 6) g;
SELECT * FROM etc_batch.register_job('move-plans', NULL, 'accounts',
    (SELECT jsonb_agg(jsonb_build_object('id', id)) FROM accounts), 2,
    '{"plan": "standard"}', tenant_column => NULL, revision_column => NULL);
SELECT key_columns, tenant_column, revision_column, guard, on_drift
  FROM etc_batch.job WHERE job_id = 'move-plans';
CALL etc_batch.drain_job('move-plans', 1);
-- the application writes a note on account 4, in the next chunk: the row is no longer
-- the one approved, and the job stops for a person to decide
UPDATE accounts SET note = 'called support' WHERE id = 4;
CALL etc_batch.drain_job('move-plans');
\echo :LAST_ERROR_SQLSTATE
SELECT id, plan, note FROM accounts ORDER BY id;
SELECT position, item_key, outcome, guarded_by FROM etc_batch.job_audit_items
 WHERE job_id = 'move-plans' ORDER BY position;

-- The rest approved again in one call, the drifted item at its state now; the job ends,
-- continued as the new one.
SELECT * FROM etc_batch.register_remainder('move-plans', 'move-plans-2', include_drifted => true);
SELECT job_id, status, continued_as, status_reason FROM etc_batch.job
 WHERE job_id LIKE 'move-plans%' ORDER BY job_id;
SELECT job_id, status, committed, approved, continued_as FROM etc_batch.job_progress
 WHERE job_id LIKE 'move-plans%' ORDER BY job_id;
CALL etc_batch.drain_job('move-plans-2');
SELECT id, plan, note FROM accounts ORDER BY id;
-- a job continued elsewhere drains no more, and is not continued twice
CALL etc_batch.drain_job('move-plans');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_remainder('move-plans', 'move-plans-3');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.abort_job('move-plans', 'done with it');
\echo :LAST_ERROR_SQLSTATE

-- A digest hashes each column by its type's own hash function: an update that leaves
-- every value equal (a numeric's scale, a timestamptz written in another time zone) is
-- no change; a column whose type has none (json) is hashed by its text.
CREATE TABLE prices (
    sku    text PRIMARY KEY,
    price  numeric NOT NULL,
    valid  timestamptz NOT NULL,
    specs  json,
    state  text NOT NULL DEFAULT 'draft');
INSERT INTO prices VALUES ('A', 1.5, '2026-01-01 00:00+00', '{"w": 1}'),
    ('B', 2.5, '2026-01-01 00:00+00', '{"w": 2}'), ('C', 3.5, '2026-01-01 00:00+00', '{"w": 3}');
SELECT * FROM etc_batch.register_job_from_query('publish', NULL, 'prices', $$SELECT sku FROM prices$$,
    1, '{"state": "live"}', tenant_column => NULL, revision_column => NULL, on_drift => 'skip');
UPDATE prices SET price = 1.50, valid = '2026-01-01 01:00+01' WHERE sku = 'A';   -- equal values
UPDATE prices SET specs = '{"w":  2}' WHERE sku = 'B';                            -- other json text
CALL etc_batch.drain_job('publish');
SELECT sku, price, state FROM prices ORDER BY sku;

-- 2. Only the columns the approval names guard the rows: a change to another column
-- is not drift. The items name the guard columns with the values approved.
CREATE TABLE tickets (
    id       int PRIMARY KEY,
    status   text NOT NULL,
    priority int NOT NULL,
    seen_at  timestamptz);
INSERT INTO tickets SELECT g, 'open', g % 3 FROM generate_series(1, 6) g;
SELECT * FROM etc_batch.register_job('close-tickets', NULL, 'tickets',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'priority', priority)) FROM tickets), 3,
    '{"status": "closed"}', '{"status": "open"}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns');
UPDATE tickets SET seen_at = '2026-12-01 10:00+00' WHERE id = 2;   -- not guarded
UPDATE tickets SET priority = 9 WHERE id = 5;                      -- guarded
CALL etc_batch.drain_job('close-tickets');
\echo :LAST_ERROR_SQLSTATE
SELECT id, status, priority FROM tickets ORDER BY id;
SELECT * FROM etc_batch.job_summary('close-tickets');

-- 3. on_drift => 'skip': a drifted or missing item is left unchanged, recorded as
-- skipped with the row found, and the job goes on.
CREATE TABLE invoices (
    id     int PRIMARY KEY,
    amount numeric(10,2) NOT NULL,
    state  text NOT NULL DEFAULT 'draft');
INSERT INTO invoices SELECT g, g * 10, 'draft' FROM generate_series(1, 8) g;
SELECT * FROM etc_batch.register_job('send-invoices', NULL, 'invoices',
    (SELECT jsonb_agg(jsonb_build_object('id', id)) FROM invoices), 3,
    '{"state": "sent"}', tenant_column => NULL, revision_column => NULL, on_drift => 'skip');
UPDATE invoices SET amount = 55.50 WHERE id = 5;
DELETE FROM invoices WHERE id = 7;
CALL etc_batch.drain_job('send-invoices');
SELECT id, amount, state FROM invoices ORDER BY id;
SELECT status, approved, committed, matching, skipped FROM etc_batch.job_summary('send-invoices');
SELECT position, item_key, state FROM etc_batch.job_report('send-invoices') WHERE state <> 'matching';
SELECT position, item_key, outcome, found FROM etc_batch.job_audit_items
 WHERE job_id = 'send-invoices' AND outcome = 'skipped' ORDER BY position;
-- on_drift is part of the approval
SELECT * FROM etc_batch.register_job('send-invoices', NULL, 'invoices',
    (SELECT jsonb_agg(jsonb_build_object('id', g)) FROM generate_series(1, 8) g), 3,
    '{"state": "sent"}', tenant_column => NULL, revision_column => NULL, on_drift => 'stop');
\echo :LAST_ERROR_SQLSTATE

-- 4. Keys of one column of the common types, a domain among them, each frozen in the
-- key's order (text in byte order), drained in order and in parallel.
CREATE DOMAIN sku AS text CHECK (VALUE <> '');
CREATE TABLE by_numeric     (k numeric PRIMARY KEY, st text DEFAULT 'new');
CREATE TABLE by_date        (k date PRIMARY KEY, st text DEFAULT 'new');
CREATE TABLE by_timestamptz (k timestamptz PRIMARY KEY, st text DEFAULT 'new');
CREATE TABLE by_uuid        (k uuid PRIMARY KEY, st text DEFAULT 'new');
CREATE TABLE by_text        (k text PRIMARY KEY, st text DEFAULT 'new');
CREATE TABLE by_varchar     (k varchar(12) PRIMARY KEY, st text DEFAULT 'new');
CREATE TABLE by_domain      (k sku PRIMARY KEY, st text DEFAULT 'new');
INSERT INTO by_numeric (k) VALUES (10.5), (-2), (3), (1e6), (0.001);
INSERT INTO by_date (k) VALUES ('2026-03-01'), ('2025-12-31'), ('2026-01-15'), ('1999-01-01'), ('2030-06-30');
INSERT INTO by_timestamptz (k) VALUES ('2026-03-01 00:00+00'), ('2026-03-01 00:00+01'),
    ('2026-01-01 12:30:00.5+00'), ('2025-01-01 00:00+00'), ('2026-03-01 00:00:00.000001+00');
INSERT INTO by_uuid (k) VALUES ('00000000-0000-0000-0000-000000000002'), ('ffffffff-0000-0000-0000-000000000000'),
    ('00000000-0000-0000-0000-000000000010'), ('80000000-0000-0000-0000-000000000000'),
    ('00000000-0000-0000-0000-000000000001');
INSERT INTO by_text (k) VALUES ('b'), ('B'), ('a b'), ('ä'), ('10');
INSERT INTO by_varchar (k) VALUES ('b'), ('B'), ('a b'), ('ä'), ('10');
INSERT INTO by_domain (k) VALUES ('X-2'), ('A-10'), ('A-9'), ('Z'), ('Ä');
SELECT t AS target, r.items, r.chunks
  FROM unnest(ARRAY['by_numeric', 'by_date', 'by_timestamptz', 'by_uuid', 'by_text',
                    'by_varchar', 'by_domain']) t,
       LATERAL etc_batch.register_job_from_query('keys ' || t, NULL, t::regclass,
           format('SELECT k FROM %I', t), 2, '{"st": "done"}',
           tenant_column => NULL, revision_column => NULL,
           parallel => t IN ('by_date', 'by_uuid', 'by_domain')) r;
SELECT job_id, parallel, array_agg(item_key ORDER BY position) AS frozen_in_key_order
  FROM etc_batch.job_item JOIN etc_batch.job USING (job_id)
 WHERE job_id LIKE 'keys %' GROUP BY job_id, parallel ORDER BY job_id;
CALL etc_batch.drain_job('keys by_numeric');
CALL etc_batch.drain_job('keys by_date');
CALL etc_batch.drain_job('keys by_timestamptz');
CALL etc_batch.drain_job('keys by_uuid');
CALL etc_batch.drain_job('keys by_text');
CALL etc_batch.drain_job('keys by_varchar');
CALL etc_batch.drain_job('keys by_domain');
SELECT (SELECT count(*) FILTER (WHERE st = 'done') FROM by_numeric) AS numeric,
       (SELECT count(*) FILTER (WHERE st = 'done') FROM by_date) AS date,
       (SELECT count(*) FILTER (WHERE st = 'done') FROM by_timestamptz) AS timestamptz,
       (SELECT count(*) FILTER (WHERE st = 'done') FROM by_uuid) AS uuid,
       (SELECT count(*) FILTER (WHERE st = 'done') FROM by_text) AS text,
       (SELECT count(*) FILTER (WHERE st = 'done') FROM by_varchar) AS varchar,
       (SELECT count(*) FILTER (WHERE st = 'done') FROM by_domain) AS domain;
SELECT job_id, status FROM etc_batch.job WHERE job_id LIKE 'keys %' ORDER BY job_id;

-- 5. A composite key: the primary key's columns, in the index's order; an item's key
-- is a JSON array of them.
CREATE TABLE order_lines (
    order_id  int,
    line_no   smallint,
    sku       text NOT NULL,
    qty       int NOT NULL,
    PRIMARY KEY (order_id, line_no));
INSERT INTO order_lines SELECT o, l, 'S' || o || l, 1 FROM generate_series(1, 3) o, generate_series(1, 3) l;
SELECT * FROM etc_batch.register_job('restock', NULL, 'order_lines',
    '[{"line_no": 2, "order_id": 3}, {"order_id": 1, "line_no": 3}, {"order_id": 1, "line_no": 1},
      {"order_id": 2, "line_no": 2}]', 2,
    '{"qty": 0}', tenant_column => NULL, revision_column => NULL);
SELECT position, item_key FROM etc_batch.job_item WHERE job_id = 'restock' ORDER BY position;
CALL etc_batch.drain_job('restock');
SELECT order_id, line_no, qty FROM order_lines WHERE qty = 0 ORDER BY 1, 2;
-- a unique index names the key as well as the primary key does
CREATE TABLE parcels (id int PRIMARY KEY, carrier text, tracking text, state text,
                      UNIQUE (carrier, tracking));
INSERT INTO parcels VALUES (1, 'ups', 'Z9', 'new'), (2, 'dhl', 'Z9', 'new'), (3, 'ups', 'A1', 'new');
SELECT * FROM etc_batch.register_job('track', NULL, 'parcels',
    '[{"carrier": "ups", "tracking": "Z9"}, {"carrier": "ups", "tracking": "A1"}]', 5,
    '{"state": "sent"}', key_columns => ARRAY['carrier', 'tracking'],
    tenant_column => NULL, revision_column => NULL);
CALL etc_batch.drain_job('track');
SELECT id, carrier, tracking, state FROM parcels ORDER BY id;

-- 6. A tenant and a composite key, with a revision column: the tenant scopes the job,
-- the rest of the primary key is its key.
CREATE TABLE shipments (
    tenant   text,
    depot    int,
    seq      bigint,
    revision int NOT NULL DEFAULT 1,
    state    text NOT NULL DEFAULT 'held',
    PRIMARY KEY (tenant, depot, seq));
INSERT INTO shipments (tenant, depot, seq) SELECT t, d, s FROM unnest(ARRAY['acme', 'globex']) t,
    generate_series(1, 2) d, generate_series(1, 3) s;
SELECT * FROM etc_batch.register_job('release', 'acme', 'shipments',
    (SELECT jsonb_agg(jsonb_build_object('depot', depot, 'seq', seq, 'revision', revision))
       FROM shipments WHERE tenant = 'acme' AND seq <> 2), 3, '{"state": "released"}');
SELECT key_columns, tenant_column, revision_column, guard FROM etc_batch.job WHERE job_id = 'release';
CALL etc_batch.drain_job('release');
SELECT tenant, depot, seq, revision, state FROM shipments WHERE state = 'released' OR tenant = 'globex' AND revision > 1 ORDER BY 1, 2, 3;

-- 7. A partitioned table: a job on the parent, whose key includes the partition key
-- as PostgreSQL requires; items in three partitions, drained in parallel chunks, each
-- chunk's change one statement.
CREATE TABLE events (
    at    timestamptz,
    id    bigint,
    kind  text NOT NULL,
    state text NOT NULL DEFAULT 'new',
    PRIMARY KEY (at, id)) PARTITION BY RANGE (at);
CREATE TABLE events_2026_01 PARTITION OF events FOR VALUES FROM ('2026-01-01 00:00+00') TO ('2026-02-01 00:00+00');
CREATE TABLE events_2026_02 PARTITION OF events FOR VALUES FROM ('2026-02-01 00:00+00') TO ('2026-03-01 00:00+00');
CREATE TABLE events_2026_03 PARTITION OF events FOR VALUES FROM ('2026-03-01 00:00+00') TO ('2026-04-01 00:00+00');
INSERT INTO events (at, id, kind)
SELECT timestamptz '2026-01-01 00:00+00' + g * interval '1 day', g, 'click' FROM generate_series(1, 80) g;
SELECT * FROM etc_batch.register_job_from_query('archive', NULL, 'events',
    $$SELECT at, id FROM events WHERE id % 4 = 0$$, 4, '{"state": "archived"}',
    tenant_column => NULL, revision_column => NULL, parallel => true);
CALL etc_batch.drain_job('archive', 2);
CALL etc_batch.drain_job('archive');
SELECT tableoid::regclass AS partition, count(*) FILTER (WHERE state = 'archived') AS archived, count(*)
  FROM events GROUP BY 1 ORDER BY 1;
SELECT check_name, ok FROM etc_batch.verify_job('archive');

-- 8. A target dropped under a job: every function of the job names it.
CREATE TABLE leads (id int PRIMARY KEY, owner text);
INSERT INTO leads SELECT g, 'nobody' FROM generate_series(1, 4) g;
SELECT * FROM etc_batch.register_job('assign', NULL, 'leads', '[{"id": 1}, {"id": 2}, {"id": 3}]', 1,
    '{"owner": "ann"}', tenant_column => NULL, revision_column => NULL);
CALL etc_batch.drain_job('assign', 1);
DROP TABLE leads;
CALL etc_batch.drain_job('assign');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.job_summary('assign');
SELECT * FROM etc_batch.job_report('assign');
-- made again under the same name, it is another table: still refused
CREATE TABLE leads (id int PRIMARY KEY, owner text);
INSERT INTO leads SELECT g, 'nobody' FROM generate_series(1, 4) g;
CALL etc_batch.drain_job('assign');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS changed FROM leads WHERE owner <> 'nobody';
SELECT check_name, status, detail, hint FROM etc_batch.doctor() WHERE check_name = 'job assign';

-- 9. A drain that fails for another reason than a conflict (here a CHECK constraint over
-- two columns, which registration cannot judge from the value alone): rolled back, the
-- job still pending, the failure kept where job_summary, job_progress and the doctor
-- show it.
CREATE TABLE stock (id int PRIMARY KEY, qty int NOT NULL, reserved int NOT NULL,
                    CONSTRAINT stock_qty_check CHECK (qty >= reserved));
INSERT INTO stock SELECT g, g, 1 FROM generate_series(1, 5) g;
SELECT * FROM etc_batch.register_job_from_query('write-off', NULL, 'stock',
    $$SELECT id FROM stock$$, 2, '{"qty": 0}', tenant_column => NULL, revision_column => NULL);
CALL etc_batch.drain_job('write-off');
\echo :LAST_ERROR_SQLSTATE
SELECT status, committed, failure_sqlstate, failure_message, failed_at IS NOT NULL AS failed
  FROM etc_batch.job_summary('write-off');
SELECT job_id, status, failure_sqlstate, failure_chunk FROM etc_batch.job_progress WHERE job_id = 'write-off';
SELECT check_name, status, regexp_replace(detail, 'failed at .* in chunk', 'failed at ... in chunk') AS detail, hint
  FROM etc_batch.doctor() WHERE check_name = 'job write-off';

-- 10. Refused at registration, with nothing stored.
CREATE TABLE people (
    id        int PRIMARY KEY,
    email     text,
    email_lc  text GENERATED ALWAYS AS (lower(email)) STORED,
    team      text,
    secret    text);
INSERT INTO people (id, email, team) SELECT g, 'P' || g || '@x', 't' FROM generate_series(1, 3) g;
-- a generated column cannot be set
SELECT * FROM etc_batch.register_job('r1', NULL, 'people', '[{"id": 1}]', 1, '{"email_lc": "x"}',
    tenant_column => NULL, revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE
-- a key no unique index makes unique
SELECT * FROM etc_batch.register_job('r2', NULL, 'people', '[{"team": "t"}]', 1, '{"secret": "x"}',
    key_column => 'team', tenant_column => NULL, revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE
-- a job id longer than 200 bytes
SELECT * FROM etc_batch.register_job(repeat('j', 201), NULL, 'people', '[{"id": 1}]', 1, '{"team": "u"}',
    tenant_column => NULL, revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE
-- a guard or an on_drift nobody knows
SELECT * FROM etc_batch.register_job('r3', NULL, 'people', '[{"id": 1}]', 1, '{"team": "u"}',
    tenant_column => NULL, revision_column => NULL, guard => 'checksum');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('r4', NULL, 'people', '[{"id": 1}]', 1, '{"team": "u"}',
    tenant_column => NULL, revision_column => NULL, on_drift => 'ignore');
\echo :LAST_ERROR_SQLSTATE
-- a tenant with no tenant column to find it in
SELECT * FROM etc_batch.register_job('r5', 'acme', 'people', '[{"id": 1}]', 1, '{"team": "u"}',
    tenant_column => NULL, revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE
-- a guard by revision without a revision column
SELECT * FROM etc_batch.register_job('r6', NULL, 'people', '[{"id": 1}]', 1, '{"team": "u"}',
    tenant_column => NULL, revision_column => NULL, guard => 'revision');
\echo :LAST_ERROR_SQLSTATE
-- a column the registering role may not update
CREATE ROLE regress_etc_batch_clerk;
GRANT USAGE ON SCHEMA etc_batch TO regress_etc_batch_clerk;
GRANT EXECUTE ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb,
    name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO regress_etc_batch_clerk;
GRANT SELECT, UPDATE (team) ON people TO regress_etc_batch_clerk;
SET ROLE regress_etc_batch_clerk;
SELECT * FROM etc_batch.register_job('r7', NULL, 'people', '[{"id": 1}]', 1, '{"secret": "x"}',
    tenant_column => NULL, revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE
-- what it may update, it may: and it sees its own job, no grant needed
SELECT * FROM etc_batch.register_job('r8', NULL, 'people', '[{"id": 1}]', 1, '{"team": "u"}',
    tenant_column => NULL, revision_column => NULL);
SELECT status, approved, unprocessed FROM etc_batch.job_summary('r8');
SELECT job_id, status, approved FROM etc_batch.job_progress;
-- and no one else's
SELECT * FROM etc_batch.job_summary('assign');
RESET ROLE;
SELECT job_id FROM etc_batch.job WHERE job_id ~ '^r[0-9]$' OR length(job_id) > 200 ORDER BY 1;
SELECT id, email, email_lc, team, secret FROM people ORDER BY id;
DROP OWNED BY regress_etc_batch_clerk;
DROP ROLE regress_etc_batch_clerk;
