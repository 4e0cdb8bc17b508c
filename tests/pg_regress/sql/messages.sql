-- Messages that say what happened: a handler's refusal, a default the caller never
-- wrote, where a misspelled column was named, a bad key or uuid in a jsonb list, a
-- failing items query (its own SQLSTATE, and where it ran), a null for a NOT NULL
-- column, and how an audit row was guarded. docs/jobs.md quotes this file's output.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never
SET TimeZone = 'UTC';

CREATE TABLE orders (
    tenant   text    NOT NULL,
    id       integer PRIMARY KEY,
    revision bigint  NOT NULL DEFAULT 1,
    status   text    NOT NULL DEFAULT 'pending',
    qty      integer NOT NULL DEFAULT 1);
INSERT INTO orders (tenant, id) SELECT 'alien-fest', g FROM generate_series(1, 4) g;

-- A handler that refuses an item (returns NULL) though its row is as approved: the
-- conflict says the handler refused it, not that the row changed.
CREATE FUNCTION cancel_unless_three(item jsonb) RETURNS jsonb LANGUAGE sql AS $$
    UPDATE orders SET status = 'cancelled', revision = revision + 1
     WHERE id = (item->>'id')::int AND revision = (item->>'revision')::bigint
       AND id <> 3
    RETURNING to_jsonb(orders.*) $$;
SELECT * FROM etc_batch.register_job('refused', 'alien-fest', 'orders',
    '[{"id": 1, "revision": 1}, {"id": 2, "revision": 1}, {"id": 3, "revision": 1}]', 2,
    NULL, handler => 'cancel_unless_three(jsonb)');
CALL etc_batch.drain_job('refused');
\echo :LAST_ERROR_SQLSTATE
SELECT status_reason FROM etc_batch.job WHERE job_id = 'refused';

-- Defaults named as defaults: a table with no revision column, registered without
-- revision_column; a table keyed by a unique index, registered without a key.
CREATE TABLE plans (code text NOT NULL UNIQUE, plan text NOT NULL);
INSERT INTO plans VALUES ('a', 'basic'), ('b', 'basic');
SELECT * FROM etc_batch.register_job('no-revision', NULL, 'plans',
    '[{"code": "a"}]', 1, '{"plan": "gold"}', key_column => 'code', tenant_column => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('no-key', NULL, 'plans',
    '[{"code": "a"}]', 1, '{"plan": "gold"}', tenant_column => NULL, revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('no-tenant-column', 'alien-fest', 'plans',
    '[{"code": "a"}]', 1, '{"plan": "gold"}', key_column => 'code', revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE

-- A misspelled column says where it was named.
SELECT * FROM etc_batch.register_job('typo-set', 'alien-fest', 'orders',
    '[{"id": 1, "revision": 1}]', 1, '{"stauts": "cancelled"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('typo-expect', 'alien-fest', 'orders',
    '[{"id": 1, "revision": 1}]', 1, '{"status": "cancelled"}', '{"stauts": "pending"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('typo-guard', 'alien-fest', 'orders',
    '[{"id": 1, "revision": 1, "stauts": "pending"}]', 1, '{"status": "cancelled"}');
\echo :LAST_ERROR_SQLSTATE

-- A key that is not a valid value of its column's type: PostgreSQL's error, with which
-- item and which key column.
CREATE TABLE visits (day date, room text, guests integer NOT NULL, PRIMARY KEY (day, room));
INSERT INTO visits VALUES ('2026-05-01', 'A', 1), ('2026-05-02', 'B', 2);
SELECT * FROM etc_batch.register_job('bad-day', NULL, 'visits',
    '[{"day": "2026-05-01", "room": "A"}, {"day": "2026-05-02", "room": "B"}, {"day": "not-a-day", "room": "C"}]',
    1, '{"guests": 0}', tenant_column => NULL, revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE tickets (id uuid PRIMARY KEY, state text NOT NULL);
SELECT * FROM etc_batch.register_job('bad-uuid', NULL, 'tickets',
    '[{"id": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd38"}]', 1, '{"state": "void"}',
    tenant_column => NULL, revision_column => NULL);
\echo :LAST_ERROR_SQLSTATE

-- An items query that fails keeps its SQLSTATE, and says it was the job's items query.
\set SHOW_CONTEXT errors
SELECT * FROM etc_batch.register_job_from_query('by-zero', 'alien-fest', 'orders',
    $$SELECT id, revision FROM orders WHERE qty / (id - 2) > 0$$, 2, '{"status": "cancelled"}');
\echo :LAST_ERROR_SQLSTATE
\set SHOW_CONTEXT never

-- A null for a NOT NULL column is refused at registration, not at every drain.
SELECT * FROM etc_batch.register_job('null-status', 'alien-fest', 'orders',
    '[{"id": 4, "revision": 1}]', 1, '{"status": null}');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM etc_batch.job WHERE job_id = 'null-status';
-- and so is a value a CHECK constraint on that column alone refuses
ALTER TABLE orders ADD CONSTRAINT qty_not_negative CHECK (qty >= 0);
SELECT * FROM etc_batch.register_job('negative-qty', 'alien-fest', 'orders',
    '[{"id": 4, "revision": 1}]', 1, '{"qty": -1}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('zero-qty', 'alien-fest', 'orders',
    '[{"id": 4, "revision": 1}]', 1, '{"qty": 0}');
SELECT etc_batch.abort_job('zero-qty', 'only a test of the check');

-- How an audit row was guarded.
SELECT * FROM etc_batch.register_job('guarded', 'alien-fest', 'orders',
    '[{"id": 4, "revision": 1}]', 1, '{"status": "cancelled"}');
CALL etc_batch.drain_job('guarded');
SELECT item_key, outcome, guarded_by FROM etc_batch.job_audit_items WHERE job_id = 'guarded';
