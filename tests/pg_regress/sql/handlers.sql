-- A handler job is guarded as an UPDATE job is. Before its handler is called for an
-- item, etc_batch locks the item's row and checks it against the item's guard (its
-- revision, a digest of the row, or the columns the approval names, and expect): a row
-- that moved on since the approval is never handed to the handler. It is the job's
-- conflict at that item (the whole chunk rolled back, the chunks before it kept), or,
-- under on_drift 'skip', an item skipped and recorded. A handler that returns NULL for
-- an item it was handed refuses it: the job's conflict too.
CREATE EXTENSION etc_batch;
CREATE TABLE parcels (id int PRIMARY KEY, revision int NOT NULL DEFAULT 1, status text NOT NULL DEFAULT 'new');
INSERT INTO parcels SELECT g FROM generate_series(1, 8) g;

-- What a handler is handed is said in a NOTICE: its own writes roll back with a chunk.
-- It compares no revision: etc_batch has, before the call.
CREATE FUNCTION ship(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    RAISE NOTICE 'ship was handed %', item;
    UPDATE parcels SET status = 'shipped', revision = revision + 1
     WHERE id = (item->>'id')::int
    RETURNING to_jsonb(parcels.*) INTO r;
    RETURN r;
END $$;
SELECT * FROM etc_batch.register_job('ship', NULL, 'parcels',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision) ORDER BY id) FROM parcels WHERE id <= 4),
    2, NULL, tenant_column => NULL, handler => 'ship(jsonb)');
-- the application moves parcel 4 on after the approval, before its chunk runs
UPDATE parcels SET revision = revision + 1, status = 'held' WHERE id = 4;
CALL etc_batch.drain_job('ship');
\echo :LAST_ERROR_SQLSTATE
SELECT status, problem->>'key' AS item, problem->'expected'->'revision' AS approved,
       problem->'found'->'revision' AS found
  FROM etc_batch.job WHERE job_id = 'ship';
-- parcel 3 was handed over and shipped, then rolled back with its chunk; 4 was never
-- handed over
SELECT id, revision, status FROM parcels WHERE id <= 4 ORDER BY id;
SELECT position, item_key, revision_before, revision_after
  FROM etc_batch.job_audit_items WHERE job_id = 'ship' ORDER BY position;

-- Under on_drift 'skip', the drifted item is skipped and recorded, the handler never
-- called for it, and the job goes on to the end.
SELECT * FROM etc_batch.register_job('ship-rest', NULL, 'parcels',
    '[{"id": 5, "revision": 1}, {"id": 6, "revision": 1}, {"id": 7, "revision": 1}]',
    2, NULL, tenant_column => NULL, handler => 'ship(jsonb)', on_drift => 'skip');
UPDATE parcels SET revision = revision + 1, status = 'held' WHERE id = 6;
CALL etc_batch.drain_job('ship-rest');
SELECT id, revision, status FROM parcels WHERE id BETWEEN 5 AND 7 ORDER BY id;
SELECT position, item_key, revision_before, revision_after, outcome
  FROM etc_batch.job_audit_items WHERE job_id = 'ship-rest' ORDER BY position;
SELECT status, approved, committed, skipped FROM etc_batch.job_summary('ship-rest');
SELECT count(*) FILTER (WHERE NOT ok) AS failed_checks FROM etc_batch.verify_job('ship-rest');

-- A handler that returns NULL for an item it was handed refuses it: a conflict that
-- names the handler.
CREATE FUNCTION ship_but_8(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF (item->>'id')::int = 8 THEN RETURN NULL; END IF;
    RETURN ship(item);
END $$;
SELECT * FROM etc_batch.register_job('ship-8', NULL, 'parcels', '[{"id": 8, "revision": 1}]',
    2, NULL, tenant_column => NULL, handler => 'ship_but_8(jsonb)');
CALL etc_batch.drain_job('ship-8');
\echo :LAST_ERROR_SQLSTATE
SELECT status, problem->>'key' AS item FROM etc_batch.job WHERE job_id = 'ship-8';
SELECT id, revision, status FROM parcels WHERE id = 8;

-- A purge on a table with no revision column, guarded by the column the approval
-- expects: a delivery the application disputes after the approval is not deleted.
CREATE TABLE deliveries (id uuid PRIMARY KEY, status text NOT NULL, note text);
INSERT INTO deliveries
SELECT ('00000000-0000-0000-0000-00000000000' || g)::uuid, 'delivered', NULL FROM generate_series(1, 6) g;
CREATE FUNCTION purge_delivery(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    DELETE FROM deliveries WHERE id = (item->>'id')::uuid RETURNING to_jsonb(deliveries.*) INTO r;
    RETURN r;
END $$;
SELECT * FROM etc_batch.register_job('purge', NULL, 'deliveries',
    (SELECT jsonb_agg(jsonb_build_object('id', id) ORDER BY id) FROM deliveries),
    4, NULL, '{"status": "delivered"}', tenant_column => NULL, revision_column => NULL,
    guard => 'columns', handler => 'purge_delivery(jsonb)', on_drift => 'skip');
UPDATE deliveries SET status = 'disputed' WHERE id = '00000000-0000-0000-0000-000000000005';
UPDATE deliveries SET note = 'left at the door' WHERE id = '00000000-0000-0000-0000-000000000002';  -- not guarded
CALL etc_batch.drain_job('purge');
SELECT id, status, note FROM deliveries ORDER BY id;
SELECT position, item_key, outcome, guarded_by
  FROM etc_batch.job_audit_items WHERE job_id = 'purge' ORDER BY position;

-- Guarded by a digest of the whole row: any change to the row since the approval is
-- drift, and the handler is not called for it.
CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL, archived boolean NOT NULL DEFAULT false);
INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 4) g;
CREATE FUNCTION archive_note(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    RAISE NOTICE 'archive_note was handed %', item->'id';
    UPDATE notes SET archived = true WHERE id = (item->>'id')::int RETURNING to_jsonb(notes.*) INTO r;
    RETURN r;
END $$;
SELECT * FROM etc_batch.register_job('archive-notes', NULL, 'notes',
    '[{"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, handler => 'archive_note(jsonb)', on_drift => 'skip');
UPDATE notes SET body = 'note 3, edited' WHERE id = 3;
CALL etc_batch.drain_job('archive-notes');
SELECT id, body, archived FROM notes ORDER BY id;
SELECT position, outcome, guarded_by FROM etc_batch.job_audit_items WHERE job_id = 'archive-notes' ORDER BY position;
-- the audit keeps each row's digest as the handler left it: the report finds them so
SELECT position, state FROM etc_batch.job_report('archive-notes') ORDER BY position;
SELECT count(*) FILTER (WHERE NOT ok) AS failed_checks FROM etc_batch.verify_job('archive-notes');

-- Locking each row before the call asks UPDATE on the target: a role that may only
-- read it cannot register a handler job.
CREATE ROLE regress_handler_reader;
GRANT USAGE ON SCHEMA etc_batch TO regress_handler_reader;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA etc_batch TO regress_handler_reader;
GRANT SELECT ON notes TO regress_handler_reader;
SET ROLE regress_handler_reader;
SELECT * FROM etc_batch.register_job('reader', NULL, 'notes', '[{"id": 1}]', 10, NULL,
    tenant_column => NULL, revision_column => NULL, handler => 'archive_note(jsonb)');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP OWNED BY regress_handler_reader;
DROP ROLE regress_handler_reader;
