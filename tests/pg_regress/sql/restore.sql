-- Reverting a job that deleted its rows (action 'delete') or moved them to an archive
-- ('move'): register_revert approves the rows the job kept, where their key is free
-- (action 'restore'), and each chunk puts them back in one statement, a move's taken
-- out of the archive in the same statement. A key taken since is left out and named,
-- never overwritten; the revert of the restore deletes (or moves) them again.
CREATE EXTENSION etc_batch;

-- 1. A purge of sessions (uuid key, bytea, timestamptz, a generated column, an identity
-- column), reverted: every row back as it was, the generated column computed again.
CREATE TABLE sessions (
    id         uuid PRIMARY KEY,
    seq        bigint GENERATED ALWAYS AS IDENTITY,
    user_name  text NOT NULL,
    last_seen  timestamptz NOT NULL,
    payload    bytea,
    tags       text[],
    user_upper text GENERATED ALWAYS AS (upper(user_name)) STORED);
INSERT INTO sessions (id, user_name, last_seen, payload, tags)
SELECT ('00000000-0000-0000-0000-0000000000' || lpad(g::text, 2, '0'))::uuid, 'user ' || g,
       timestamptz '2026-01-01 00:00+00' + g * interval '1 day', decode(lpad(to_hex(g), 4, '0'), 'hex'),
       ARRAY['a', g::text]
  FROM generate_series(1, 10) g;
