-- Jobs that delete their rows (action 'delete') or move them to an archive table
-- (action 'move'): each chunk one guarded statement, a drifted row never deleted, every
-- deleted row kept whole with its chunk's audit unless keep_deleted => false.
CREATE EXTENSION etc_batch;

-- 1. A purge of old sessions, on a table with a uuid key and no revision column, the
-- items from a query, guarded by a digest of each row. The application touches one
-- session after the approval: it is skipped, not deleted.
CREATE TABLE sessions (
    id         uuid PRIMARY KEY,
    user_name  text NOT NULL,
    last_seen  timestamptz NOT NULL,
    payload    bytea);
INSERT INTO sessions
SELECT ('00000000-0000-0000-0000-0000000000' || lpad(g::text, 2, '0'))::uuid, 'user ' || g,
       timestamptz '2026-01-01 00:00+00' + g * interval '1 day', decode(lpad(to_hex(g), 4, '0'), 'hex')
  FROM generate_series(1, 12) g;
SELECT * FROM etc_batch.register_job_from_query('purge-sessions', NULL, 'sessions',
    $$SELECT id FROM sessions WHERE last_seen < '2026-01-10'$$, 4, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete', on_drift => 'skip');
UPDATE sessions SET last_seen = now() WHERE id = '00000000-0000-0000-0000-000000000006';
CALL etc_batch.drain_job('purge-sessions');
SELECT id, user_name FROM sessions WHERE last_seen < '2026-01-10' OR user_name = 'user 6' ORDER BY id;
SELECT count(*) AS left_in_table FROM sessions;
-- every deleted row is reported as the job left it, the drifted one as skipped
SELECT position, item_key, state FROM etc_batch.job_report('purge-sessions') ORDER BY position;
SELECT status, approved, committed, matching, drifted, missing, skipped
  FROM etc_batch.job_summary('purge-sessions');
SELECT check_name, ok, detail FROM etc_batch.verify_job('purge-sessions') ORDER BY check_name;
-- the rows deleted, whole, in their row type's text form, with each chunk's audit
SELECT a.chunk, a.first_position, k.kept
  FROM etc_batch.job_audit_chunk a, unnest(a.kept) WITH ORDINALITY AS k(kept, n)
 WHERE a.job_id = 'purge-sessions' ORDER BY a.first_position, k.n;
-- read back as rows of the table, every column as it was
SELECT (k::sessions).* FROM etc_batch.job_audit_chunk a, unnest(a.kept) AS k
 WHERE a.job_id = 'purge-sessions' AND k IS NOT NULL ORDER BY 1;

-- 2. Orders moved to an archive, on a table partitioned by month with a composite key
-- and a revision column; the archive has the same columns and one of its own. The
-- application cancels one order and deletes another while the job runs: both skipped.
CREATE TABLE orders (
    region   text NOT NULL,
    id       int NOT NULL,
    placed   date NOT NULL,
    revision int NOT NULL DEFAULT 1,
    total    numeric(10, 2) NOT NULL,
    status   text NOT NULL DEFAULT 'delivered',
    PRIMARY KEY (region, id, placed)) PARTITION BY RANGE (placed);
CREATE TABLE orders_2026_01 PARTITION OF orders FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE orders_2026_02 PARTITION OF orders FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
INSERT INTO orders (region, id, placed, total)
SELECT r, g, date '2026-01-01' + (g * 5), g * 10.5
  FROM unnest(ARRAY['eu', 'us']) r, generate_series(1, 8) g;
CREATE TABLE orders_archive (
    region      text NOT NULL,
    id          int NOT NULL,
    placed      date NOT NULL,
    revision    bigint NOT NULL,
    total       numeric NOT NULL,
    status      text NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now());
SELECT * FROM etc_batch.register_job_from_query('archive-january', NULL, 'orders',
    $$SELECT region, id, placed, revision FROM orders WHERE placed < '2026-02-01'$$, 3,
    NULL, '{"status": "delivered"}', tenant_column => NULL,
    action => 'move', archive => 'orders_archive', on_drift => 'skip');
CALL etc_batch.drain_job('archive-january', 1);
UPDATE orders SET status = 'disputed', revision = revision + 1 WHERE region = 'us' AND id = 2;
DELETE FROM orders WHERE region = 'us' AND id = 4;
CALL etc_batch.drain_job('archive-january');
SELECT region, id, placed, revision, total, status FROM orders_archive ORDER BY region, id;
SELECT region, id, placed, status FROM orders WHERE placed < '2026-02-01' ORDER BY region, id;
SELECT position, item_key, state FROM etc_batch.job_report('archive-january') ORDER BY position;
SELECT count(*) FILTER (WHERE NOT ok) AS failed_checks FROM etc_batch.verify_job('archive-january');

-- 3. A purge that must not keep what it deleted: keep_deleted => false. Its audit keeps
-- no row.
CREATE TABLE consents (id int PRIMARY KEY, email text NOT NULL, withdrawn boolean NOT NULL DEFAULT false);
INSERT INTO consents SELECT g, 'person' || g || '@example.org', g % 2 = 0 FROM generate_series(1, 6) g;
SELECT * FROM etc_batch.register_job_from_query('forget', NULL, 'consents',
    'SELECT id FROM consents WHERE withdrawn', 10, NULL, '{"withdrawn": true}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns',
    action => 'delete', keep_deleted => false);
CALL etc_batch.drain_job('forget');
SELECT id, withdrawn FROM consents ORDER BY id;
SELECT kept FROM etc_batch.job_audit_chunk WHERE job_id = 'forget';
SELECT action, archive, keep_deleted FROM etc_batch.job WHERE job_id IN ('purge-sessions', 'archive-january', 'forget') ORDER BY job_id;

-- 3b. A purge that stops at a drifted row (on_drift 'stop'), continued by
-- register_remainder: the rest approved again with the same action, the drifted row
-- left out and named.
INSERT INTO consents SELECT g, 'late' || g || '@example.org', true FROM generate_series(11, 16) g;
SELECT * FROM etc_batch.register_job_from_query('forget-late', NULL, 'consents',
    'SELECT id FROM consents WHERE id > 10', 2, NULL, '{"withdrawn": true}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns', action => 'delete');
UPDATE consents SET withdrawn = false WHERE id = 13;
CALL etc_batch.drain_job('forget-late');
SELECT * FROM etc_batch.register_remainder('forget-late', 'forget-late-2');
SELECT action, keep_deleted FROM etc_batch.job WHERE job_id = 'forget-late-2';
SELECT position, item_key, state FROM etc_batch.job_left_out WHERE job_id = 'forget-late-2';
CALL etc_batch.drain_job('forget-late-2');
SELECT id, withdrawn FROM consents WHERE id > 10 ORDER BY id;

-- 4. What the kind of change is is part of the approval: the same job id with another
-- is refused.
SELECT * FROM etc_batch.register_job_from_query('forget', NULL, 'consents',
    'SELECT id FROM consents WHERE withdrawn', 10, NULL, '{"withdrawn": true}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns',
    action => 'delete');
\echo :LAST_ERROR_SQLSTATE

-- 5. Refused, nothing stored.
-- a move without its archive, an archive without a move, an unknown action
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete', archive => 'orders_archive');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'truncate');
\echo :LAST_ERROR_SQLSTATE
-- values to set, or a handler, on a job that deletes; keep_deleted on an update
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, '{"withdrawn": true}',
    tenant_column => NULL, revision_column => NULL, action => 'delete');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, '{"withdrawn": true}',
    tenant_column => NULL, revision_column => NULL, keep_deleted => false);
