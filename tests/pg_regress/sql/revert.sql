-- Reverting a job: its committed items set back by a new approved, frozen, guarded
-- job, built from its audit; rows changed since left out and named; the job reverted
-- stopped first; refusals. docs/jobs.md quotes this file's output.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never
SET TimeZone = 'UTC';

-- 1. The festival was not cancelled after all. The job cancelled its pending orders,
-- expecting status pending: what each row held before is known.
CREATE TABLE orders (
    tenant   text   NOT NULL,
    id       bigint NOT NULL,
    status   text   NOT NULL,
    revision bigint NOT NULL DEFAULT 1,
    note     text,
    PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id, status) SELECT 'festival', g, 'pending' FROM generate_series(1, 8) g;
SELECT * FROM etc_batch.register_job('cancel-festival', 'festival', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders), 3,
    '{"status": "cancelled"}', '{"status": "pending"}');
CALL etc_batch.drain_job('cancel-festival');
SELECT id, status, revision FROM orders ORDER BY id;

-- The application moves on: order 2 gets a note (its revision moves on), order 5 is
-- deleted. Before anything is registered, the preview:
UPDATE orders SET note = 'refund asked', revision = revision + 1 WHERE id = 2;
DELETE FROM orders WHERE id = 5;
SELECT * FROM etc_batch.revert_preview('cancel-festival');
SELECT * FROM etc_batch.revert_preview_left_out('cancel-festival');

SELECT * FROM etc_batch.register_revert('cancel-festival', 'uncancel-festival');
SELECT job_id, status, status_reason, reverts, reverted_by FROM etc_batch.job
 WHERE job_id LIKE '%cancel-festival' ORDER BY job_id;
SELECT set_values, expect, guard, item_count FROM etc_batch.job WHERE job_id = 'uncancel-festival';
-- each item expected at the revision the job's change left it at
SELECT position, item_key, revision FROM etc_batch.job_item
 WHERE job_id = 'uncancel-festival' ORDER BY position;
SELECT "position", item_key, state FROM etc_batch.job_left_out
 WHERE job_id = 'uncancel-festival' ORDER BY "position";

-- registered again: the same request; another one under the same id is refused
SELECT * FROM etc_batch.register_revert('cancel-festival', 'uncancel-festival');
SELECT * FROM etc_batch.register_revert('cancel-festival', 'uncancel-festival', chunk_size => 2);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_revert('cancel-festival', 'uncancel-festival-2');
\echo :LAST_ERROR_SQLSTATE
-- the job reverted changes nothing more
CALL etc_batch.drain_job('cancel-festival');
\echo :LAST_ERROR_SQLSTATE

CALL etc_batch.drain_job('uncancel-festival');
-- back to pending; the revision goes on (never reused); the drifted and gone stay as
-- they are
SELECT id, status, revision, note FROM orders ORDER BY id;
SELECT position, item_key, revision_before, revision_after, outcome FROM etc_batch.job_audit_items
 WHERE job_id = 'uncancel-festival' ORDER BY position;
SELECT check_name, ok FROM etc_batch.verify_job('uncancel-festival') ORDER BY check_name;
-- the revert's report: its items, then those it left out
SELECT * FROM etc_batch.job_report('uncancel-festival');

-- 2. A revert of a revert: the festival is cancelled after all.
SELECT * FROM etc_batch.revert_preview('uncancel-festival');
SELECT * FROM etc_batch.register_revert('uncancel-festival', 'recancel-festival');
CALL etc_batch.drain_job('recancel-festival');
SELECT id, status, revision FROM orders ORDER BY id;
SELECT job_id, status, reverts, reverted_by FROM etc_batch.job
 WHERE job_id LIKE '%cancel-festival' ORDER BY job_id;

-- 3. A job still running, and one of its rows changed by the application since: the
-- job is stopped first and ends reverted; only its committed part is set back, the
-- changed row named and left as it is.
INSERT INTO orders (tenant, id, status) SELECT 'spring', g, 'pending' FROM generate_series(1, 9) g;
SELECT * FROM etc_batch.register_job('cancel-spring', 'spring', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision))
       FROM orders WHERE tenant = 'spring'), 2,
    '{"status": "cancelled"}', '{"status": "pending"}');
CALL etc_batch.drain_job('cancel-spring', 2);
UPDATE orders SET status = 'archived', revision = revision + 1 WHERE tenant = 'spring' AND id = 3;
SELECT * FROM etc_batch.revert_preview('cancel-spring');
SELECT * FROM etc_batch.register_revert('cancel-spring', 'uncancel-spring');
SELECT job_id, status, status_reason FROM etc_batch.job WHERE job_id = 'cancel-spring';
CALL etc_batch.drain_job('uncancel-spring');
SELECT id, status, revision FROM orders WHERE tenant = 'spring' ORDER BY id;
SELECT * FROM etc_batch.job_summary('uncancel-spring');

