-- The SQL surface of checkpointed jobs: registration and its refusals, draining,
-- conflicts, reports, verification, tampering, handlers. Crashes and concurrency are in
-- tests/integration.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

CREATE TABLE orders (
    tenant   text,
    id       int,
    revision int NOT NULL DEFAULT 1,
    qty      int,
    status   text NOT NULL DEFAULT 'pending',
    PRIMARY KEY (tenant, id));
-- customer X has orders 3, 6, 9, ..., 36; customer Y has the same ids
INSERT INTO orders (tenant, id, qty) SELECT 'X', g * 3, g % 4 + 1 FROM generate_series(1, 12) g;
INSERT INTO orders (tenant, id, qty) SELECT 'Y', g * 3, 1 FROM generate_series(1, 12) g;

-- Registered in any order, the list is frozen in key order.
SELECT * FROM etc_batch.register_job('festival', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty) ORDER BY id DESC)
       FROM orders WHERE tenant = 'X'),
    5, '{"status": "cancelled"}', '{"status": "pending"}');
SELECT position, item_key, revision, guards FROM etc_batch.job_item WHERE job_id = 'festival' ORDER BY position;

-- The same request in another order: nothing changes, and the call says so.
SELECT * FROM etc_batch.register_job('festival', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('qty', qty, 'id', id, 'revision', revision) ORDER BY qty, id)
       FROM orders WHERE tenant = 'X'),
    5, '{"status": "cancelled"}', '{"status": "pending"}');

-- The same job id with something else: refused, naming what differs.
SELECT * FROM etc_batch.register_job('festival', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty + (id = 9)::int))
       FROM orders WHERE tenant = 'X'),
    5, '{"status": "cancelled"}', '{"status": "pending"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('festival', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty)) FROM orders WHERE tenant = 'X'),
    5, '{"status": "cancelled"}', '{"status": "pending"}');
SELECT * FROM etc_batch.register_job('festival', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty)) FROM orders WHERE tenant = 'X'),
    4, '{"status": "cancelled"}', '{"status": "pending"}');
SELECT * FROM etc_batch.register_job('festival', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty)) FROM orders WHERE tenant = 'X'),
    5, '{"status": "refunded"}', '{"status": "pending"}');
SELECT * FROM etc_batch.register_job('festival', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty)) FROM orders WHERE tenant = 'X' AND id > 3),
    5, '{"status": "cancelled"}', '{"status": "pending"}');

-- One chunk, then another operator changes the 8th item (id 24), in chunk 2.
CALL etc_batch.drain_job('festival', 1);
UPDATE orders SET qty = qty + 1, revision = revision + 1 WHERE tenant = 'X' AND id = 24;
CALL etc_batch.drain_job('festival', 2);
\echo :LAST_ERROR_SQLSTATE
-- chunk 1 stays, chunk 2 rolled back whole, the other customer untouched
SELECT tenant, id, revision, qty, status FROM orders WHERE tenant = 'X' ORDER BY id;
SELECT count(*) AS other_customer_changed FROM orders WHERE tenant = 'Y' AND (revision <> 1 OR status <> 'pending');
SELECT status, next_index, chunks_committed, status_reason, problem->'found'->>'revision' AS revision_found
  FROM etc_batch.job WHERE job_id = 'festival';
-- a conflict is never retried
CALL etc_batch.drain_job('festival');
\echo :LAST_ERROR_SQLSTATE

-- Reports: drifted and missing rows, one snapshot.
UPDATE orders SET status = 'shipped', revision = revision + 1 WHERE tenant = 'X' AND id = 6;
DELETE FROM orders WHERE tenant = 'X' AND id = 12;
-- a same-quantity row of another customer does not hide the missing one
SELECT * FROM etc_batch.job_report('festival');
SELECT * FROM etc_batch.job_summary('festival');
SELECT position, item_key, revision_before, revision_after, guards, chunk FROM etc_batch.job_audit_items ORDER BY position;

-- A second job for the remaining items, by a new approval.
SELECT * FROM etc_batch.register_job('festival-rest', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty))
       FROM orders WHERE tenant = 'X' AND status = 'pending'),
    5, '{"status": "cancelled"}', '{"status": "pending"}');
CALL etc_batch.drain_job('festival-rest');
-- finished: an empty result, not an error
CALL etc_batch.drain_job('festival-rest');
SELECT * FROM etc_batch.verify_job('festival-rest');
SELECT status, count(*) FROM orders WHERE tenant = 'X' GROUP BY status ORDER BY status;

