-- Computed backfills: columns set to an SQL expression over the row's own columns
-- (set_expressions), checked when the job is registered, kept as PostgreSQL prints them
-- back and evaluated in each chunk's one guarded UPDATE; their values before recorded
-- with each item, so that a revert sets them back row by row. docs/jobs.md quotes this
-- file's output.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never
SET TimeZone = 'UTC';

-- A plain table: a uuid key, no tenant, no revision column (a digest of each row
-- guards it).
CREATE TABLE invoices (
    id          uuid PRIMARY KEY,
    total       numeric(10,2) NOT NULL,
    email       text NOT NULL,
    total_cents bigint,
    email_lower text);
INSERT INTO invoices (id, total, email)
SELECT ('00000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid, g * 10.25,
       'Buyer' || g || '@Example.COM'
  FROM generate_series(1, 7) g;

-- 1. The backfill, approved from a query. What is kept is the expressions as
-- PostgreSQL prints them back, every column read from the row the chunk changes (t),
-- and in each item the values the row held before.
SELECT * FROM etc_batch.register_job_from_query('backfill-cents', NULL, 'invoices',
    $$SELECT id FROM invoices$$, 3, NULL,
    tenant_column => NULL, revision_column => NULL, on_drift => 'skip',
    set_expressions => '{"total_cents": "round(total * 100)::bigint", "email_lower": "lower(email)"}');
SELECT set_values, set_expressions, guard, record_before FROM etc_batch.job
 WHERE job_id = 'backfill-cents';
SELECT position, item_key, guards FROM etc_batch.job_item
 WHERE job_id = 'backfill-cents' ORDER BY position;

-- The same request again changes nothing; the same job id with another expression is
-- another approval, refused.
SELECT * FROM etc_batch.register_job_from_query('backfill-cents', NULL, 'invoices',
    $$SELECT id FROM invoices$$, 3, NULL,
    tenant_column => NULL, revision_column => NULL, on_drift => 'skip',
    set_expressions => '{"total_cents": "round(total * 100)::bigint", "email_lower": "lower(email)"}');
SELECT * FROM etc_batch.register_job_from_query('backfill-cents', NULL, 'invoices',
    $$SELECT id FROM invoices$$, 3, NULL,
    tenant_column => NULL, revision_column => NULL, on_drift => 'skip',
    set_expressions => '{"total_cents": "trunc(total * 100)::bigint", "email_lower": "lower(email)"}');
\echo :LAST_ERROR_SQLSTATE

-- The application changes invoice 4 before the drain: its row is not the one
-- approved, and it is skipped (on_drift => 'skip'), never computed from what it
-- holds now.
UPDATE invoices SET total = 99.99 WHERE id = '00000000-0000-0000-0000-000000000004';
CALL etc_batch.drain_job('backfill-cents');
SELECT id, total, total_cents, email_lower FROM invoices ORDER BY id;
SELECT status, approved, committed, matching, skipped FROM etc_batch.job_summary('backfill-cents');
SELECT position, item_key, state FROM etc_batch.job_report('backfill-cents');
SELECT check_name, ok FROM etc_batch.verify_job('backfill-cents') ORDER BY check_name;

-- 2. The revert: each committed row's columns set back to what it held before.
SELECT items, drifted, gone, set_back, set_back_per_item, expected
  FROM etc_batch.revert_preview('backfill-cents');
SELECT * FROM etc_batch.register_revert('backfill-cents', 'unfill-cents');
CALL etc_batch.drain_job('unfill-cents');
SELECT id, total, total_cents, email_lower FROM invoices ORDER BY id;
SELECT check_name, ok FROM etc_batch.verify_job('unfill-cents') ORDER BY check_name;

-- 3. The revert of the revert computes them again, from the rows as they are.
SELECT items, set_back, set_back_per_item FROM etc_batch.revert_preview('unfill-cents');
SELECT * FROM etc_batch.register_revert('unfill-cents', 'refill-cents');
SELECT set_values, set_expressions, set_from_items FROM etc_batch.job WHERE job_id = 'refill-cents';
CALL etc_batch.drain_job('refill-cents');
SELECT id, total, total_cents, email_lower FROM invoices ORDER BY id;
SELECT job_id, status, reverts, reverted_by FROM etc_batch.job ORDER BY job_id;

-- 4. set_values and set_expressions in one job; a row changed during the drain stops
-- a job with on_drift 'stop' in conflict, as for set_values.
ALTER TABLE invoices ADD COLUMN state text NOT NULL DEFAULT 'draft';
SELECT * FROM etc_batch.register_job('issue', NULL, 'invoices',
    (SELECT jsonb_agg(jsonb_build_object('id', id) ORDER BY id) FROM invoices), 4,
    '{"state": "issued"}', tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"email_lower": "lower(email) || ''#'' || state"}');
SELECT set_values, set_expressions FROM etc_batch.job WHERE job_id = 'issue';
CALL etc_batch.drain_job('issue', 1);
UPDATE invoices SET email = 'changed@example.com' WHERE id = '00000000-0000-0000-0000-000000000006';
CALL etc_batch.drain_job('issue');
\echo :LAST_ERROR_SQLSTATE
SELECT id, state, email_lower FROM invoices ORDER BY id;
SELECT status, committed FROM etc_batch.job_summary('issue');

-- 5. Refusals, each before anything is stored.
-- not one expression: a second statement, a FROM, a second value
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "1); DELETE FROM invoices; SELECT (1"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "count(*)) FROM pg_class WHERE (true"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "1), (2"}');
\echo :LAST_ERROR_SQLSTATE
-- a subquery, an aggregate, a window function, a set-returning function
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "(SELECT max(total_cents) FROM invoices)"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "sum(total)::bigint"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "row_number() OVER ()"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "generate_series(1, 2)"}');
\echo :LAST_ERROR_SQLSTATE
-- a volatile function
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "(random() * 100)::bigint"}');
\echo :LAST_ERROR_SQLSTATE
-- another table's column
CREATE TABLE rates (currency text PRIMARY KEY, rate numeric);
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "(total * rates.rate)::bigint"}');
\echo :LAST_ERROR_SQLSTATE
-- a type UPDATE does not assign to the column
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "email"}');
\echo :LAST_ERROR_SQLSTATE
-- a column both set and computed; the key; the text of no expression
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    '{"total_cents": 0}', tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "round(total * 100)::bigint"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"id": "gen_random_uuid()"}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.register_job_from_query('bad', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": 100}');
\echo :LAST_ERROR_SQLSTATE
-- a function the registering role may not execute
CREATE FUNCTION cents_of(numeric) RETURNS bigint IMMUTABLE LANGUAGE sql
    AS $$SELECT round($1 * 100)::bigint$$;
REVOKE ALL ON FUNCTION cents_of(numeric) FROM PUBLIC;
CREATE ROLE billing_clerk;
GRANT USAGE ON SCHEMA etc_batch TO billing_clerk;
GRANT EXECUTE ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO billing_clerk;
GRANT SELECT, UPDATE ON invoices TO billing_clerk;
SET ROLE billing_clerk;
SELECT * FROM etc_batch.register_job_from_query('clerk-cents', NULL, 'invoices', $$SELECT id FROM invoices$$, 3,
    NULL, tenant_column => NULL, revision_column => NULL,
    set_expressions => '{"total_cents": "cents_of(total)"}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS jobs_named_bad FROM etc_batch.job WHERE job_id IN ('bad', 'clerk-cents');
DROP OWNED BY billing_clerk;
DROP ROLE billing_clerk;