-- A paused job and one in conflict are reverted the same way; a row that drifts after
-- the revert is registered stops the revert in conflict, like any job.
INSERT INTO orders (tenant, id, status) SELECT 'summer', g, 'pending' FROM generate_series(1, 6) g;
SELECT * FROM etc_batch.register_job('cancel-summer', 'summer', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision))
       FROM orders WHERE tenant = 'summer' AND id <= 3), 1,
    '{"status": "cancelled"}', '{"status": "pending"}');
CALL etc_batch.drain_job('cancel-summer', 2);
SELECT etc_batch.pause_job('cancel-summer');
SELECT * FROM etc_batch.register_revert('cancel-summer', 'uncancel-summer');
SELECT job_id, status, reverted_by FROM etc_batch.job WHERE job_id LIKE '%cancel-summer' ORDER BY job_id;
UPDATE orders SET status = 'shipped', revision = revision + 1 WHERE tenant = 'summer' AND id = 2;
CALL etc_batch.drain_job('uncancel-summer');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job('cancel-autumn', 'summer', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision))
       FROM orders WHERE tenant = 'summer' AND id > 3), 2,
    '{"status": "cancelled"}', '{"status": "pending"}');
UPDATE orders SET note = 'held', revision = revision + 1 WHERE tenant = 'summer' AND id = 6;
CALL etc_batch.drain_job('cancel-autumn');
SELECT * FROM etc_batch.register_revert('cancel-autumn', 'uncancel-autumn');
CALL etc_batch.drain_job('uncancel-autumn');
SELECT id, status, revision, note FROM orders WHERE tenant = 'summer' ORDER BY id;

-- 4. A parallel job reverted by parallel drainers (here two drains, each claiming the
-- chunks no other holds); no revision column: the rows guarded by their digest, the
-- revert's by the digest the job's change left.
CREATE TABLE tickets (id int PRIMARY KEY, state text NOT NULL, seen_at timestamptz);
INSERT INTO tickets SELECT g, 'open', NULL FROM generate_series(1, 10) g;
SELECT * FROM etc_batch.register_job('close-tickets', NULL, 'tickets',
    (SELECT jsonb_agg(jsonb_build_object('id', id)) FROM tickets), 3,
    '{"state": "closed"}', '{"state": "open"}',
    tenant_column => NULL, revision_column => NULL, parallel => true);
CALL etc_batch.drain_job('close-tickets');
UPDATE tickets SET seen_at = '2026-12-01 10:00+00' WHERE id = 7;
SELECT * FROM etc_batch.register_revert('close-tickets', 'reopen-tickets');
SELECT parallel, guard, item_count FROM etc_batch.job WHERE job_id = 'reopen-tickets';
CALL etc_batch.drain_job('reopen-tickets', 2);
CALL etc_batch.drain_job('reopen-tickets');
SELECT id, state, seen_at FROM tickets ORDER BY id;
SELECT "position", item_key, state FROM etc_batch.job_left_out WHERE job_id = 'reopen-tickets';
SELECT check_name, ok FROM etc_batch.verify_job('reopen-tickets') ORDER BY check_name;

-- A job guarded by named columns: its revert expects the rows to hold what it set, and
-- the guards its items named that it did not change; a row whose set column the
-- application changed since is left out, one whose other columns changed is not.
CREATE TABLE lines (id int PRIMARY KEY, state text NOT NULL, priority int NOT NULL, seen_at timestamptz);
INSERT INTO lines SELECT g, 'open', g % 3 FROM generate_series(1, 6) g;
SELECT * FROM etc_batch.register_job('close-lines', NULL, 'lines',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'priority', priority)) FROM lines), 4,
    '{"state": "closed"}', '{"state": "open"}',
    tenant_column => NULL, revision_column => NULL, guard => 'columns');
CALL etc_batch.drain_job('close-lines');
UPDATE lines SET state = 'archived' WHERE id = 2;     -- what the job set: drifted
UPDATE lines SET priority = 9 WHERE id = 3;           -- a guard of the item: drifted
UPDATE lines SET seen_at = '2026-12-01 10:00+00' WHERE id = 4;   -- not guarded
SELECT items, drifted, gone, set_back, expected FROM etc_batch.revert_preview('close-lines');
SELECT * FROM etc_batch.revert_preview_left_out('close-lines');
SELECT * FROM etc_batch.register_revert('close-lines', 'reopen-lines');
SELECT position, item_key, guards FROM etc_batch.job_item WHERE job_id = 'reopen-lines' ORDER BY position;
CALL etc_batch.drain_job('reopen-lines');
SELECT id, state, priority, seen_at IS NOT NULL AS seen FROM lines ORDER BY id;
SELECT * FROM etc_batch.job_summary('reopen-lines');