CREATE TABLE sessions_before AS SELECT * FROM sessions;
SELECT * FROM etc_batch.register_job_from_query('purge', NULL, 'sessions',
    $$SELECT id FROM sessions WHERE last_seen < '2026-01-08'$$, 3, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete');
CALL etc_batch.drain_job('purge');
SELECT count(*) AS left_in_table FROM sessions;
-- the application takes one deleted key again before the revert: that row is left out
INSERT INTO sessions (id, user_name, last_seen)
VALUES ('00000000-0000-0000-0000-000000000004', 'someone else', '2026-06-01');
SELECT items, drifted, gone, taken FROM etc_batch.revert_preview('purge');
SELECT * FROM etc_batch.revert_preview_left_out('purge');
SELECT * FROM etc_batch.register_revert('purge', 'purge-back');
SELECT job_id, action, guard, status FROM etc_batch.job WHERE job_id LIKE 'purge%' ORDER BY job_id;
SELECT position, item_key, state FROM etc_batch.job_left_out WHERE job_id = 'purge-back';
CALL etc_batch.drain_job('purge-back');
-- every row put back is the row deleted, column by column (the identity's value too),
-- its generated column computed again; the one in the way untouched
SELECT s.id, s.seq, s.user_name, s.user_upper, s.payload, s.tags, s.last_seen = b.last_seen AS same_time
  FROM sessions s LEFT JOIN sessions_before b USING (id) ORDER BY s.id;
SELECT count(*) AS differing FROM sessions s JOIN sessions_before b USING (id)
 WHERE (s.*) IS DISTINCT FROM (b.*) AND s.id <> '00000000-0000-0000-0000-000000000004';
SELECT position, item_key, state FROM etc_batch.job_report('purge-back') ORDER BY position;
SELECT status, approved, committed, matching, drifted, missing, skipped
  FROM etc_batch.job_summary('purge-back');
SELECT check_name, ok FROM etc_batch.verify_job('purge-back') ORDER BY check_name;

-- 2. The revert of the restore deletes the rows it put back, as it put them back, and
-- keeps them; the revert of that puts them back again.
UPDATE sessions SET tags = ARRAY['touched'] WHERE id = '00000000-0000-0000-0000-000000000002';
SELECT items, drifted, gone FROM etc_batch.revert_preview('purge-back');
SELECT * FROM etc_batch.register_revert('purge-back', 'purge-again');
CALL etc_batch.drain_job('purge-again');
SELECT id, user_name FROM sessions ORDER BY id;
SELECT * FROM etc_batch.register_revert('purge-again', 'purge-back-again');
CALL etc_batch.drain_job('purge-back-again');
SELECT id, user_name FROM sessions ORDER BY id;
SELECT job_id, action, status, reverts FROM etc_batch.job WHERE job_id LIKE 'purge%' ORDER BY job_id;

-- 3. A key taken while the restore waits to be drained: a conflict that says so, or,
-- under on_drift 'skip', skipped and recorded.
DELETE FROM sessions WHERE id = '00000000-0000-0000-0000-000000000009';
SELECT * FROM etc_batch.register_job_from_query('purge-9', NULL, 'sessions',
    $$SELECT id FROM sessions WHERE user_name IN ('user 8', 'user 10')$$, 5, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete', on_drift => 'skip');
CALL etc_batch.drain_job('purge-9');
SELECT * FROM etc_batch.register_revert('purge-9', 'purge-9-back');
INSERT INTO sessions (id, user_name, last_seen)
VALUES ('00000000-0000-0000-0000-000000000010', 'in the way', '2026-06-01');
CALL etc_batch.drain_job('purge-9-back');
SELECT s.id, s.user_name FROM sessions s WHERE user_name IN ('user 8', 'user 10', 'in the way') ORDER BY id;
SELECT position, item_key, state FROM etc_batch.job_report('purge-9-back') ORDER BY position;
-- under on_drift 'stop', a conflict that names the item and why; the remainder puts back
-- the rest and leaves the taken key out, named
SELECT * FROM etc_batch.register_job_from_query('purge-56', NULL, 'sessions',
    $$SELECT id FROM sessions WHERE user_name IN ('user 5', 'user 6')$$, 5, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete');
CALL etc_batch.drain_job('purge-56');
SELECT * FROM etc_batch.register_revert('purge-56', 'purge-56-back');
INSERT INTO sessions (id, user_name, last_seen)
VALUES ('00000000-0000-0000-0000-000000000006', 'in the way', '2026-06-01');
CALL etc_batch.drain_job('purge-56-back');
SELECT status, status_reason FROM etc_batch.job WHERE job_id = 'purge-56-back';
SELECT * FROM etc_batch.register_remainder('purge-56-back', 'purge-56-rest');
CALL etc_batch.drain_job('purge-56-rest');
SELECT s.id, s.user_name FROM sessions s WHERE user_name IN ('user 5', 'user 6', 'in the way') ORDER BY id;
SELECT job_id, position, item_key, state FROM etc_batch.job_left_out WHERE job_id = 'purge-56-rest';

-- 4. A move to an archive, on a monthly-partitioned table with a composite key and a
-- tenant; the archive has a column of its own. The revert takes each row back from the
-- archive, where it still is as it was moved; one changed there since is left out.
CREATE TABLE orders (
    tenant   text NOT NULL,
    region   text NOT NULL,
    id       int NOT NULL,
    placed   date NOT NULL,
    total    numeric(10, 2) NOT NULL,
    status   text NOT NULL DEFAULT 'delivered',
    PRIMARY KEY (tenant, region, id, placed)) PARTITION BY RANGE (placed);
CREATE TABLE orders_2026_01 PARTITION OF orders FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE orders_2026_02 PARTITION OF orders FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
INSERT INTO orders (tenant, region, id, placed, total)
SELECT t, r, g, date '2026-01-01' + (g * 5), g * 10.5
  FROM unnest(ARRAY['A', 'B']) t, unnest(ARRAY['eu', 'us']) r, generate_series(1, 8) g;
CREATE TABLE orders_archive (
    tenant      text NOT NULL,
    region      text NOT NULL,
    id          int NOT NULL,
    placed      date NOT NULL,
    total       numeric NOT NULL,
    status      text NOT NULL,
    archived_on date NOT NULL DEFAULT '2026-03-01');
CREATE TABLE orders_before AS SELECT * FROM orders;
SELECT * FROM etc_batch.register_job_from_query('archive-a', 'A', 'orders',
    $$SELECT region, id, placed FROM orders WHERE tenant = 'A' AND id <= 4$$, 3, NULL,
    '{"status": "delivered"}', tenant_column => 'tenant', revision_column => NULL,
    guard => 'columns', action => 'move', archive => 'orders_archive');
CALL etc_batch.drain_job('archive-a');
SELECT count(*) AS archived FROM orders_archive;
UPDATE orders_archive SET status = 'audited' WHERE region = 'us' AND id = 2;
SELECT items, drifted, gone FROM etc_batch.revert_preview('archive-a');
SELECT * FROM etc_batch.register_revert('archive-a', 'archive-a-back');
SELECT position, item_key, state FROM etc_batch.job_left_out WHERE job_id = 'archive-a-back';
CALL etc_batch.drain_job('archive-a-back');
SELECT region, id, placed, total, status FROM orders_archive ORDER BY region, id;
SELECT count(*) AS back_as_they_were FROM orders o JOIN orders_before b USING (tenant, region, id, placed)
 WHERE o.tenant = 'A' AND o.id <= 4 AND (o.*) IS NOT DISTINCT FROM (b.*);
SELECT check_name, ok FROM etc_batch.verify_job('archive-a-back') ORDER BY check_name;
-- and moved again by the revert of that
SELECT * FROM etc_batch.register_revert('archive-a-back', 'archive-a-again');
CALL etc_batch.drain_job('archive-a-again');
SELECT region, id, placed, status FROM orders_archive ORDER BY region, id, archived_on;

-- 5. What is refused.
SELECT * FROM etc_batch.register_job_from_query('gone-for-good', NULL, 'sessions',
    $$SELECT id FROM sessions WHERE user_name = 'user 1'$$, 3, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete', keep_deleted => false);
CALL etc_batch.drain_job('gone-for-good');
SELECT * FROM etc_batch.register_revert('gone-for-good', 'gone-for-good-back');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_revert('purge-9', 'purge-9-other');
\echo :LAST_ERROR_SQLSTATE
-- a role that may delete the rows but not insert them again: it registers and drains a
-- purge of its own, and may not revert it
CREATE ROLE regress_restore_clerk;
GRANT USAGE ON SCHEMA etc_batch TO regress_restore_clerk;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA etc_batch TO regress_restore_clerk;
GRANT EXECUTE ON ALL PROCEDURES IN SCHEMA etc_batch TO regress_restore_clerk;
GRANT SELECT, DELETE ON sessions TO regress_restore_clerk;
SET ROLE regress_restore_clerk;
SELECT * FROM etc_batch.register_job_from_query('purge-7', NULL, 'sessions',
    $$SELECT id FROM sessions WHERE user_name = 'user 7'$$, 3, NULL,
    tenant_column => NULL, revision_column => NULL, action => 'delete');
CALL etc_batch.drain_job('purge-7');
SELECT * FROM etc_batch.register_revert('purge-7', 'purge-7-back');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS stored FROM etc_batch.job WHERE job_id = 'purge-7-back';
DROP OWNED BY regress_restore_clerk;
DROP ROLE regress_restore_clerk;