-- Tampered progress is refused, nothing changed, and never repaired.
SELECT * FROM etc_batch.register_job('t-delete', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
CALL etc_batch.drain_job('t-delete', 1);
-- an item's revision forged inside its chunk's audit row
SELECT * FROM etc_batch.register_job('t-forge', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
CALL etc_batch.drain_job('t-forge', 1);
SELECT first_position, last_position, chunk, revisions_after FROM etc_batch.job_audit_chunk
 WHERE job_id = 't-forge';
UPDATE etc_batch.job_audit_chunk SET revisions_after[2] = revisions_after[2] + 1
 WHERE job_id = 't-forge' AND first_position = 0;
CALL etc_batch.drain_job('t-forge');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE snapshot AS SELECT * FROM orders;
-- a chunk's audit row removed
DELETE FROM etc_batch.job_audit_chunk WHERE job_id = 't-delete' AND first_position = 0;
CALL etc_batch.drain_job('t-delete');
\echo :LAST_ERROR_SQLSTATE
SELECT status FROM etc_batch.job WHERE job_id = 't-delete';
SELECT check_name, ok FROM etc_batch.verify_job('t-delete');

SELECT * FROM etc_batch.register_job('t-mid', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
UPDATE etc_batch.job SET next_index = 2 WHERE job_id = 't-mid';
CALL etc_batch.drain_job('t-mid');
\echo :LAST_ERROR_SQLSTATE

SELECT * FROM etc_batch.register_job('t-past', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
UPDATE etc_batch.job SET next_index = 16 WHERE job_id = 't-past';
CALL etc_batch.drain_job('t-past');
\echo :LAST_ERROR_SQLSTATE

-- a checkpoint moved onto another chunk boundary, over rows never audited: the seal
SELECT * FROM etc_batch.register_job('t-seal', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
UPDATE etc_batch.job SET next_index = 4 WHERE job_id = 't-seal';
CALL etc_batch.drain_job('t-seal');
\echo :LAST_ERROR_SQLSTATE

SELECT * FROM etc_batch.register_job('t-foreign', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
-- a chunk's audit row copied from another job
INSERT INTO etc_batch.job_audit_chunk
SELECT 't-foreign', first_position, last_position, chunk, txid, committed_at, revisions_after, skipped, found
  FROM etc_batch.job_audit_chunk WHERE job_id = 'festival-rest' AND first_position = 0;
CALL etc_batch.drain_job('t-foreign');
\echo :LAST_ERROR_SQLSTATE
-- the frozen list: an item's revision forged inside its chunk's row, a chunk's row
-- removed, and one copied from another job (an insertion, which no trigger counts:
-- verify_job finds it)
SELECT * FROM etc_batch.register_job('t-list-forge', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
UPDATE etc_batch.job_item_chunk SET revisions[1] = revisions[1] + 1
 WHERE job_id = 't-list-forge' AND first_position = 0;
CALL etc_batch.drain_job('t-list-forge');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('t-list-gone', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
DELETE FROM etc_batch.job_item_chunk WHERE job_id = 't-list-gone' AND first_position = 4;
CALL etc_batch.drain_job('t-list-gone');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('t-list-copy', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y'),
    4, '{"qty": 0}');
INSERT INTO etc_batch.job_item_chunk
SELECT 't-list-copy', 12, 12 + last_position - first_position, keys, revisions, guards
  FROM etc_batch.job_item_chunk WHERE job_id = 'festival-rest' AND first_position = 0;
SELECT check_name, ok, detail FROM etc_batch.verify_job('t-list-copy')
 WHERE check_name IN ('approved items', 'approval fingerprint');
SELECT status FROM etc_batch.job WHERE job_id = 't-list-copy';
SELECT count(*) AS rows_changed_by_tampered_jobs
  FROM orders o JOIN snapshot s USING (tenant, id)
 WHERE (o.revision, o.qty, o.status) IS DISTINCT FROM (s.revision, s.qty, s.status);

-- A job whose change is a handler.
CREATE FUNCTION ship(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    UPDATE orders SET status = 'shipped', revision = revision + 1
     WHERE tenant = item->>'tenant' AND id = (item->>'id')::int AND revision = (item->>'revision')::int
    RETURNING to_jsonb(orders.*) INTO r;
    RETURN r;
END $$;
CREATE TABLE parcels (tenant text, id int, revision int NOT NULL DEFAULT 1, status text DEFAULT 'new', PRIMARY KEY (tenant, id));
SELECT * FROM etc_batch.register_job('ship-y', 'Y', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE tenant = 'Y' AND id <= 9),
    2, NULL, handler => 'ship(jsonb)');
CALL etc_batch.drain_job('ship-y');
SELECT id, revision, status FROM orders WHERE tenant = 'Y' AND id <= 9 ORDER BY id;
SELECT position, item_key, revision_before, revision_after FROM etc_batch.job_audit_items WHERE job_id = 'ship-y' ORDER BY position;

-- abort_job stops a job for good.
SELECT * FROM etc_batch.register_job('to-abort', 'Y', 'orders', '[{"id": 30, "revision": 1}]', 1, '{"qty": 7}');
SELECT etc_batch.abort_job('to-abort', 'customer changed their mind');
CALL etc_batch.drain_job('to-abort');
\echo :LAST_ERROR_SQLSTATE
SELECT status, status_reason, problem->>'previous_status' AS was FROM etc_batch.job WHERE job_id = 'to-abort';
-- a job that is done has nothing left to stop
SELECT etc_batch.abort_job('festival-rest', 'too late');
\echo :LAST_ERROR_SQLSTATE

-- Bad registrations: a clear error, nothing stored.
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": 3, "revision": 1}, {"id": 3, "revision": 2}]', 5, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": "3", "revision": 1}]', 5, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": 3, "revision": 1, "qty": "two"}]', 5, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": 3, "revision": 1, "colour": "red"}]', 5, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": 3, "revision": 1}]', 0, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": 3, "revision": 1}]', 5, '{"revision": 9}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": 3, "revision": 1}]', 5, '{"tenant": "Y"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": 3, "revision": 1}]', 5, NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'no_such_table', '[{"id": 3, "revision": 1}]', 5, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE no_key (tenant text, id int, revision int);
SELECT * FROM etc_batch.register_job('bad', 'X', 'no_key', '[{"id": 3, "revision": 1}]', 5, '{"revision": 2}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', NULL, 5, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '{"id": 3}', 5, '{"status": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('bad', 'X', 'orders', '[{"id": 3, "revision": 1}]', 5, '{"status": "x"}', key_column => 'nope');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS bad_jobs_stored FROM etc_batch.job WHERE job_id = 'bad';
CALL etc_batch.drain_job('no such job');
\echo :LAST_ERROR_SQLSTATE
CALL etc_batch.drain_job('festival-rest', -1);
\echo :LAST_ERROR_SQLSTATE
BEGIN;
CALL etc_batch.drain_job('festival-rest');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- A job changes rows with the registering role's privileges, row-level security included,
-- whoever drains it.
CREATE ROLE clerk;
CREATE ROLE intruder;
GRANT USAGE ON SCHEMA etc_batch TO clerk, intruder;
GRANT EXECUTE ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO clerk, intruder;
CREATE TABLE tickets (tenant text, id int, revision int NOT NULL DEFAULT 1, state text, PRIMARY KEY (tenant, id));
INSERT INTO tickets SELECT t, g, 1, 'open' FROM unnest(ARRAY['X', 'Y']) t, generate_series(1, 3) g;
GRANT SELECT, UPDATE ON tickets TO clerk;
GRANT SELECT ON tickets TO intruder;
ALTER TABLE tickets ENABLE ROW LEVEL SECURITY;
CREATE POLICY clerk_works_for_x ON tickets TO clerk USING (tenant = 'X');
SET ROLE intruder;
SELECT * FROM etc_batch.register_job('close-x', 'X', 'tickets', '[{"id": 1, "revision": 1}]', 1, '{"state": "closed"}');
\echo :LAST_ERROR_SQLSTATE
SET ROLE clerk;
SELECT * FROM etc_batch.register_job('close-x', 'X', 'tickets', '[{"id": 1, "revision": 1}]', 1, '{"state": "closed"}');
SELECT * FROM etc_batch.register_job('close-y', 'Y', 'tickets', '[{"id": 1, "revision": 1}]', 1, '{"state": "closed"}');
RESET ROLE;
CALL etc_batch.drain_job('close-x');
CALL etc_batch.drain_job('close-y');
\echo :LAST_ERROR_SQLSTATE
SELECT tenant, id, revision, state FROM tickets WHERE id = 1 ORDER BY tenant;
DROP OWNED BY clerk, intruder;
DROP ROLE clerk, intruder;

-- Pruning history: only what ended before the cutoff, never open work.
SELECT * FROM etc_batch.prune_history('1 hour');
SELECT * FROM etc_batch.prune_history('-1 day');
\echo :LAST_ERROR_SQLSTATE
UPDATE etc_batch.job SET finished_at = finished_at - interval '2 days' WHERE status IN ('done', 'aborted');
SELECT * FROM etc_batch.prune_history('1 day');
SELECT job_id, status FROM etc_batch.job ORDER BY job_id;
SELECT count(*) AS items_of_forgotten_jobs FROM etc_batch.job_item WHERE job_id NOT IN (SELECT job_id FROM etc_batch.job);

-- Guards that items carry or not, and JSON null meaning "must be NULL".
CREATE TABLE notes (tenant text, id int, revision int NOT NULL DEFAULT 1, note text, colour text, PRIMARY KEY (tenant, id));
INSERT INTO notes VALUES ('X', 1, 1, NULL, 'red'), ('X', 2, 1, 'hello', 'blue'), ('X', 3, 1, NULL, NULL);
SELECT created FROM etc_batch.register_job('notes-ok', 'X', 'notes',
    '[{"id": 1, "revision": 1, "note": null}, {"id": 2, "revision": 1, "colour": "blue"}, {"id": 3, "revision": 1, "note": null, "colour": null}]',
    3, '{"note": "seen"}');
CALL etc_batch.drain_job('notes-ok');
SELECT id, revision, note, colour FROM notes ORDER BY id;
SELECT created FROM etc_batch.register_job('notes-clash', 'X', 'notes',
    '[{"id": 1, "revision": 2, "note": null}]', 1, '{"colour": "green"}');
CALL etc_batch.drain_job('notes-clash');
\echo :LAST_ERROR_SQLSTATE
SELECT id, revision, note, colour FROM notes WHERE id = 1;
