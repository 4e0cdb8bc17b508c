-- Every approved item accounted for: what register_remainder approves again, and what it
-- leaves out, named with its reason (drifted, gone, another tenant's); the drifted ones
-- approved later by a call of their own; approved = committed + skipped + remainder +
-- left out, at every step. docs/jobs.md quotes this file's output.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never
SET TimeZone = 'UTC';

CREATE TABLE orders (
    tenant   text    NOT NULL,
    id       integer PRIMARY KEY,
    revision bigint  NOT NULL DEFAULT 1,
    status   text    NOT NULL DEFAULT 'pending');
INSERT INTO orders (tenant, id) SELECT 'alien-fest', g FROM generate_series(1, 12) g;

-- what one job's items became, by where they are now; `accounted` must equal `approved`
CREATE FUNCTION accounted(of_job text) RETURNS TABLE (approved integer, committed bigint,
    skipped bigint, remainder bigint, left_out bigint, accounted bigint)
LANGUAGE sql AS $$
    WITH j AS (SELECT item_count, continued_as FROM etc_batch.job WHERE job_id = of_job),
    a AS (SELECT count(*) FILTER (WHERE NOT skipped) AS committed,
                 count(*) FILTER (WHERE skipped) AS skipped
            FROM etc_batch.job_audit WHERE job_id = of_job),
    -- the remainder, and the later job that approved its drifted items again
    r AS (SELECT count(*) AS n FROM etc_batch.job_item i
           WHERE i.job_id IN (SELECT continued_as FROM j
                              UNION SELECT DISTINCT o.approved_again_as FROM etc_batch.job_left_out o, j
                               WHERE o.job_id = j.continued_as)),
    l AS (SELECT count(*) AS n FROM etc_batch.job_left_out o, j
           WHERE o.job_id = j.continued_as AND o.approved_again_as IS NULL)
    SELECT j.item_count, a.committed, a.skipped, r.n, l.n, a.committed + a.skipped + r.n + l.n
      FROM j, a, r, l
$$;

SELECT * FROM etc_batch.register_job('festival', 'alien-fest', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders), 3,
    '{"status": "cancelled"}', '{"status": "pending"}');
CALL etc_batch.drain_job('festival', 1);
-- while the job waits, the application changes order 5 (in the next chunk: its
-- revision moves on), deletes order 8 and hands order 9 to another tenant
UPDATE orders SET revision = revision + 1 WHERE id = 5;
DELETE FROM orders WHERE id = 8;
UPDATE orders SET tenant = 'other-fest' WHERE id = 9;
CALL etc_batch.drain_job('festival');
\echo :LAST_ERROR_SQLSTATE
SELECT position, item_key, state FROM etc_batch.job_report('festival') WHERE state <> 'matching';

-- The rest approved again: 5 (drifted), 8 (gone) and 9 (another tenant's) are left out,
-- each named, and counted in a NOTICE.
SELECT * FROM etc_batch.register_remainder('festival', 'festival-2');
SELECT job_id, "position", item_key, state, approved_again_as FROM etc_batch.job_left_out
 ORDER BY job_id, "position";
SELECT * FROM accounted('festival');
SELECT position, item_key, state FROM etc_batch.job_report('festival-2');
CALL etc_batch.drain_job('festival-2');

-- The drifted item approved later, at its row's state now, by a call on the continued
-- job: a job of its own, and the row left out says which.
SELECT * FROM etc_batch.register_remainder('festival', 'festival-drifted', include_drifted => true);
SELECT job_id, "position", item_key, state, approved_again_as FROM etc_batch.job_left_out
 ORDER BY job_id, "position";
SELECT * FROM accounted('festival');
SELECT item_key, revision FROM etc_batch.job_item WHERE job_id = 'festival-drifted';
CALL etc_batch.drain_job('festival-drifted');
SELECT id, tenant, revision, status FROM orders ORDER BY id;
-- nothing drifted is left to approve again: the job is continued, as before
SELECT * FROM etc_batch.register_remainder('festival', 'festival-again', include_drifted => true);
\echo :LAST_ERROR_SQLSTATE
SELECT position, item_key, state FROM etc_batch.job_report('festival-2') WHERE position IS NULL;

-- Chosen first: with include_drifted, the drifted item is approved at once; the gone one
-- is still left out, and named.
INSERT INTO orders (tenant, id) SELECT 'alien-fest', g FROM generate_series(21, 26) g;
SELECT * FROM etc_batch.register_job('kermesse', 'alien-fest', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders WHERE id > 20), 2,
    '{"status": "cancelled"}', '{"status": "pending"}');
CALL etc_batch.drain_job('kermesse', 1);
UPDATE orders SET revision = revision + 1 WHERE id = 23;
DELETE FROM orders WHERE id = 25;
CALL etc_batch.drain_job('kermesse');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_remainder('kermesse', 'kermesse-2', include_drifted => true);
SELECT job_id, "position", item_key, state FROM etc_batch.job_left_out WHERE job_id = 'kermesse-2';
SELECT * FROM accounted('kermesse');

-- Nothing left to approve again: refused, and the job stays as it was, its items its own.
INSERT INTO orders (tenant, id) VALUES ('alien-fest', 30);
SELECT * FROM etc_batch.register_job('last-one', 'alien-fest', 'orders',
    '[{"id": 30, "revision": 1}]', 1, '{"status": "cancelled"}', '{"status": "pending"}');
DELETE FROM orders WHERE id = 30;
CALL etc_batch.drain_job('last-one');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_remainder('last-one', 'last-one-2');
\echo :LAST_ERROR_SQLSTATE
SELECT status FROM etc_batch.job WHERE job_id = 'last-one';