\echo :LAST_ERROR_SQLSTATE
-- an archive without a column of the target, with a column of another type, with a
-- generated column, or the target itself
CREATE TABLE consents_short (id int, email text);
CREATE TABLE consents_typed (id int, email text, withdrawn point);
CREATE TABLE consents_generated (id int, email text, withdrawn boolean GENERATED ALWAYS AS (true) STORED);
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'consents_short');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'consents_typed');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'consents_generated');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'consents');
\echo :LAST_ERROR_SQLSTATE
-- a role that may not DELETE from the target, or not INSERT into the archive
CREATE ROLE regress_purge_clerk;
GRANT USAGE ON SCHEMA etc_batch TO regress_purge_clerk;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA etc_batch TO regress_purge_clerk;
GRANT SELECT, UPDATE ON consents TO regress_purge_clerk;
CREATE TABLE consents_archive (LIKE consents);
SET ROLE regress_purge_clerk;
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT DELETE ON consents TO regress_purge_clerk;
SET ROLE regress_purge_clerk;
SELECT * FROM etc_batch.register_job('bad', NULL, 'consents', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'move', archive => 'consents_archive');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS stored FROM etc_batch.job WHERE job_id = 'bad';
DROP OWNED BY regress_purge_clerk;
DROP ROLE regress_purge_clerk;

-- 6. A purge is reverted by putting back the rows it kept (tests/pg_regress/sql/restore.sql
-- shows more).
SELECT * FROM etc_batch.register_revert('purge-sessions', 'unpurge');
CALL etc_batch.drain_job('unpurge');
SELECT count(*) AS sessions_back FROM sessions;
-- A purge that kept no rows (keep_deleted => false) can never be reverted: refused,
-- saying why, by register_revert and revert_preview alike.
SELECT * FROM etc_batch.register_revert('forget', 'unforget');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.revert_preview('forget');
\echo :LAST_ERROR_SQLSTATE
