-- A handler job whose row changed after it was approved. etc_batch hands the handler
-- each item as it was approved, its key and the approved revision, and compares no
-- revision of a handler job's row itself: the handler compares it, and returns NULL for
-- a row that moved on. etc_batch makes that NULL the job's conflict at that item, rolls
-- back the whole chunk (the handler's change to the chunk's other items with it), keeps
-- the chunks committed before it, and records what was approved and what was found.
CREATE EXTENSION etc_batch;
CREATE TABLE parcels (id int PRIMARY KEY, revision int NOT NULL DEFAULT 1, status text NOT NULL DEFAULT 'new');
INSERT INTO parcels SELECT g FROM generate_series(1, 6) g;

-- What a handler is handed is said in a NOTICE: its own writes roll back with a chunk.
CREATE FUNCTION ship(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    RAISE NOTICE 'ship was handed %', item;
    UPDATE parcels SET status = 'shipped', revision = revision + 1
     WHERE id = (item->>'id')::int AND revision = (item->>'revision')::int
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
SELECT id, revision, status FROM parcels WHERE id <= 4 ORDER BY id;
SELECT position, item_key, revision_before, revision_after
  FROM etc_batch.job_audit_items WHERE job_id = 'ship' ORDER BY position;

-- etc_batch compares no revision itself: a handler that ignores the one it is handed
-- changes a row that moved on, and the job is done, its audit and verify_job content.
CREATE FUNCTION ship_regardless(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    UPDATE parcels SET status = 'shipped', revision = revision + 1
     WHERE id = (item->>'id')::int
    RETURNING to_jsonb(parcels.*) INTO r;
    RETURN r;
END $$;
SELECT * FROM etc_batch.register_job('regardless', NULL, 'parcels',
    '[{"id": 5, "revision": 1}, {"id": 6, "revision": 1}]',
    2, NULL, tenant_column => NULL, handler => 'ship_regardless(jsonb)');
UPDATE parcels SET revision = revision + 1, status = 'held' WHERE id = 6;
CALL etc_batch.drain_job('regardless');
SELECT id, revision, status FROM parcels WHERE id > 4 ORDER BY id;
SELECT position, item_key, revision_before, revision_after
  FROM etc_batch.job_audit_items WHERE job_id = 'regardless' ORDER BY position;
SELECT count(*) FILTER (WHERE NOT ok) AS failed_checks FROM etc_batch.verify_job('regardless');
