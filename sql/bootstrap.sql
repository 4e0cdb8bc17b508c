-- Loaded first: the check of the schema etc_batch installs into, and the domains of the
-- states its tables keep (src/status.rs has them as Rust enums).
--
-- Every table of etc_batch belongs to the extension's owner. Nobody else is granted any
-- write privilege on them: etc_batch's functions write them as the owner, and that is
-- what makes "who added this step" trustworthy. Reading them is granted explicitly (see
-- docs/security.md, "Privileges").

-- CREATE EXTENSION puts etc_batch into a schema named etc_batch that already exists. One
-- made beforehand by another role would let that role drop and replace etc_batch's
-- objects, which run as their owner: refuse to install there.
DO $guard$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_namespace n
                WHERE n.nspname OPERATOR(pg_catalog.=) 'etc_batch'
                  AND n.nspowner OPERATOR(pg_catalog.<>)
                      (SELECT r.oid FROM pg_catalog.pg_roles r
                        WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER)) THEN
        RAISE EXCEPTION 'schema "etc_batch" already exists and belongs to another role'
            USING ERRCODE = '42501',
                  DETAIL = 'Its owner could replace the extension''s objects.',
                  HINT = 'Drop the schema, or make the installing role its owner, and create the extension again.';
    END IF;
END
$guard$;

-- The states a step, an attempt and a job can be in. Domains rather than CHECK
-- constraints on the tables: these rows are written at every step and chunk, and a
-- domain's check is kept parsed, where a table's CHECK is read back for every statement.
CREATE DOMAIN etc_batch.step_status AS text CHECK (VALUE IN ('pending', 'done', 'failed'));
CREATE DOMAIN etc_batch.attempt_outcome AS text
    CHECK (VALUE IN ('done', 'failed', 'skipped', 'timed_out', 'retried'));
CREATE DOMAIN etc_batch.job_status AS text
    CHECK (VALUE IN ('pending', 'done', 'conflict', 'corrupt', 'aborted', 'continued', 'reverted'));