-- a function (jsonb) RETURNS jsonb, named below where a handler or an inverse is asked for
CREATE FUNCTION same_item(item jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT item';

-- 5. Only what is known is set back. A job that set a column without expecting its
-- value before cannot be reverted: nobody recorded what the rows held.
CREATE TABLE accounts (id int PRIMARY KEY, plan text NOT NULL, revision bigint NOT NULL DEFAULT 1);
INSERT INTO accounts SELECT g, CASE WHEN g % 2 = 0 THEN 'basic' ELSE 'plus' END FROM generate_series(1, 4) g;
SELECT * FROM etc_batch.register_job('move-plans', NULL, 'accounts',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM accounts), 2,
    '{"plan": "standard"}', tenant_column => NULL);
CALL etc_batch.drain_job('move-plans');
SELECT * FROM etc_batch.revert_preview('move-plans');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_revert('move-plans', 'unmove-plans');
\echo :LAST_ERROR_SQLSTATE
SELECT job_id, status FROM etc_batch.job WHERE job_id LIKE '%move-plans';

-- Registered with record_before, the job records with each item the values its row
-- holds in the columns it sets, when it is registered, and guards them: the change
-- happens only while they hold, so they are exactly what it replaced. The revert sets
-- each row back to its own.
UPDATE accounts SET plan = CASE WHEN id % 2 = 0 THEN 'basic' ELSE 'plus' END, revision = revision + 1;
SELECT * FROM etc_batch.register_job('upgrade-plans', NULL, 'accounts',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM accounts), 2,
    '{"plan": "standard"}', tenant_column => NULL, record_before => true);
SELECT position, item_key, revision, guards FROM etc_batch.job_item
 WHERE job_id = 'upgrade-plans' ORDER BY position;
SELECT guard_columns, record_before FROM etc_batch.job WHERE job_id = 'upgrade-plans';
-- registered again: the same request (what was recorded is not part of it)
SELECT * FROM etc_batch.register_job('upgrade-plans', NULL, 'accounts',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM accounts), 2,
    '{"plan": "standard"}', tenant_column => NULL, record_before => true);
SELECT * FROM etc_batch.register_job('upgrade-plans', NULL, 'accounts',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM accounts), 2,
    '{"plan": "standard"}', tenant_column => NULL);
\echo :LAST_ERROR_SQLSTATE
CALL etc_batch.drain_job('upgrade-plans');
SELECT * FROM etc_batch.revert_preview('upgrade-plans');
SELECT * FROM etc_batch.register_revert('upgrade-plans', 'downgrade-plans');
SELECT set_values, set_from_items, expect, guard_columns FROM etc_batch.job
 WHERE job_id = 'downgrade-plans';
CALL etc_batch.drain_job('downgrade-plans');
SELECT id, plan, revision FROM accounts ORDER BY id;
SELECT check_name, ok FROM etc_batch.verify_job('downgrade-plans') ORDER BY check_name;
-- its revert sets the job's plan again, on rows that still hold their own plan
SELECT items, set_back, set_back_per_item, expected FROM etc_batch.revert_preview('downgrade-plans');
-- from an items query the same way
SELECT * FROM etc_batch.register_job_from_query('gold-plans', NULL, 'accounts',
    'SELECT id, revision FROM accounts WHERE id <= 2', 2,
    '{"plan": "gold"}', tenant_column => NULL, record_before => true);
SELECT position, item_key, guards FROM etc_batch.job_item WHERE job_id = 'gold-plans' ORDER BY position;
SELECT etc_batch.abort_job('gold-plans', 'shown only');
-- items do not give what record_before records
SELECT * FROM etc_batch.register_job('given-plans', NULL, 'accounts', '[{"id": 1, "revision": 7, "plan": "plus"}]', 1,
    '{"plan": "gold"}', tenant_column => NULL, record_before => true);
\echo :LAST_ERROR_SQLSTATE
-- a revert of such a job stopped by a row drifting after it was registered, and the rest
-- approved again with the drifted row at its state now: each row still goes back to its
-- own value
UPDATE accounts SET plan = CASE id WHEN 3 THEN 'silver' ELSE 'gold' END, revision = revision + 1
 WHERE id IN (3, 4);
SELECT * FROM etc_batch.register_job('platinum-plans', NULL, 'accounts',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM accounts WHERE id >= 3), 1,
    '{"plan": "platinum"}', tenant_column => NULL, record_before => true);
CALL etc_batch.drain_job('platinum-plans');
SELECT * FROM etc_batch.register_revert('platinum-plans', 'unplatinum-plans');
UPDATE accounts SET revision = revision + 1 WHERE id = 4;
CALL etc_batch.drain_job('unplatinum-plans');
SELECT * FROM etc_batch.register_remainder('unplatinum-plans', 'unplatinum-plans-2', include_drifted => true);
SELECT position, item_key, guards FROM etc_batch.job_item WHERE job_id = 'unplatinum-plans-2';
CALL etc_batch.drain_job('unplatinum-plans-2');
SELECT id, plan FROM accounts WHERE id >= 3 ORDER BY id;
-- a revert is registered again only as it was asked: another inverse is another request
SELECT * FROM etc_batch.register_revert('platinum-plans', 'unplatinum-plans');
SELECT * FROM etc_batch.register_revert('platinum-plans', 'unplatinum-plans', inverse => 'same_item(jsonb)');
\echo :LAST_ERROR_SQLSTATE
-- and in a READ COMMITTED transaction only
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM etc_batch.register_revert('platinum-plans', 'unplatinum-plans');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
-- values JSON has no kind for are recorded as their text
CREATE TABLE shelves (id int PRIMARY KEY, tags text[] NOT NULL, at date NOT NULL);
INSERT INTO shelves VALUES (1, '{new,sale}', '2026-01-05'), (2, '{}', '2026-02-01');
SELECT * FROM etc_batch.register_job('retag', NULL, 'shelves', '[{"id": 1}, {"id": 2}]', 2,
    '{"tags": "{archived}", "at": "2026-12-01"}', tenant_column => NULL,
    revision_column => NULL, record_before => true);
SELECT item_key, guards FROM etc_batch.job_item WHERE job_id = 'retag' ORDER BY position;
CALL etc_batch.drain_job('retag');
SELECT * FROM etc_batch.register_revert('retag', 'untag');
CALL etc_batch.drain_job('untag');
SELECT * FROM shelves ORDER BY id;
-- record_before needs values to record
SELECT * FROM etc_batch.register_job('no-record', NULL, 'accounts', '[{"id": 1, "revision": 1}]', 1,
    NULL, tenant_column => NULL, handler => 'same_item(jsonb)', record_before => true);
\echo :LAST_ERROR_SQLSTATE
-- and every item's row must exist when it is registered
SELECT * FROM etc_batch.register_job('no-record', NULL, 'accounts', '[{"id": 99, "revision": 1}]', 1,
    '{"plan": "standard"}', tenant_column => NULL, record_before => true);
\echo :LAST_ERROR_SQLSTATE

-- 6. A handler job reverts only by a handler that undoes its change.
CREATE FUNCTION bump_plan(item jsonb) RETURNS jsonb LANGUAGE sql AS $$
    UPDATE accounts SET plan = plan || '+', revision = revision + 1
     WHERE id = (item->>'id')::int AND revision = (item->>'revision')::bigint
    RETURNING jsonb_build_object('revision', revision) $$;
CREATE FUNCTION unbump_plan(item jsonb) RETURNS jsonb LANGUAGE sql AS $$
    UPDATE accounts SET plan = rtrim(plan, '+'), revision = revision + 1
     WHERE id = (item->>'id')::int AND revision = (item->>'revision')::bigint
    RETURNING jsonb_build_object('revision', revision) $$;
SELECT * FROM etc_batch.register_job('bump', NULL, 'accounts',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM accounts), 4,
    NULL, tenant_column => NULL, handler => 'bump_plan(jsonb)');
CALL etc_batch.drain_job('bump');
SELECT * FROM etc_batch.register_revert('bump', 'unbump');
\echo :LAST_ERROR_SQLSTATE
SELECT items, drifted, gone, set_back, inverse FROM etc_batch.revert_preview('bump', inverse => 'unbump_plan(jsonb)');
SELECT * FROM etc_batch.register_revert('bump', 'unbump', inverse => 'unbump_plan(jsonb)');
CALL etc_batch.drain_job('unbump');
SELECT id, plan, revision FROM accounts ORDER BY id;

-- 7. Nothing to revert, and the rest of the refusals.
SELECT * FROM etc_batch.register_job('untouched', 'spring', 'orders',
    '[{"id": 9, "revision": 1}]', 1, '{"note": "x"}', '{"note": null}');
SELECT * FROM etc_batch.register_revert('untouched', 'untouched-back');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_revert('no-such-job', 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_revert('cancel-festival', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_revert('untouched', 'x', inverse => 'unbump_plan(jsonb)');
\echo :LAST_ERROR_SQLSTATE
