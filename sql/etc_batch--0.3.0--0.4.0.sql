-- etc_batch 0.3.0 -> 0.4.0. Run by ALTER EXTENSION etc_batch UPDATE; never edit it once
-- 0.4.0 is released: later changes go into a script of their own.
\echo Use "ALTER EXTENSION etc_batch UPDATE" to load this file. \quit

-- A parallel job's chunk rows are written by the library, with the seals it computes
-- (src/job/seal.rs); the function only attaches a job's partitions.
DROP FUNCTION etc_batch.attach_job_tables(bigint, text, integer);
CREATE FUNCTION etc_batch.attach_job_tables(job_number bigint, job_id text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('etc_batch.%I', 'job_chunk_' || job_number)) IS NOT NULL THEN
        EXECUTE format('ALTER TABLE etc_batch.job_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                       'job_chunk_' || job_number, job_id);
    END IF;
    EXECUTE format('ALTER TABLE etc_batch.job_item_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                   'job_item_chunk_' || job_number, job_id);
    EXECUTE format('ALTER TABLE etc_batch.job_audit_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                   'job_audit_chunk_' || job_number, job_id);
END
$$;
REVOKE ALL ON FUNCTION etc_batch.attach_job_tables(bigint, text) FROM PUBLIC;

-- Jobs on any table: a key of one or more columns, no tenant, no revision column (a row
-- digest or the named columns guard the rows), drifted items skipped when the approval
-- says so, a job continued as another, a failure kept where the views show it.
ALTER DOMAIN etc_batch.job_status DROP CONSTRAINT job_status_check;
ALTER DOMAIN etc_batch.job_status ADD CONSTRAINT job_status_check
    CHECK (VALUE IN ('pending', 'done', 'conflict', 'corrupt', 'aborted', 'continued', 'reverted'));

-- job_progress reads every column of job: made again below, with the grants it has now
-- (kept meanwhile in a setting of this transaction).
SELECT pg_catalog.set_config('etc_batch_update.job_progress_acl',
                             COALESCE((SELECT c.relacl::text FROM pg_catalog.pg_class c
                                        WHERE c.oid = 'etc_batch.job_progress'::regclass), '{}'), true);
DROP VIEW etc_batch.job_progress;

-- The signals of the whole system a job's pace yields to, and the reason of a pause
-- etc_batch made itself for a critical one (src/job/pace.rs).
ALTER TABLE etc_batch.job_pace
    ADD COLUMN max_archive_backlog integer CHECK (max_archive_backlog >= 0),
    ADD COLUMN yield_to_vacuum boolean NOT NULL DEFAULT false,
    ADD COLUMN windows text[],
    ADD COLUMN time_zone text,
    ADD COLUMN throttle_query text,
    ADD COLUMN pause_above_replica_lag_bytes bigint CHECK (pause_above_replica_lag_bytes >= 0),
    ADD COLUMN pause_above_archive_backlog integer CHECK (pause_above_archive_backlog >= 0),
    ADD COLUMN critical_query text;
COMMENT ON TABLE etc_batch.job_pace IS
    'The pace set by pace_job: rows per second for all drainers of the job together, and how many WAL bytes the slowest standby or replication slot may be behind before drainers wait. next_slot is when the next chunk may start. The signals drainers wait for: WAL segments waiting to be archived, a VACUUM of the target, the windows (in time_zone) and a throttle query; and those that pause the job: a replica lag, an archive backlog, a critical query.';
ALTER TABLE etc_batch.job_pause ADD COLUMN reason text;
CREATE TABLE etc_batch.job_wait (
    job_id     text   NOT NULL,
    waited_for text   NOT NULL,
    waits      bigint NOT NULL,
    seconds    float8 NOT NULL,
    PRIMARY KEY (job_id, waited_for)
);

COMMENT ON TABLE etc_batch.job_wait IS
    'How often and how long a job''s drainers waited for the signals of its pace, per kind (replicas, archiving, vacuum, windows, throttle_query), added up at the end of each wait: the metrics'' etc_batch_job_waited_seconds and etc_batch_job_waited_waits.';
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_wait', '');
REVOKE ALL ON etc_batch.job_wait FROM PUBLIC;
COMMENT ON TABLE etc_batch.job_pause IS
    'The jobs paused by pause_job, when and by whom, or by etc_batch itself for a critical signal of their pace, with the reason: their drainers stop before their next chunk and return with status paused, until resume_job.';

-- A handler is kept by its name, which pg_upgrade keeps, not by a regprocedure, an OID
-- pg_upgrade refuses to carry over (it stops at any reg* column but regclass, regrole and
-- regtype); the names are written below.
ALTER TABLE etc_batch.job
    ALTER COLUMN handler TYPE text USING handler::pg_catalog.oid::pg_catalog.text,
    ALTER COLUMN tenant DROP NOT NULL,
    ALTER COLUMN tenant_column DROP NOT NULL,
    ALTER COLUMN revision_column DROP NOT NULL,
    ADD COLUMN key_columns name[],
    ADD COLUMN guard text NOT NULL DEFAULT 'revision'
        CHECK (guard IN ('revision', 'row', 'columns')),
    ADD COLUMN on_drift text NOT NULL DEFAULT 'stop' CHECK (on_drift IN ('stop', 'skip')),
    ADD COLUMN target_name text,
    ADD COLUMN continued_as text,
    ADD COLUMN failed_at timestamptz,
    ADD COLUMN failure_sqlstate text,
    ADD COLUMN failure_message text,
    ADD COLUMN failure_chunk integer,
    ADD COLUMN seconds_at_work float8 NOT NULL DEFAULT 0,
    ADD COLUMN chunk_seconds float8,
    ADD COLUMN reverts text,
    ADD COLUMN reverted_by text,
    ADD COLUMN record_before boolean NOT NULL DEFAULT false,
    ADD COLUMN set_from_items name[] NOT NULL DEFAULT '{}';
-- a job from before named its key by one column, and its target lives; its handler (a
-- function dropped since is named as one no function is, so that the job stays stopped)
UPDATE etc_batch.job j
   SET key_columns = ARRAY[key_column],
       handler = CASE WHEN j.handler IS NOT NULL THEN
           COALESCE((SELECT pg_catalog.format('%I.%I(pg_catalog.jsonb)', n.nspname, p.proname)
                       FROM pg_catalog.pg_proc p
                       JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                      WHERE p.oid OPERATOR(pg_catalog.=) j.handler::pg_catalog.oid),
                    pg_catalog.format('pg_catalog.%I(pg_catalog.jsonb)', 'dropped handler ' OPERATOR(pg_catalog.||) j.handler)) END,
       target_name = target::text,
       seconds_at_work = COALESCE(EXTRACT(epoch FROM last_commit_at - started_at), 0);
ALTER TABLE etc_batch.job
    ALTER COLUMN key_columns SET NOT NULL,
    ALTER COLUMN target_name SET NOT NULL,
    DROP COLUMN key_column;

COMMENT ON COLUMN etc_batch.job.handler IS
    'A handler job''s function, by its schema-qualified name and argument (schema.name(pg_catalog.jsonb)), found by that name when a chunk runs: a name survives pg_upgrade, which keeps no function''s OID. A handler dropped, renamed or moved after registration stops the job before it changes anything.';

ALTER TABLE etc_batch.job_audit
    ADD COLUMN skipped boolean NOT NULL DEFAULT false,
    ADD COLUMN found jsonb;
ALTER TABLE etc_batch.job_chunk ADD COLUMN started_at timestamptz;
ALTER TABLE etc_batch.job_chunk ADD COLUMN chunk_seconds float8;

-- Launches (new): work the server finishes by itself. launch_job and launch_batch start
-- background workers that drain a job or run a chain to the end with no client session
-- held (src/launch). A launch is a row here, written in the launching transaction: its
-- workers act only once that transaction has committed, and a launch rolled back runs
-- nothing. Every start of a worker is a run, with its outcome, in the shape of pg_cron's
-- job_run_details.

CREATE TABLE etc_batch.launch (
    launch_id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id              text,
    step_id             bigint,
    workers             integer     NOT NULL CHECK (workers > 0),
    launched_by         regrole     NOT NULL,
    launched_at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- the launching transaction, which its workers wait for before they act
    launching_xid       xid8        NOT NULL,
    -- what a NOTICE of the work would have reached the launching client at, and so
    -- reaches the server log at
    client_min_messages text        NOT NULL,
    status              text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'done', 'paused', 'conflict', 'failed', 'stopped')),
    stopped_by          regrole,
    ended_at            timestamptz,
    CHECK ((job_id IS NULL) <> (step_id IS NULL))
);

COMMENT ON TABLE etc_batch.launch IS
    'Work launched to run in background workers: a job''s drain (job_id) or a chain from a step (step_id), by how many workers, by whom and when; running until its work ends (done, paused, in conflict, failed) or stop_launch stops it. Its workers act only once the launching transaction (launching_xid) has committed.';

CREATE TABLE etc_batch.launch_run (
    launch_id  bigint      NOT NULL REFERENCES etc_batch.launch ON DELETE CASCADE,
    worker     integer     NOT NULL,
    run        integer     NOT NULL,
    pid        integer     NOT NULL,
    -- who started this run: the launch itself, or, once an earlier process of the worker
    -- ended without saying how (terminated, a crash, a restart) or a pause of its work
    -- ended, its database's supervisor or resume_launches
    started_by text        NOT NULL CHECK (started_by IN ('launch', 'resume')),
    started_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    ended_at   timestamptz,
    outcome    text CHECK (outcome IN ('done', 'pending', 'paused', 'conflict', 'failed', 'stopped',
                                       'interrupted')),
    sqlstate   text,
    message    text,
    PRIMARY KEY (launch_id, worker, run)
);

COMMENT ON TABLE etc_batch.launch_run IS
    'Every start of a launch''s worker: which of its workers, the how-many-th start of it, the pid, who started it and when, when it ended and how: done, pending (the chunks left were all held by its fellow workers), paused, conflict, failed (with the SQLSTATE and message), stopped, or interrupted (its process ended without saying: terminated, a crash, a restart).';

-- A launch and its runs as pg_cron's job_run_details shows them. Each role sees the
-- launches of roles whose privileges it has; a reader of etc_batch.launch sees all.
CREATE VIEW etc_batch.launches WITH (security_barrier) AS
SELECT l.launch_id, r.worker, r.run, l.job_id, l.step_id,
       l.launched_by AS role, pg_catalog.current_database() AS database,
       r.pid, r.started_by, r.started_at, r.ended_at, r.outcome, r.sqlstate, r.message,
       l.status AS launch_status, l.workers
  FROM etc_batch.launch l
  LEFT JOIN etc_batch.launch_run r ON r.launch_id OPERATOR(pg_catalog.=) l.launch_id
 WHERE pg_catalog.has_table_privilege('etc_batch.launch', 'SELECT')
    OR pg_catalog.pg_has_role(l.launched_by::pg_catalog.oid, 'USAGE');

COMMENT ON VIEW etc_batch.launches IS
    'Every run of every launch''s workers, in the shape of pg_cron''s job_run_details: launch, worker, run, job or chain, role, database, pid, who started it, when it started and ended, its outcome, SQLSTATE and message, and the launch''s status. Shows the launches of roles whose privileges the reader has, or all of them to a reader of etc_batch.launch.';

SELECT pg_catalog.pg_extension_config_dump('etc_batch.launch', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.launch_run', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.launch_launch_id_seq', '');
REVOKE ALL ON etc_batch.launch, etc_batch.launch_run, etc_batch.launches FROM PUBLIC;
GRANT SELECT ON etc_batch.launches TO PUBLIC;

CREATE FUNCTION etc_batch.launch_job(
    job_id text, workers integer DEFAULT 1)
RETURNS TABLE (launch_id bigint, workers integer, pids integer[])
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'launch_job_wrapper';
CREATE FUNCTION etc_batch.launch_batch(step_id bigint)
RETURNS TABLE (launch_id bigint, workers integer, pids integer[])
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'launch_batch_wrapper';
CREATE FUNCTION etc_batch.stop_launch(launch_id bigint)
RETURNS boolean
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'stop_launch_wrapper';
CREATE FUNCTION etc_batch.resume_launches()
RETURNS TABLE (launch_id bigint, worker integer, pid integer)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'resume_launches_wrapper';
-- Launches
COMMENT ON FUNCTION etc_batch.launch_job(text, integer) IS
    'Starts background workers that drain a job to the end with no client session held (one for a sequential job, any number for a parallel one); they act once the calling transaction commits. Returns the launch id and the workers'' pids.';
COMMENT ON FUNCTION etc_batch.launch_batch(bigint) IS
    'Starts a background worker that runs a chain from a step to its end, as exec_batch_from_id would, with no client session held; it acts once the calling transaction commits.';
COMMENT ON FUNCTION etc_batch.stop_launch(bigint) IS
    'Stops a launch: its workers end after the chunk or step in flight. Returns whether it was running.';
COMMENT ON FUNCTION etc_batch.resume_launches() IS
    'Starts again the workers of this database''s running launches that are not at work, and its supervisor if none runs: what the launcher does after a restart when etc_batch is preloaded.';
REVOKE ALL ON FUNCTION etc_batch.launch_job(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.launch_batch(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.stop_launch(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.resume_launches() FROM PUBLIC;

-- register_job and register_job_from_query take a key of several columns, a guard and
-- what to do with a drifted item, and name the key by the primary key unless told;
-- job_summary counts skipped items and shows the last failure: made again, with the
-- EXECUTE grants they had.
DO $remake$
DECLARE
    old regprocedure;
    grantees regrole[];
    g regrole;
    grant_sql text;
    signatures constant text[][] := ARRAY[
        ['etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean)',
         'etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean)'],
        ['etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean)',
         'etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean)'],
        ['etc_batch.job_summary(text)', 'etc_batch.job_summary(text)'],
        ['etc_batch.pace_job(text, integer, bigint)',
         'etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text)']];
    grants text[] := '{}';
BEGIN
    FOR i IN 1 .. array_length(signatures, 1) LOOP
        old := signatures[i][1]::regprocedure;
        SELECT array_agg(DISTINCT a.grantee::regrole) INTO grantees
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = old AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
           AND a.grantee <> 0;
        FOREACH g IN ARRAY coalesce(grantees, '{}') LOOP
            grants := grants || format('GRANT EXECUTE ON FUNCTION %s TO %s', signatures[i][2], g);
        END LOOP;
        EXECUTE 'DROP FUNCTION ' || old::text;
    END LOOP;
    EXECUTE $ddl$
CREATE FUNCTION etc_batch.register_job(
    job_id text, tenant text, target regclass, items jsonb, chunk_size integer,
    set_values jsonb, expect jsonb DEFAULT '{}', key_column name DEFAULT NULL,
    tenant_column name DEFAULT 'tenant', revision_column name DEFAULT 'revision',
    handler regprocedure DEFAULT NULL, parallel boolean DEFAULT false,
    key_columns name[] DEFAULT NULL, guard text DEFAULT NULL, on_drift text DEFAULT 'stop',
    record_before boolean DEFAULT false)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_wrapper';
COMMENT ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean) IS
    'Freezes an approved list of items for a job on any table with a primary key or unique index (a tenant, a revision column and a key of one column are optional), whose chunks commit in order or, with parallel, in any order by many drainers; on_drift says whether a drifted row stops the job or is skipped; the same request again changes nothing, a different one under the same job id is refused.';
REVOKE ALL ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean) FROM PUBLIC;

CREATE FUNCTION etc_batch.register_job_from_query(
    job_id text, tenant text, target regclass, items_query text, chunk_size integer,
    set_values jsonb, expect jsonb DEFAULT '{}', key_column name DEFAULT NULL,
    tenant_column name DEFAULT 'tenant', revision_column name DEFAULT 'revision',
    handler regprocedure DEFAULT NULL, parallel boolean DEFAULT false,
    key_columns name[] DEFAULT NULL, guard text DEFAULT NULL, on_drift text DEFAULT 'stop',
    record_before boolean DEFAULT false)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_from_query_wrapper';
COMMENT ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean) IS
    'Freezes the rows of a SELECT, run once as the registering role in one snapshot, as the approved items of a job; otherwise as register_job.';
REVOKE ALL ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean) FROM PUBLIC;

CREATE FUNCTION etc_batch.job_summary(job_id text)
RETURNS TABLE (status text, approved integer, committed integer, unprocessed integer,
               matching integer, drifted integer, missing integer, parallel boolean,
               skipped integer, failed_at timestamptz, failure_sqlstate text,
               failure_message text)
STABLE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'job_summary_wrapper';
COMMENT ON FUNCTION etc_batch.job_summary(text) IS
    'A job''s status, its items counted by state, and when and how its last drain failed for a reason other than a conflict. Shown to the role that registered the job (and its members) and to readers of etc_batch.job.';
REVOKE ALL ON FUNCTION etc_batch.job_summary(text) FROM PUBLIC;

CREATE FUNCTION etc_batch.pace_job(
    job_id text, rows_per_second integer DEFAULT NULL, max_replica_lag_bytes bigint DEFAULT NULL,
    max_archive_backlog integer DEFAULT NULL, yield_to_vacuum boolean DEFAULT false,
    windows text[] DEFAULT NULL, time_zone text DEFAULT NULL, throttle_query text DEFAULT NULL,
    pause_above_replica_lag_bytes bigint DEFAULT NULL, pause_above_archive_backlog integer DEFAULT NULL,
    critical_query text DEFAULT NULL)
RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'pace_job_wrapper';
COMMENT ON FUNCTION etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text) IS
    'Sets a job''s whole pace: rows per second for all its drainers together, the signals they wait for (replica lag, WAL archive backlog, a VACUUM of the table, windows, a throttle query) and those that pause the job (pause_above_replica_lag_bytes, pause_above_archive_backlog, critical_query); what a call does not name has no limit afterwards, and pace_job(job_id) clears it all. Not part of the approval.';
REVOKE ALL ON FUNCTION etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text) FROM PUBLIC;
$ddl$;
    FOREACH grant_sql IN ARRAY grants LOOP
        EXECUTE grant_sql;
    END LOOP;
END
$remake$;

-- The role that registered a job reads it in job_progress, job_summary and job_report
-- with no further grant: its job's partitions are granted to it, and the reports show
-- a job to its registrant and to readers of etc_batch.job, so PUBLIC may call them.
CREATE OR REPLACE FUNCTION etc_batch.create_job_tables(job_number bigint, job_id text, registrant regrole,
                                            parallel boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    items text := 'job_item_chunk_' || job_number;
    audit text := 'job_audit_chunk_' || job_number;
BEGIN
    -- each keyed by both ends: a chunk's row found from its first position (where the
    -- checkpoint stands) or its last (the row that holds a position; whether any audit
    -- lies at or beyond a position)
    EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_item_chunk INCLUDING CONSTRAINTS,
                        CHECK (job_id = %L), PRIMARY KEY (first_position), UNIQUE (last_position))',
                   items, job_id);
    EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_audit_chunk INCLUDING CONSTRAINTS,
                        CHECK (job_id = %L), PRIMARY KEY (first_position), UNIQUE (last_position))',
                   audit, job_id);
    EXECUTE format('CREATE TRIGGER job_item_truncated AFTER TRUNCATE ON etc_batch.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes(%L, %L)',
                   items, 'item_changes', job_id);
    EXECUTE format('CREATE TRIGGER job_audit_truncated AFTER TRUNCATE ON etc_batch.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes(%L, %L)',
                   audit, 'audit_changes', job_id);
    EXECUTE format('GRANT SELECT ON etc_batch.%I, etc_batch.%I TO %s', items, audit, registrant);
    IF parallel THEN
        -- half of each page left free: a chunk's row is changed once, as a HOT update
        EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_chunk INCLUDING CONSTRAINTS
                            INCLUDING DEFAULTS, CHECK (job_id = %L), PRIMARY KEY (chunk))
                            WITH (fillfactor = 50)', 'job_chunk_' || job_number, job_id);
        EXECUTE format('GRANT SELECT ON etc_batch.%I TO %s', 'job_chunk_' || job_number, registrant);
    END IF;
END
$$;

DO $grants$
DECLARE
    existing record;
BEGIN
    FOR existing IN
        SELECT x.job_number, x.registered_by, x.parallel
          FROM etc_batch.job x
          JOIN pg_catalog.pg_roles r ON r.oid = x.registered_by
    LOOP
        IF pg_catalog.to_regclass(format('etc_batch.%I', 'job_audit_' || existing.job_number)) IS NOT NULL THEN
            EXECUTE format('GRANT SELECT ON etc_batch.%I TO %s', 'job_audit_' || existing.job_number,
                           existing.registered_by::regrole);
        END IF;
        IF existing.parallel
           AND pg_catalog.to_regclass(format('etc_batch.%I', 'job_chunk_' || existing.job_number)) IS NOT NULL THEN
            EXECUTE format('GRANT SELECT ON etc_batch.%I TO %s', 'job_chunk_' || existing.job_number,
                           existing.registered_by::regrole);
        END IF;
    END LOOP;
END
$grants$;
COMMENT ON FUNCTION etc_batch.job_report(text) IS
    'Every approved item of a job: unprocessed, skipped, or committed and now matching, drifted or missing. Shown to the role that registered the job (and its members) and to readers of etc_batch.job.';
GRANT EXECUTE ON FUNCTION etc_batch.job_report(text), etc_batch.job_summary(text) TO PUBLIC;

-- The new columns, as a fresh install comments them.
COMMENT ON COLUMN etc_batch.job.key_columns IS
    'The columns an approved item names its row by: the target''s primary key or a unique index of it (less the tenant column), one column or several.';
COMMENT ON COLUMN etc_batch.job.guard IS
    'How a row is recognised as unchanged since it was approved: revision (the revision column is still at the approved revision; the change increments it), row (a digest of every column of the row, taken at registration), columns (only the guard columns the items name and expect).';
COMMENT ON COLUMN etc_batch.job.on_drift IS
    'What a row that drifted or went away does to the job: stop (the job stops in conflict for a person to decide) or skip (the item is left unchanged, recorded in the audit as skipped with what was found, and the job goes on).';
COMMENT ON COLUMN etc_batch.job.target_name IS 'The target as it was named when the job was registered, for messages once it is gone.';
COMMENT ON COLUMN etc_batch.job.reverts IS
    'For a revert registered by register_revert: the job whose committed items it sets back.';
COMMENT ON COLUMN etc_batch.job.reverted_by IS
    'For a job reverted (status reverted): the job registered to set its committed items back.';
COMMENT ON COLUMN etc_batch.job.record_before IS
    'Whether registration recorded, in each approved item''s guards, the values its row held then in the columns the job sets (register_job''s record_before): guarded like any guard, they are exactly what the change replaced, and what register_revert sets back.';
COMMENT ON COLUMN etc_batch.job.set_from_items IS
    'For a revert of a job that recorded its values before: the columns set to each item''s own value, which its item carries in job_item.guards under the column''s name (not a guard: what the revert sets).';
COMMENT ON COLUMN etc_batch.job.continued_as IS 'For a job that ended continued: the job its remaining items were approved as (register_remainder).';
COMMENT ON COLUMN etc_batch.job.failed_at IS
    'When a drain of the job last failed for a reason other than a conflict (a constraint, a trigger, a permission, a timeout), with failure_sqlstate, failure_message and failure_chunk; the chunk was rolled back and the job is still pending.';
COMMENT ON COLUMN etc_batch.job.seconds_at_work IS
    'Wall-clock seconds some drainer spent at work on the job, chunks and the waits between them, not time paused or with nobody draining: what the estimated finish is reckoned from.';
-- A drainer at work shows while it waits between chunks; the rate and the estimated
-- finish count only time at work; a failed drain, a skipped item, a continued job.
-- job_progress shows a job to the roles with the privileges of the one that registered
-- it, and every job to readers of etc_batch.job; it is a security barrier, so that no
-- function in a caller's WHERE sees the rows it hides.
CREATE VIEW etc_batch.job_progress WITH (security_barrier) AS
WITH p AS (
    -- A sequential job's progress is its checkpoint, on its row; a parallel job's is
    -- its committed chunks, in job_chunk (its row says nothing of it until it is done).
    -- Its drainers are the sessions in a drain_job of it: each holds a shared advisory
    -- lock of its own key space (objsubid 4, the job's number) for as long as the call
    -- lasts, waits between chunks included (src/session_lock.rs).
    SELECT j.*,
           CASE WHEN j.parallel THEN c.items ELSE j.next_index END AS committed_items,
           CASE WHEN j.parallel THEN c.chunks ELSE j.chunks_committed END AS committed_chunks,
           CASE WHEN j.parallel THEN c.first_commit ELSE j.started_at END AS first_commit,
           CASE WHEN j.parallel THEN c.last_commit ELSE j.last_commit_at END AS last_commit,
           CASE WHEN j.parallel THEN c.worked ELSE j.seconds_at_work END AS worked,
           d.pids
      FROM etc_batch.job j
      LEFT JOIN LATERAL (
            SELECT (pg_catalog.count(*) FILTER (WHERE c.committed))::pg_catalog.int4 AS chunks,
                   -- OPERATOR() forms all share one precedence: the parentheses are the order
                   COALESCE(pg_catalog.sum(LEAST(j.chunk_size, j.item_count OPERATOR(pg_catalog.-)
                                ((c.chunk OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) j.chunk_size)))
                            FILTER (WHERE c.committed), 0)::pg_catalog.int4 AS items,
                   pg_catalog.min(c.committed_at) AS first_commit,
                   pg_catalog.max(c.committed_at) AS last_commit,
                   -- time some drainer was at work: each chunk's own, from when its
                   -- drainer began it or the chunk committed before it, whichever is later
                   COALESCE(pg_catalog.sum(c.worked), 0) AS worked
              FROM (SELECT c.*, pg_catalog.date_part('epoch', c.committed_at OPERATOR(pg_catalog.-)
                               GREATEST(c.started_at, pg_catalog.lag(c.committed_at) OVER (ORDER BY c.committed_at),
                                        c.committed_at OPERATOR(pg_catalog.-) interval '1 hour')) AS worked
                      FROM etc_batch.job_chunk c
                     WHERE j.parallel AND c.job_id OPERATOR(pg_catalog.=) j.job_id AND c.committed) c) c ON true
      LEFT JOIN LATERAL (
            SELECT pg_catalog.array_agg(x.pid ORDER BY x.pid) AS pids
              FROM pg_catalog.pg_locks x
             WHERE x.locktype OPERATOR(pg_catalog.=) 'advisory' AND x.granted
               AND x.objsubid OPERATOR(pg_catalog.=) 4
               AND x.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                       WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
               AND x.classid OPERATOR(pg_catalog.=) (j.job_number OPERATOR(pg_catalog.>>) 32)::pg_catalog.oid
               AND x.objid OPERATOR(pg_catalog.=) (j.job_number OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.oid) d ON true
     WHERE pg_catalog.has_table_privilege('etc_batch.job', 'SELECT')
        OR pg_catalog.pg_has_role(j.registered_by::pg_catalog.oid, 'USAGE'))
SELECT p.job_id, p.status,
       p.committed_items AS committed,
       p.item_count AS approved,
       pg_catalog.round(100.0 OPERATOR(pg_catalog.*) p.committed_items OPERATOR(pg_catalog./) p.item_count, 1) AS percent,
       p.committed_chunks AS chunks_committed,
       ((p.item_count::pg_catalog.int8 OPERATOR(pg_catalog.+) p.chunk_size OPERATOR(pg_catalog.-) 1)
         OPERATOR(pg_catalog./) p.chunk_size)::pg_catalog.int4 AS chunks_total,
       p.first_commit AS started_at,
       p.last_commit AS last_commit_at,
       -- items per second of time at work: not time paused, nor with nobody draining
       CASE WHEN p.worked OPERATOR(pg_catalog.>) 0
            THEN pg_catalog.round((p.committed_items OPERATOR(pg_catalog./) p.worked)::pg_catalog.numeric, 1)
       END AS items_per_second,
       -- when the rest is done at that rate, from the last commit; unknown while paused
       CASE WHEN p.status OPERATOR(pg_catalog.=) 'pending' AND z.paused_at IS NULL
             AND p.worked OPERATOR(pg_catalog.>) 0 AND p.committed_items OPERATOR(pg_catalog.>) 0
            -- OPERATOR() forms all share one precedence: the parentheses are the order.
            THEN p.last_commit OPERATOR(pg_catalog.+)
                 pg_catalog.make_interval(secs => p.worked OPERATOR(pg_catalog.*)
                     ((p.item_count OPERATOR(pg_catalog.-) p.committed_items)::pg_catalog.float8
                      OPERATOR(pg_catalog./) p.committed_items))
       END AS estimated_finish,
       p.pids[1] AS drainer_pid,
       p.status_reason,
       p.parallel,
       COALESCE(pg_catalog.cardinality(p.pids), 0) AS drainers,
       COALESCE(p.pids, '{}') AS drainer_pids,
       z.paused_at,
       z.paused_by,
       z.reason AS pause_reason,
       c.rows_per_second,
       c.max_replica_lag_bytes,
       -- what a drainer waits for now, as its pg_stat_activity says
       (SELECT pg_catalog.min(pg_catalog.substr(a.query, 15, pg_catalog.strpos(a.query, ' */') OPERATOR(pg_catalog.-) 15))
          FROM pg_catalog.pg_stat_activity a
         WHERE pg_catalog.strpos(a.query, '/* etc_batch: job "' OPERATOR(pg_catalog.||) p.job_id
                                          OPERATOR(pg_catalog.||) '": ') OPERATOR(pg_catalog.=) 1
           AND (pg_catalog.strpos(a.query, '": waiting') OPERATOR(pg_catalog.>) 0
                OR pg_catalog.strpos(a.query, '": paced') OPERATOR(pg_catalog.>) 0
                OR pg_catalog.strpos(a.query, ' rolled back (') OPERATOR(pg_catalog.>) 0)) AS waiting,
       (SELECT pg_catalog.count(*) FROM etc_batch.job_retry r
         WHERE r.job_id OPERATOR(pg_catalog.=) p.job_id) AS retries,
       -- read on a hot standby: as of the WAL replayed there, with no drainer at work
       pg_catalog.pg_is_in_recovery() AS on_standby,
       pg_catalog.round(p.worked::pg_catalog.numeric, 1) AS seconds_at_work,
       p.failed_at,
       p.failure_sqlstate,
       p.failure_message,
       p.failure_chunk,
       p.on_drift,
       p.continued_as,
       w.launch_id,
       COALESCE(w.at_work, 0) AS launched_workers
  FROM p
  LEFT JOIN etc_batch.job_pause z ON z.job_id OPERATOR(pg_catalog.=) p.job_id
  LEFT JOIN etc_batch.job_pace c ON c.job_id OPERATOR(pg_catalog.=) p.job_id
  -- the job's launch that runs, and how many of its workers are at work: each holds the
  -- lock of its worker (advisory, objsubid 5, the launch's id shifted left 16 bits and
  -- the worker's number) while it lives (src/launch)
  LEFT JOIN LATERAL (
        SELECT l.launch_id,
               (SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks x
                 WHERE x.locktype OPERATOR(pg_catalog.=) 'advisory' AND x.granted
                   AND x.objsubid OPERATOR(pg_catalog.=) 5
                   AND x.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                           WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                   AND ((x.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) x.objid::pg_catalog.int8)
                       OPERATOR(pg_catalog.>>) 16 OPERATOR(pg_catalog.=) l.launch_id)::pg_catalog.int4 AS at_work
          FROM etc_batch.launch l
         WHERE l.job_id OPERATOR(pg_catalog.=) p.job_id AND l.status OPERATOR(pg_catalog.=) 'running'
         ORDER BY l.launch_id DESC LIMIT 1) w ON true;

COMMENT ON VIEW etc_batch.job_progress IS
    'Per job (the jobs of roles whose privileges the caller has, or all of them for a reader of etc_batch.job): status, items committed of approved, percent, chunks, when it started and last committed, its rate and an estimated finish reckoned from its time at work (not time paused or with nobody draining), whether chunks may commit in any order (parallel), the drainers in a drain_job of it now, waiting between chunks included: how many, and their pids; when and by whom it was paused (by etc_batch itself for a critical signal of its pace, with the reason), its pace, what its drainers wait for (a pace, the replicas, WAL archiving, a VACUUM, its windows, its throttle query, a retry), how many chunks were rolled back for a transient error and tried again (job_retry); on_standby: read on a hot standby, as of the WAL replayed there; the seconds at work; when its last drain failed for a reason other than a conflict, with what SQLSTATE and message, in which chunk; what the approval does with a drifted item; and for a job continued by register_remainder, its successor; the job''s launch that runs, and how many of its background workers are at work.';

GRANT SELECT ON etc_batch.job_progress TO PUBLIC;
DO $grants$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.grantee::regrole AS grantee, a.privilege_type, a.is_grantable
          FROM pg_catalog.aclexplode(pg_catalog.current_setting('etc_batch_update.job_progress_acl')::aclitem[]) a
         WHERE a.grantee <> 0
           AND a.grantee <> (SELECT c.relowner FROM pg_catalog.pg_class c
                              WHERE c.oid = 'etc_batch.job_progress'::regclass)
    LOOP
        EXECUTE format('GRANT %s ON etc_batch.job_progress TO %s%s', g.privilege_type, g.grantee,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$grants$;

-- chain_progress names the chain's launch that runs.
CREATE OR REPLACE VIEW etc_batch.chain_progress AS
WITH running AS (
    SELECT b.id, x.pid
      FROM etc_batch.batch_log b
      JOIN pg_catalog.pg_locks x
        ON x.locktype OPERATOR(pg_catalog.=) 'transactionid' AND x.granted
       AND x.transactionid OPERATOR(pg_catalog.=) b.xmax)
SELECT b.batch,
       pg_catalog.count(*)::pg_catalog.int4 AS steps,
       (pg_catalog.count(*) FILTER (WHERE b.status OPERATOR(pg_catalog.=) 'done'))::pg_catalog.int4 AS done,
       (pg_catalog.count(*) FILTER (WHERE b.status OPERATOR(pg_catalog.=) 'failed'))::pg_catalog.int4 AS failed,
       (pg_catalog.count(*) FILTER (WHERE b.status OPERATOR(pg_catalog.=) 'pending'))::pg_catalog.int4 AS pending,
       pg_catalog.min(r.id) AS current_step,
       pg_catalog.min(r.pid) AS current_pid,
       pg_catalog.max(b.finished_at) AS last_finished_at,
       (pg_catalog.array_agg(pg_catalog.format('step %s: %s', b.id, b.last_error)
                             ORDER BY b.finished_at DESC NULLS LAST)
            FILTER (WHERE b.status OPERATOR(pg_catalog.=) 'failed'))[1] AS last_error,
       pg_catalog.min(b.paused_at) AS paused_at,
       (pg_catalog.array_agg(b.paused_by ORDER BY b.paused_at) FILTER (WHERE b.paused_at IS NOT NULL))[1] AS paused_by,
       pg_catalog.pg_is_in_recovery() AS on_standby,
       (SELECT pg_catalog.max(l.launch_id) FROM etc_batch.launch l
         WHERE l.status OPERATOR(pg_catalog.=) 'running'
           AND l.step_id OPERATOR(pg_catalog.=) ANY (pg_catalog.array_agg(b.id))) AS launch_id
  FROM etc_batch.batch_log b
  LEFT JOIN running r ON r.id OPERATOR(pg_catalog.=) b.id
 GROUP BY b.batch;

COMMENT ON VIEW etc_batch.chain_progress IS
    'Per chain: steps done, failed and pending, the step being run now and the pid running it, when a step last finished, the last error of a failed step, when and by whom it was paused; on_standby: read on a hot standby, as of the WAL replayed there; the chain''s launch that runs, whose worker runs it.';

-- prune_history forgets jobs continued as another too, and ended launches: it returns one
-- more column, so it is made again, with the grants it has now.
SELECT pg_catalog.set_config('etc_batch_update.prune_history_acl',
                             COALESCE((SELECT p.proacl::text FROM pg_catalog.pg_proc p
                                        WHERE p.oid = 'etc_batch.prune_history(interval)'::regprocedure), '{}'), true);
DROP FUNCTION etc_batch.prune_history(interval);
CREATE FUNCTION etc_batch.prune_history(older_than interval)
RETURNS TABLE (step_audit_rows bigint, jobs_forgotten bigint, launches_forgotten bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff timestamptz;
    gone record;
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'etc_batch.prune_history cannot run on a standby'
            USING ERRCODE = 'read_only_sql_transaction',
                  DETAIL = 'This server is in recovery, a hot standby: it replays the primary''s WAL and cannot write. etc_batch''s views and doctor() work here; its work runs on the primary.',
                  HINT = coalesce((SELECT format('Run it on the primary, at host %s port %s (this standby''s primary_conninfo).',
                                                 w.sender_host, w.sender_port)
                                     FROM pg_stat_wal_receiver w WHERE w.sender_host IS NOT NULL),
                                  'Run it on the primary this standby replays from.');
    END IF;
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'older_than must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    cutoff := clock_timestamp() - older_than;
    -- attempts and skips of steps, finished before the cutoff
    DELETE FROM etc_batch.step_audit a
     WHERE coalesce(a.finished_at, a.lock_acquired_at) < cutoff;
    GET DIAGNOSTICS step_audit_rows = ROW_COUNT;
    -- whole jobs that ended (done, aborted, continued as another, or reverted) before the cutoff:
    -- approval, audit and checkpoint together; a job in conflict or corrupt waits for a
    -- person
    jobs_forgotten := 0;
    FOR gone IN
        DELETE FROM etc_batch.job j
         WHERE j.status IN ('done', 'aborted', 'continued', 'reverted') AND j.finished_at < cutoff
        RETURNING j.job_id, j.job_number, j.parallel
    LOOP
        DELETE FROM etc_batch.job_pause z WHERE z.job_id = gone.job_id;
        DELETE FROM etc_batch.job_pace c WHERE c.job_id = gone.job_id;
        DELETE FROM etc_batch.job_retry r WHERE r.job_id = gone.job_id;
        DELETE FROM etc_batch.job_wait w WHERE w.job_id = gone.job_id;
        DELETE FROM etc_batch.job_left_out o WHERE o.job_id = gone.job_id;
        EXECUTE format('DROP TABLE IF EXISTS etc_batch.%I, etc_batch.%I',
                       'job_item_chunk_' || gone.job_number, 'job_audit_chunk_' || gone.job_number);
        IF gone.parallel THEN
            EXECUTE format('DROP TABLE IF EXISTS etc_batch.%I', 'job_chunk_' || gone.job_number);
        END IF;
        jobs_forgotten := jobs_forgotten + 1;
    END LOOP;
    -- launches that ended before the cutoff, with the runs of their workers
    DELETE FROM etc_batch.launch l WHERE l.status <> 'running' AND l.ended_at < cutoff;
    GET DIAGNOSTICS launches_forgotten = ROW_COUNT;
    RETURN NEXT;
END
$$;

COMMENT ON FUNCTION etc_batch.prune_history(interval) IS
    'Deletes step_audit rows older than the interval, whole jobs (approval, audit, checkpoint) that ended, done, aborted, continued as another job or reverted, before it, and launches (with their workers'' runs) that ended before it. Open jobs, jobs in conflict or corrupt, and launches still running are kept.';
REVOKE ALL ON FUNCTION etc_batch.prune_history(interval) FROM PUBLIC;
DO $grants$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.grantee::regrole AS grantee, a.is_grantable
          FROM pg_catalog.aclexplode(pg_catalog.current_setting('etc_batch_update.prune_history_acl')::aclitem[]) a
         WHERE a.grantee <> 0 AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> (SELECT p.proowner FROM pg_catalog.pg_proc p
                              WHERE p.oid = 'etc_batch.prune_history(interval)'::regprocedure)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION etc_batch.prune_history(interval) TO %s%s', g.grantee,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$grants$;
-- A job whose last drain failed.
CREATE OR REPLACE FUNCTION etc_batch.doctor()
RETURNS TABLE (check_name text, status text, detail text, hint text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $doctor$
DECLARE
    setting_name text;
    r record;
    effective text;
    server_value text;
    source text;
    found_any boolean;
    writing text[];
BEGIN
    -- 0. On a hot standby: etc_batch's work runs on the primary; every check below reads
    --    what this server has replayed.
    IF pg_is_in_recovery() THEN
        check_name := 'standby';
        status := 'warn';
        detail := 'This server is a hot standby, in recovery: etc_batch''s procedures and functions that write refuse to run here (25006). The checks below read what it has replayed from the primary.';
        hint := coalesce((SELECT format('Run the work on the primary, at host %s port %s.', w.sender_host, w.sender_port)
                            FROM pg_stat_wal_receiver w WHERE w.sender_host IS NOT NULL),
                         'Run the work on the primary this standby replays from.');
        RETURN NEXT;
    END IF;

    -- 1. Timeouts: for this session as the server applies them, with where each value
    --    comes from; and for every role that owns steps or jobs, what a new session of
    --    that role would get, which is what survives a connection pooler.
    FOREACH setting_name IN ARRAY ARRAY['statement_timeout', 'lock_timeout',
                                        'idle_in_transaction_session_timeout'] LOOP
        SELECT s.setting, s.source INTO effective, source FROM pg_settings s WHERE s.name = setting_name;
        check_name := setting_name || ' (this session)';
        IF effective = '0' THEN
            status := 'warn';
            detail := format('%s is off (0) for this session of %I; its value comes from %s.',
                             setting_name, current_user, source);
            hint := format('ALTER ROLE %I SET %s = ''...''; applies to every new session of the role, through any pooler.',
                           current_user, setting_name);
        ELSE
            status := 'ok';
            detail := format('%s is %s for this session of %I; its value comes from %s.',
                             setting_name, current_setting(setting_name), current_user, source);
            hint := CASE WHEN source IN ('client', 'session')
                         THEN 'Set by the client or with SET: a transaction-mode pooler may not carry it to the next server connection; ALTER ROLE ... SET does.'
                    END;
        END IF;
        RETURN NEXT;

        -- What the server itself sets, before any database, role or client setting: the
        -- configuration files (postgresql.conf, ALTER SYSTEM) if this role may read them,
        -- else the built-in default. Never this session's own value, which may come from
        -- its connection string or its own role.
        BEGIN
            SELECT f.setting INTO server_value FROM pg_file_settings f
             WHERE f.name = setting_name AND f.applied ORDER BY f.seqno DESC LIMIT 1;
        EXCEPTION WHEN insufficient_privilege THEN
            server_value := NULL;
        END;
        IF server_value IS NULL THEN
            SELECT s.boot_val || coalesce(s.unit, '') INTO server_value FROM pg_settings s WHERE s.name = setting_name;
        END IF;

        found_any := false;
        FOR r IN
            SELECT DISTINCT o.role
              FROM (SELECT b.added_by::oid AS role FROM etc_batch.batch_log b
                    UNION SELECT j.registered_by::oid FROM etc_batch.job j) o
        LOOP
            found_any := true;
            -- role-and-database setting first, then the role's, then the database's,
            -- then the server's
            SELECT cand.v INTO effective FROM (
                SELECT split_part(c, '=', 2) AS v, 1 AS rank
                  FROM pg_db_role_setting d, unnest(d.setconfig) c
                 WHERE d.setrole = r.role AND d.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND split_part(c, '=', 1) = setting_name
                UNION ALL
                SELECT split_part(c, '=', 2), 2
                  FROM pg_db_role_setting d, unnest(d.setconfig) c
                 WHERE d.setrole = r.role AND d.setdatabase = 0 AND split_part(c, '=', 1) = setting_name
                UNION ALL
                SELECT split_part(c, '=', 2), 3
                  FROM pg_db_role_setting d, unnest(d.setconfig) c
                 WHERE d.setrole = 0 AND d.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND split_part(c, '=', 1) = setting_name
                UNION ALL
                SELECT server_value, 4
            ) cand ORDER BY cand.rank LIMIT 1;
            SELECT CASE WHEN effective ~ '^0[a-z]*$' THEN 'warn' ELSE 'ok' END INTO status;
            check_name := format('%s (role %s)', setting_name, r.role::regrole);
            detail := format('A new session of %s gets %s = %s.', r.role::regrole, setting_name, effective);
            hint := CASE WHEN status = 'warn'
                         THEN format('ALTER ROLE %s SET %s = ''...'';', r.role::regrole, setting_name) END;
            RETURN NEXT;
        END LOOP;
    END LOOP;

    -- 2. Session-level advisory locks held by idle sessions: what a pooler leaks.
    found_any := false;
    FOR r IN
        SELECT l.pid, a.usename, a.application_name,
               clock_timestamp() - a.state_change AS idle_for,
               count(*) AS locks
          FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND a.state = 'idle'
         GROUP BY 1, 2, 3, 4
    LOOP
        found_any := true;
        check_name := 'session advisory locks';
        status := 'warn';
        detail := format('Backend %s (role %s) has held %s advisory lock(s) while idle for %s: a session-level lock, kept after its work ended.',
                         r.pid, r.usename, r.locks, date_trunc('second', r.idle_for));
        hint := 'Behind a transaction-mode pooler use transaction-scoped locks (etc_batch.try_xact_lock) or leases; pg_terminate_backend frees a leaked one.';
        RETURN NEXT;
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'session advisory locks', 'ok', 'No idle session holds an advisory lock.', NULL::text;
    END IF;

    -- 2b. etc_batch's work in backends waiting to write to a client that stopped reading:
    --     a client process that hangs, or a network gone without a reset (no FIN, no
    --     RST), which TCP gives up on only after its retries, some 15 minutes by Linux's
    --     defaults. Looked at twice, a quarter of a second apart (pg_stat_activity is read
    --     once a transaction unless its snapshot is cleared), so that a backend merely
    --     sending a result is not named.
    found_any := false;
    SELECT array_agg(format('%s %s', a.pid, a.query_start)) INTO writing
      FROM pg_stat_activity a WHERE a.wait_event = 'ClientWrite';
    IF writing IS NOT NULL THEN
        PERFORM pg_sleep(0.25);
        PERFORM pg_stat_clear_snapshot();
        FOR r IN
            SELECT a.pid, a.usename, a.client_addr, a.query_start, a.xact_start,
                   (SELECT string_agg(format('%L', p.job_id), ', ' ORDER BY p.job_id)
                      FROM etc_batch.job_progress p WHERE a.pid = ANY (p.drainer_pids)) AS jobs,
                   (SELECT string_agg(format('%L', j.job_id), ', ' ORDER BY j.job_id)
                      FROM etc_batch.job j WHERE j.xmax = a.backend_xid) AS job_rows,
                   (SELECT string_agg(format('step %s of chain %L', b.id, b.batch), ', ' ORDER BY b.id)
                      FROM etc_batch.batch_log b WHERE b.xmax = a.backend_xid) AS steps
              FROM pg_stat_activity a
             WHERE a.wait_event = 'ClientWrite'
               AND format('%s %s', a.pid, a.query_start) = ANY (writing)
             ORDER BY a.pid
        LOOP
            CONTINUE WHEN r.jobs IS NULL AND r.job_rows IS NULL AND r.steps IS NULL;
            found_any := true;
            check_name := 'clients not reading';
            status := 'warn';
            detail := format('Backend %s (role %s, client %s) waits to write to its client (ClientWrite) in a statement started at %s, ',
                             r.pid, r.usename, coalesce(host(r.client_addr), 'local'), r.query_start)
                || concat_ws('; ',
                       CASE WHEN r.steps IS NOT NULL THEN
                            format('holding the row of %s in a transaction open since %s: every other runner of the chain waits for it', r.steps, r.xact_start) END,
                       CASE WHEN r.job_rows IS NOT NULL THEN
                            format('holding the row of job %s in a chunk''s transaction open since %s: every other drainer of the job waits for it', r.job_rows, r.xact_start) END,
                       CASE WHEN r.job_rows IS NULL AND r.jobs IS NOT NULL THEN
                            format('counted as a drainer of job %s between chunks (it holds no row; other drainers go on without it)', r.jobs) END)
                || '. Its client stopped reading: a process that hangs, or a network gone without a reset, which TCP gives up on only after its retries (some 15 minutes by default).';
            hint := format('SELECT pg_terminate_backend(%s) ends it and lets go of what it holds; its chunk or step in flight rolls back. Set tcp_user_timeout, tcp_keepalives_idle, tcp_keepalives_interval, tcp_keepalives_count and client_connection_check_interval for the roles that run batch work (ALTER ROLE ... SET) so that the server gives up on such a client by itself.',
                           r.pid);
            RETURN NEXT;
        END LOOP;
    END IF;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'clients not reading', 'ok', 'No backend of etc_batch''s work waits to write to a client.', NULL::text;
    END IF;

    -- 3. Work that stopped half-way, or cannot go on.
    FOR r IN
        SELECT b.batch, count(*) FILTER (WHERE b.status = 'done') AS done,
               count(*) FILTER (WHERE b.status = 'pending') AS pending,
               count(*) FILTER (WHERE b.status = 'failed') AS failed,
               min(b.id) FILTER (WHERE b.status = 'failed') AS first_failed,
               bool_or(x.pid IS NOT NULL) AS running, min(b.paused_at) AS paused_at,
               (array_agg(b.paused_by ORDER BY b.paused_at) FILTER (WHERE b.paused_at IS NOT NULL))[1] AS paused_by
          FROM etc_batch.batch_log b
          LEFT JOIN pg_locks x ON x.locktype = 'transactionid' AND x.granted AND x.transactionid = b.xmax
         -- a run abandoned on purpose is history, not a chain that stopped
         WHERE NOT EXISTS (SELECT FROM etc_batch.chain_run cr
                            WHERE cr.batch = b.batch AND cr.abandoned_at IS NOT NULL)
         GROUP BY b.batch
    LOOP
        IF r.paused_at IS NOT NULL THEN
            RETURN QUERY SELECT format('chain %s', r.batch), 'warn',
                format('The batch is paused, by %s since %s: %s step(s) done, %s pending, %s failed.',
                       r.paused_by, r.paused_at, r.done, r.pending, r.failed),
                format('SELECT etc_batch.resume_batch(%L) to let it go on.', r.batch);
        ELSIF r.failed > 0 THEN
            RETURN QUERY SELECT format('chain %s', r.batch), 'warn',
                format('Step %s failed; %s step(s) done, %s pending behind it.', r.first_failed, r.done, r.pending),
                format('Fix the cause, then SELECT etc_batch.retry_step(%s) and CALL etc_batch.exec_batch_from_id(%s).',
                       r.first_failed, r.first_failed);
        ELSIF r.done > 0 AND r.pending > 0 AND NOT r.running THEN
            RETURN QUERY SELECT format('chain %s', r.batch), 'warn',
                format('%s step(s) done and %s pending, and no runner holds a step: the chain stopped half-way.', r.done, r.pending),
                'CALL etc_batch.exec_batch_from_id with its first pending step to finish it.';
        END IF;
    END LOOP;
    FOR r IN
        SELECT p.job_id, p.status, p.status_reason, p.committed, p.approved, p.parallel,
               p.chunks_committed, p.chunks_total, p.drainers, p.paused_at, p.paused_by, p.pause_reason,
               p.failed_at, p.failure_sqlstate, p.failure_message, p.failure_chunk,
               p.failed_at > coalesce(p.last_commit_at, '-infinity') AS failed_last,
               j.target_name, NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = j.target) AS target_gone
          FROM etc_batch.job_progress p
          JOIN etc_batch.job j ON j.job_id = p.job_id
         WHERE p.status IN ('conflict', 'corrupt')
            OR (p.status = 'pending' AND (p.committed > 0 OR p.paused_at IS NOT NULL
                                          OR p.failed_at IS NOT NULL
                                          OR NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = j.target)))
    LOOP
        IF r.status IN ('conflict', 'corrupt') THEN
            RETURN QUERY SELECT format('job %s', r.job_id), 'fail',
                format('The job is %s: %s', CASE r.status WHEN 'conflict' THEN 'in conflict' ELSE 'corrupt' END, r.status_reason),
                'It will not go on: register a new approval for what remains, and abort this one.';
        ELSIF r.target_gone THEN
            RETURN QUERY SELECT format('job %s', r.job_id), 'fail',
                format('Its target, table %s, does not exist any more (dropped, or dropped and created again): %s of %s items committed, and no more can be.',
                       r.target_name, r.committed, r.approved),
                format('SELECT etc_batch.abort_job(%L, %L), and register what is left against the table as it is now.',
                       r.job_id, 'target dropped');
        ELSIF r.paused_at IS NOT NULL THEN
            RETURN QUERY SELECT format('job %s', r.job_id), 'warn',
                CASE WHEN r.pause_reason IS NULL
                     THEN format('The job is paused, by %s since %s: %s of %s items committed.',
                                 r.paused_by, r.paused_at, r.committed, r.approved)
                     ELSE format('The job was paused by etc_batch at %s: %s; %s of %s items committed.',
                                 r.paused_at, r.pause_reason, r.committed, r.approved)
                END,
                format('SELECT etc_batch.resume_job(%L) to let it go on.', r.job_id);
        ELSIF r.drainers = 0 AND r.failed_last THEN
            RETURN QUERY SELECT format('job %s', r.job_id), 'warn',
                format('Its last drain failed at %s in chunk %s with %s: %s; the chunk was rolled back and %s of %s items are committed.',
                       r.failed_at, r.failure_chunk, r.failure_sqlstate, r.failure_message, r.committed, r.approved),
                format('Fix the cause, then CALL etc_batch.drain_job(%L) to go on.', r.job_id);
        ELSIF r.drainers = 0 AND r.committed = 0 THEN
            NULL;
        ELSIF r.drainers = 0 AND r.parallel THEN
            RETURN QUERY SELECT format('job %s', r.job_id), 'warn',
                format('%s of %s chunks (%s of %s items) committed, and no drainer holds any of the others: they wait for one.',
                       r.chunks_committed, r.chunks_total, r.committed, r.approved),
                format('CALL etc_batch.drain_job(%L) from one or more sessions to go on.', r.job_id);
        ELSIF r.drainers = 0 THEN
            RETURN QUERY SELECT format('job %s', r.job_id), 'warn',
                format('%s of %s items committed, and no drainer holds the job: it stopped half-way.', r.committed, r.approved),
                format('CALL etc_batch.drain_job(%L) to go on.', r.job_id);
        END IF;
    END LOOP;

    -- Launches with workers not at work: the supervisor starts them again as the limits
    -- allow; with no supervisor in this database (a restart, without the library
    -- preloaded), nobody does. A launch of the last ten seconds may still be starting.
    FOR r IN
        SELECT l.launch_id, l.job_id, l.step_id, l.workers,
               (SELECT count(*) FROM pg_locks x
                 WHERE x.locktype = 'advisory' AND x.granted AND x.objsubid = 5
                   AND x.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                   AND ((x.classid::int8 << 32) | x.objid::int8) >> 16 = l.launch_id) AS at_work,
               EXISTS (SELECT FROM pg_locks x
                        WHERE x.locktype = 'advisory' AND x.granted AND x.objsubid = 7
                          AND x.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())) AS supervised
          FROM etc_batch.launch l
         WHERE l.status = 'running' AND l.launched_at < now() - interval '10 seconds'
         ORDER BY l.launch_id
    LOOP
        CONTINUE WHEN r.at_work >= r.workers;
        IF NOT r.supervised THEN
            RETURN QUERY SELECT format('launch %s', r.launch_id), 'fail',
                format('%s of the %s workers of %s are at work, and no supervisor runs in this database: a restart left it unfinished.',
                       r.at_work, r.workers,
                       CASE WHEN r.job_id IS NOT NULL THEN format('job %s', r.job_id) ELSE format('the chain from step %s', r.step_id) END),
                CASE WHEN current_setting('shared_preload_libraries') ~ '(^|[ ,"])etc_batch([ ,"]|$)'
                     THEN 'The launcher starts a supervisor after every start; until then, SELECT * FROM etc_batch.resume_launches();'
                     ELSE 'SELECT * FROM etc_batch.resume_launches(); (or add etc_batch to shared_preload_libraries, or schedule resume_launches with pg_cron, so that the server resumes launches by itself).' END;
        ELSE
            RETURN QUERY SELECT format('launch %s', r.launch_id), 'warn',
                format('%s of the %s workers of %s are at work; the supervisor starts the others again as etc_batch.max_workers and max_worker_processes let it.',
                       r.at_work, r.workers,
                       CASE WHEN r.job_id IS NOT NULL THEN format('job %s', r.job_id) ELSE format('the chain from step %s', r.step_id) END),
                'See etc_batch.launches for how its workers ended, and the server log for a worker that ended before it began its run.';
        END IF;
    END LOOP;

    -- Replication slots nobody reads: they retain WAL, and a job paced by replica lag
    -- waits for them as for a standby.
    FOR r IN
        SELECT s.slot_name, s.slot_type,
               pg_wal_lsn_diff(pg_current_wal_lsn(), COALESCE(s.confirmed_flush_lsn, s.restart_lsn)) AS behind
          FROM pg_replication_slots s
         WHERE NOT s.active AND COALESCE(s.confirmed_flush_lsn, s.restart_lsn) IS NOT NULL
         ORDER BY s.slot_name
    LOOP
        RETURN QUERY SELECT format('replication slot %s', r.slot_name), 'warn',
            format('The %s slot is not being read, and holds back %s bytes of WAL; a job paced by max_replica_lag_bytes waits for it.',
                   r.slot_type, r.behind),
            format('Start what reads it, or SELECT pg_drop_replication_slot(%L) if nothing will.', r.slot_name);
    END LOOP;

    -- 4. Leases that expired but are still named.
    found_any := false;
    FOR r IN SELECT l.name, l.holder, l.generation, clock_timestamp() - l.expires_at AS ago
               FROM etc_batch.lease l WHERE l.expires_at <= clock_timestamp()
    LOOP
        found_any := true;
        RETURN QUERY SELECT format('lease %s', r.name), 'warn',
            format('Expired %s ago; its last holder was %L at generation %s. Nobody renews it.',
                   date_trunc('second', r.ago), r.holder, r.generation),
            'If its workers should be running, they are not renewing; otherwise ignore it.';
    END LOOP;

    -- 5. What else a DBA checks before trusting a deployment.
    SELECT s.setting INTO effective FROM pg_settings s WHERE s.name = 'default_transaction_isolation';
    RETURN QUERY SELECT 'default_transaction_isolation',
        CASE WHEN effective = 'read committed' THEN 'ok' ELSE 'warn' END,
        format('Transactions start in %s.', effective),
        CASE WHEN effective <> 'read committed'
             THEN 'A runner that waited for another fails with SQLSTATE 40001 instead of skipping the step it finished; nothing runs twice, but callers see errors.' END;

    SELECT s.setting INTO effective FROM pg_settings s WHERE s.name = 'synchronous_commit';
    RETURN QUERY SELECT 'synchronous_commit',
        CASE WHEN effective = 'off' THEN 'warn' ELSE 'ok' END,
        format('synchronous_commit is %s.', effective),
        CASE WHEN effective = 'off'
             THEN 'A crash can lose the last committed steps and chunks, records included; they will run again.' END;

    effective := current_setting('etc_batch.crash_at', true);
    RETURN QUERY SELECT 'etc_batch.crash_at',
        CASE WHEN coalesce(effective, '') = '' THEN 'ok' ELSE 'fail' END,
        CASE WHEN coalesce(effective, '') = '' THEN 'The test aid is off.'
             ELSE format('The test aid is set to %s: the next job chunk terminates its backend.', effective) END,
        CASE WHEN coalesce(effective, '') <> '' THEN 'RESET etc_batch.crash_at, and remove it from any ALTER ... SET.' END;

    FOR r IN
        SELECT p.oid::regprocedure AS proc
          FROM pg_proc p
         WHERE p.pronamespace = 'etc_batch'::regnamespace
           AND p.proname IN ('exec_batch_from_id', 'drain_job', 'add_step', 'register_job', 'register_job_from_query',
                             'reset_batch', 'retry_step', 'abort_job', 'pause_job', 'resume_job',
                             'pause_batch', 'resume_batch', 'pace_job', 'register_remainder', 'register_revert', 'launch_job',
                             'launch_batch', 'stop_launch', 'resume_launches', 'run_chain', 'define_chain',
                             'abandon_run')
           AND has_function_privilege('public', p.oid, 'EXECUTE')
    LOOP
        RETURN QUERY SELECT 'privileges', 'warn', format('PUBLIC may execute %s.', r.proc),
            format('REVOKE EXECUTE ON ROUTINE %s FROM PUBLIC, and grant it to the roles that need it.', r.proc);
    END LOOP;

    SELECT e.extversion, a.default_version INTO effective, source
      FROM pg_extension e JOIN pg_available_extensions a ON a.name = e.extname
     WHERE e.extname = 'etc_batch';
    RETURN QUERY SELECT 'extension version',
        CASE WHEN effective = source THEN 'ok' ELSE 'warn' END,
        format('Installed %s; the server has %s.', effective, source),
        CASE WHEN effective <> source THEN 'ALTER EXTENSION etc_batch UPDATE;' END;
END
$doctor$;

COMMENT ON FUNCTION etc_batch.doctor() IS
    'Checks the facts a deployment depends on: timeouts as the server applies them (for this session and for every role that owns steps or jobs), advisory locks leaked by idle sessions, backends of batch work waiting on a client that stopped reading, chains and jobs stopped half-way, in conflict, whose last drain failed or whose target is gone, launches whose workers are not all at work, expired leases, isolation, durability, the crash_at test aid, privileges and the installed version.';

-- What a job did not change, approved again in one call.
CREATE FUNCTION etc_batch.register_remainder(
    job_id text, new_job_id text, chunk_size integer DEFAULT NULL,
    include_drifted boolean DEFAULT false, parallel boolean DEFAULT NULL)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_remainder_wrapper';
COMMENT ON FUNCTION etc_batch.register_remainder(text, text, integer, boolean, boolean) IS
    'Approves again, as a new job, what a job did not change (its unprocessed and skipped items still as approved, and with include_drifted those whose rows drifted, at their state now), with the same change and chunking unless told otherwise; the job ends, continued as the new one.';
REVOKE ALL ON FUNCTION etc_batch.register_remainder(text, text, integer, boolean, boolean) FROM PUBLIC;

-- A job's committed items set back by a new approval (new).
CREATE FUNCTION etc_batch.register_revert(
    job_id text, revert_job_id text, chunk_size integer DEFAULT NULL,
    parallel boolean DEFAULT NULL, inverse regprocedure DEFAULT NULL)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_revert_wrapper';
CREATE FUNCTION etc_batch.revert_preview(job_id text, inverse regprocedure DEFAULT NULL)
RETURNS TABLE (items integer, drifted integer, gone integer, set_back jsonb,
               set_back_per_item text[], expected jsonb, inverse text, left_out jsonb)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'revert_preview_wrapper';
COMMENT ON FUNCTION etc_batch.register_revert(text, text, integer, boolean, regprocedure) IS
    'Registers a revert of a job: a new approved, frozen job whose items are the job''s committed items, each expected as its change left the row and set back to the values it had before (the job''s expect values of the columns it set; a handler job''s by the inverse handler given); items whose rows drifted or went away since are left out and named in etc_batch.job_left_out. The job is stopped first and ends reverted. The same revert again changes nothing; a different one under the same job id is refused.';
REVOKE ALL ON FUNCTION etc_batch.register_revert(text, text, integer, boolean, regprocedure) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.revert_preview(text, regprocedure) IS
    'What register_revert would register, registering nothing: how many committed items it would set back, how many drifted or are gone since (their keys in left_out), which columns go back to which values (set_back) or each to its row''s own value recorded before the change (set_back_per_item), and what every row must still hold (expected).';
REVOKE ALL ON FUNCTION etc_batch.revert_preview(text, regprocedure) FROM PUBLIC;

-- Chains that run every night (new): chain definitions and their runs, run_chain,
-- define_chain, abandon_run, current_run. As in sql/runs.sql:
CREATE TABLE etc_batch.chain (
    chain       text        PRIMARY KEY,
    time_zone   text        NOT NULL,
    overlap     boolean     NOT NULL DEFAULT false,
    defined_by  regrole     NOT NULL,
    defined_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE etc_batch.chain IS
    'One row per chain definition: the batch of that name holds its steps, which never run themselves; run_chain runs copies of them.';
COMMENT ON COLUMN etc_batch.chain.time_zone IS
    'The time zone in which a run''s default key, the date of the day it starts, is taken.';
COMMENT ON COLUMN etc_batch.chain.overlap IS
    'Whether a run may start while an earlier one is unfinished (nights that do not depend on each other); by default it waits its turn.';

CREATE TABLE etc_batch.chain_run (
    run_number   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    chain        text        NOT NULL,
    run_key      text        NOT NULL,
    batch        text        NOT NULL UNIQUE,
    first_step   bigint      NOT NULL,
    created_by   regrole     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    abandoned_by regrole,
    abandoned_at timestamptz,
    UNIQUE (chain, run_key)
);

COMMENT ON TABLE etc_batch.chain_run IS
    'One row per run of a chain definition: its key, the batch that holds its steps (copies of the definition''s when it was created), who created it and, for a run ended on purpose, who abandoned it and when.';
COMMENT ON COLUMN etc_batch.chain_run.run_number IS 'Runs of a chain in the order they were created: a run waits for the unfinished ones before it.';

-- pg_dump keeps their contents, as it keeps batch_log's.
SELECT pg_catalog.pg_extension_config_dump('etc_batch.chain', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.chain_run', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.chain_run_run_number_seq', '');

REVOKE ALL ON etc_batch.chain, etc_batch.chain_run FROM PUBLIC;

CREATE PROCEDURE etc_batch.run_chain(
    chain text,
    run_key text DEFAULT NULL,
    lease_name text DEFAULT NULL,
    lease_holder text DEFAULT NULL,
    lease_generation bigint DEFAULT NULL,
    INOUT run text DEFAULT NULL,
    INOUT status text DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_run_chain';

COMMENT ON PROCEDURE etc_batch.run_chain(text, text, text, text, bigint, text, text) IS
    'Runs the run run_key (by default the date of today in the chain''s time zone) of a chain definition, created the first time with copies of its steps, as exec_batch_from_id runs a chain: each step exactly once, however many callers; waits its turn (status waiting) while an earlier run is unfinished, unless the chain allows overlapping runs.';

REVOKE ALL ON PROCEDURE etc_batch.run_chain(text, text, text, text, bigint, text, text) FROM PUBLIC;

CREATE FUNCTION etc_batch.define_chain(
    chain text, time_zone text DEFAULT NULL, overlap boolean DEFAULT false)
RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'define_chain_wrapper';
CREATE FUNCTION etc_batch.abandon_run(chain text, run_key text)
RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'abandon_run_wrapper';
CREATE FUNCTION etc_batch.current_run()
RETURNS text
STRICT STABLE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'current_run_wrapper';
COMMENT ON FUNCTION etc_batch.define_chain(text, text, boolean) IS
    'Defines a chain (or defines it again) whose runs run_chain makes: its steps are those added with add_step under its name, which never run themselves; time_zone: the one a run''s default key, today''s date, is taken in (the caller''s TimeZone by default); overlap: a run may start while an earlier one is unfinished.';
COMMENT ON FUNCTION etc_batch.abandon_run(text, text) IS
    'Ends a run of a chain on purpose, kept in history with who and when: it never runs again, and later runs no longer wait for it.';
COMMENT ON FUNCTION etc_batch.current_run() IS
    'The run key of the run whose step is running in this session; NULL outside one.';
REVOKE ALL ON FUNCTION etc_batch.define_chain(text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.abandon_run(text, text) FROM PUBLIC;

-- The frozen list and the audit, one row per chunk instead of one per item (see
-- sql/jobs.sql): every job's partitions are converted, and etc_batch.job_item and
-- etc_batch.job_audit become views that show them one row per item as before, to the
-- roles that could read the tables.
CREATE TABLE etc_batch.job_item_chunk (
    job_id         text      NOT NULL,
    first_position integer   NOT NULL CHECK (first_position >= 0),
    last_position  integer   NOT NULL,
    keys           text[]    NOT NULL,
    revisions      bigint[]  NOT NULL,
    guards         text[],
    CHECK (last_position = first_position + pg_catalog.cardinality(keys) - 1),
    CHECK (pg_catalog.cardinality(revisions) = pg_catalog.cardinality(keys)),
    CHECK (guards IS NULL OR pg_catalog.cardinality(guards) = pg_catalog.cardinality(keys))
) PARTITION BY LIST (job_id);

COMMENT ON TABLE etc_batch.job_item_chunk IS
    'The approved list, frozen at registration in key order, one row per chunk of the job: the positions of its items (first_position to last_position), and for each in order its key, the revision the operator saw, and the guard values that must still hold, as JSON text (NULL for an item without any; guards NULL when no item of the chunk has any). One partition per job, job_item_chunk_<job_number>, keyed by first_position. etc_batch.job_item shows it one row per item.';

CREATE TABLE etc_batch.job_audit_chunk (
    job_id          text        NOT NULL,
    first_position  integer     NOT NULL CHECK (first_position >= 0),
    last_position   integer     NOT NULL,
    chunk           integer     NOT NULL,
    txid            bigint      NOT NULL,
    committed_at    timestamptz NOT NULL,
    revisions_after bigint[]    NOT NULL,
    skipped         integer[],
    found           jsonb,
    CHECK (last_position = first_position + pg_catalog.cardinality(revisions_after) - 1)
) PARTITION BY LIST (job_id);

COMMENT ON TABLE etc_batch.job_audit_chunk IS
    'One row per committed chunk, written in the same transaction as the change and the checkpoint: the positions of its approved items in job_item (first_position to last_position), the transaction and its time, and for each position in order the revision (or row digest) the change left the row at (NULL for a job guarded by named columns, and for an item skipped); skipped lists the positions of the items a job approved with on_drift => skip left unchanged because their rows had drifted or gone, and found the rows found, a JSON array in the same order (JSON null for a row gone). One partition per job, job_audit_chunk_<job_number>, keyed by first_position. etc_batch.job_audit shows it one row per item.';

CREATE TRIGGER job_audit_changed AFTER UPDATE OR DELETE ON etc_batch.job_audit_chunk
    FOR EACH ROW EXECUTE FUNCTION etc_batch.count_job_changes('audit_changes');
CREATE TRIGGER job_audit_truncated AFTER TRUNCATE ON etc_batch.job_audit_chunk
    FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes('audit_changes');
CREATE TRIGGER job_item_changed AFTER UPDATE OR DELETE ON etc_batch.job_item_chunk
    FOR EACH ROW EXECUTE FUNCTION etc_batch.count_job_changes('item_changes');
CREATE TRIGGER job_item_truncated AFTER TRUNCATE ON etc_batch.job_item_chunk
    FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes('item_changes');

CREATE FUNCTION etc_batch.chunk_items(first_position integer, item_keys text[],
                                      item_revisions bigint[], item_guards text[])
RETURNS TABLE ("position" integer, item_key text, revision bigint, guards jsonb)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
SELECT ($1 OPERATOR(pg_catalog.+) u.n OPERATOR(pg_catalog.-) 1)::pg_catalog.int4, u.k, u.r,
       COALESCE(u.g::pg_catalog.jsonb, '{}'::pg_catalog.jsonb)
  FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4))
       WITH ORDINALITY AS u(k, r, g, n);
END;

CREATE FUNCTION etc_batch.chunk_audit_items(first_position integer, revisions_after bigint[],
                                            skipped_positions integer[], found_rows jsonb)
RETURNS TABLE ("position" integer, revision_after bigint, skipped boolean, found jsonb)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
SELECT p.position, u.revision_after, s.k IS NOT NULL, $4 OPERATOR(pg_catalog.->) (s.k OPERATOR(pg_catalog.-) 1)
  FROM pg_catalog.unnest($2) WITH ORDINALITY AS u(revision_after, n),
       LATERAL (SELECT ($1 OPERATOR(pg_catalog.+) u.n OPERATOR(pg_catalog.-) 1)::pg_catalog.int4 AS position) p,
       LATERAL (SELECT pg_catalog.array_position($3, p.position) AS k) s;
END;

-- Each job's rows, a chunk's to a row: its items by the chunk they belong to, its audit
-- rows by their chunk, each in runs of consecutive positions (a chunk's rows always are
-- one run, unless someone removed some by hand, which the job's counters say already).
DO $convert$
DECLARE
    j record;
    items text;
    audit text;
BEGIN
    FOR j IN
        SELECT x.job_id, x.job_number, x.chunk_size, x.registered_by,
               pg_roles.oid IS NOT NULL AS role_exists
          FROM etc_batch.job x
          LEFT JOIN pg_catalog.pg_roles ON pg_roles.oid = x.registered_by
         WHERE pg_catalog.to_regclass(format('etc_batch.%I', 'job_item_' || x.job_number)) IS NOT NULL
           AND pg_catalog.to_regclass(format('etc_batch.%I', 'job_audit_' || x.job_number)) IS NOT NULL
         ORDER BY x.job_number
    LOOP
        items := 'job_item_chunk_' || j.job_number;
        audit := 'job_audit_chunk_' || j.job_number;
        EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_item_chunk INCLUDING CONSTRAINTS,
                            CHECK (job_id = %L), PRIMARY KEY (first_position), UNIQUE (last_position))',
                       items, j.job_id);
        EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_audit_chunk INCLUDING CONSTRAINTS,
                            CHECK (job_id = %L), PRIMARY KEY (first_position), UNIQUE (last_position))',
                       audit, j.job_id);
        -- made by this script, they would belong to the extension; a registration's are
        -- tables of their own, which pg_dump keeps with their rows
        EXECUTE format('ALTER EXTENSION etc_batch DROP TABLE etc_batch.%I', items);
        EXECUTE format('ALTER EXTENSION etc_batch DROP TABLE etc_batch.%I', audit);
        EXECUTE format('INSERT INTO etc_batch.%I
                        SELECT r.job_id, pg_catalog.min(r.position), pg_catalog.max(r.position),
                               pg_catalog.array_agg(r.item_key ORDER BY r.position),
                               pg_catalog.array_agg(r.revision ORDER BY r.position),
                               CASE WHEN pg_catalog.bool_or(r.guards <> ''{}''::jsonb)
                                    THEN pg_catalog.array_agg(NULLIF(r.guards, ''{}''::jsonb)::text
                                                              ORDER BY r.position) END
                          FROM (SELECT i.*, i.position / %s AS chunk,
                                       i.position - pg_catalog.row_number() OVER (PARTITION BY i.position / %s
                                                                              ORDER BY i.position) AS run
                                  FROM etc_batch.%I i) r
                         GROUP BY r.job_id, r.chunk, r.run',
                       items, j.chunk_size, j.chunk_size, 'job_item_' || j.job_number);
        EXECUTE format('INSERT INTO etc_batch.%I
                        SELECT r.job_id, pg_catalog.min(r.position), pg_catalog.max(r.position), r.chunk,
                               pg_catalog.min(r.txid), pg_catalog.min(r.committed_at),
                               pg_catalog.array_agg(CASE WHEN NOT r.skipped THEN r.revision_after END
                                                    ORDER BY r.position),
                               pg_catalog.array_agg(r.position ORDER BY r.position) FILTER (WHERE r.skipped),
                               pg_catalog.jsonb_agg(COALESCE(r.found, ''null''::jsonb) ORDER BY r.position)
                                   FILTER (WHERE r.skipped)
                          FROM (SELECT a.*, a.position - pg_catalog.row_number() OVER (PARTITION BY a.chunk
                                                                                   ORDER BY a.position) AS run
                                  FROM etc_batch.%I a) r
                         GROUP BY r.job_id, r.chunk, r.run',
                       audit, 'job_audit_' || j.job_number);
        EXECUTE format('CREATE TRIGGER job_item_truncated AFTER TRUNCATE ON etc_batch.%I
                            FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes(%L, %L)',
                       items, 'item_changes', j.job_id);
        EXECUTE format('CREATE TRIGGER job_audit_truncated AFTER TRUNCATE ON etc_batch.%I
                            FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes(%L, %L)',
                       audit, 'audit_changes', j.job_id);
        IF j.role_exists THEN
            EXECUTE format('GRANT SELECT ON etc_batch.%I, etc_batch.%I TO %s', items, audit,
                           j.registered_by::regrole);
        END IF;
        EXECUTE format('ALTER TABLE etc_batch.job_item_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                       items, j.job_id);
        EXECUTE format('ALTER TABLE etc_batch.job_audit_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                       audit, j.job_id);
    END LOOP;
END
$convert$;

-- Who could read a table reads its view, and the table of chunk rows: the grants,
-- copied to the new tables before the old ones are dropped, then to the views, by one
-- function of this script's own (gone with its session).
CREATE FUNCTION pg_temp.copy_select_grants(source regclass, target regclass)
RETURNS void LANGUAGE plpgsql AS $copy$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT x.grantee
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) x
         WHERE c.oid = source AND x.privilege_type = 'SELECT' AND x.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT ON %s TO %s', target,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
    END LOOP;
END
$copy$;

SELECT pg_temp.copy_select_grants('etc_batch.job_item', 'etc_batch.job_item_chunk'),
       pg_temp.copy_select_grants('etc_batch.job_audit', 'etc_batch.job_audit_chunk');

DROP VIEW etc_batch.job_audit_items;
DROP TABLE etc_batch.job_audit, etc_batch.job_item;

CREATE VIEW etc_batch.job_item AS
SELECT c.job_id, u.position, u.item_key, u.revision, u.guards
  FROM etc_batch.job_item_chunk c,
       etc_batch.chunk_items(c.first_position, c.keys, c.revisions, c.guards) u;

COMMENT ON VIEW etc_batch.job_item IS
    'The approved list, frozen at registration in key order, one row per item, as job_item_chunk holds it: position, key, the revision the operator saw, and the guard values that must still hold. WHERE job_id = ... reads that job''s partition only.';

CREATE VIEW etc_batch.job_audit AS
SELECT a.job_id, u.position, u.revision_after, a.chunk, a.txid, a.committed_at, u.skipped, u.found
  FROM etc_batch.job_audit_chunk a,
       etc_batch.chunk_audit_items(a.first_position, a.revisions_after, a.skipped, a.found) u;

COMMENT ON VIEW etc_batch.job_audit IS
    'The audit, one row per item of a committed chunk, as job_audit_chunk holds it: the position of its approved item in job_item (whose key, revision and guards never change), the revision (or row digest) the change left the row at, the chunk, the transaction and its time; for an item a job approved with on_drift => skip left unchanged because its row had drifted or gone, skipped and the row found (JSON null when it was gone). WHERE job_id = ... reads that job''s partition only.';

CREATE VIEW etc_batch.job_audit_items AS
SELECT a.job_id, a.position, i.item_key, i.revision AS revision_before, a.revision_after,
       i.guards, a.chunk, a.txid, a.committed_at,
       CASE WHEN a.skipped THEN 'skipped' ELSE 'changed' END AS outcome, a.found,
       CASE j.guard WHEN 'revision' THEN 'revision ' || pg_catalog.quote_ident(j.revision_column)
                    WHEN 'row' THEN 'row digest'
                    ELSE 'columns' END AS guarded_by
  FROM etc_batch.job_audit a
  JOIN etc_batch.job_item i ON i.job_id = a.job_id AND i.position = a.position
  JOIN etc_batch.job j ON j.job_id = a.job_id;

COMMENT ON VIEW etc_batch.job_audit_items IS
    'The audit rows with their approved items: for each item of a committed chunk, its key, the revision (or row digest) approved and the guards, the revision after, the chunk, the transaction and its time, whether it was changed or skipped (and the row found then), and how the job recognised an unchanged row. WHERE job_id = ... reads that job''s partitions only.';

REVOKE ALL ON etc_batch.job_item, etc_batch.job_audit, etc_batch.job_audit_items FROM PUBLIC;

SELECT pg_temp.copy_select_grants('etc_batch.job_item_chunk', 'etc_batch.job_item'),
       pg_temp.copy_select_grants('etc_batch.job_audit_chunk', 'etc_batch.job_audit');
DROP FUNCTION pg_temp.copy_select_grants(regclass, regclass);

COMMENT ON COLUMN etc_batch.job.job_number IS
    'Names the job''s partitions of job_item_chunk and job_audit_chunk: job_item_chunk_<job_number>, job_audit_chunk_<job_number>.';

-- The metrics, one row per sample, in Prometheus's naming (contrib/prometheus-postgres-exporter.yaml
-- reads them): per job, what job_progress shows its reader, and the seconds its
-- drainers waited per kind; per chain, its steps by status; the launched workers at work.
CREATE VIEW etc_batch.metrics WITH (security_barrier) AS
SELECT m.metric, pg_catalog.jsonb_build_object('job_id', p.job_id) AS labels, m.value
  FROM etc_batch.job_progress p
  JOIN etc_batch.job j ON j.job_id OPERATOR(pg_catalog.=) p.job_id
 CROSS JOIN LATERAL (VALUES
       ('etc_batch_job_items_approved', p.approved::pg_catalog.float8),
       ('etc_batch_job_items_committed', p.committed::pg_catalog.float8),
       ('etc_batch_job_chunks_committed', p.chunks_committed::pg_catalog.float8),
       ('etc_batch_job_chunks_total', p.chunks_total::pg_catalog.float8),
       ('etc_batch_job_retries', p.retries::pg_catalog.float8),
       ('etc_batch_job_seconds_at_work', p.seconds_at_work::pg_catalog.float8),
       ('etc_batch_job_chunk_seconds_sum',
        CASE WHEN j.parallel
             THEN (SELECT COALESCE(pg_catalog.sum(c.chunk_seconds), 0) FROM etc_batch.job_chunk c
                    WHERE c.job_id OPERATOR(pg_catalog.=) j.job_id AND c.committed)
             ELSE COALESCE(j.chunk_seconds, 0) END),
       ('etc_batch_job_chunk_seconds_count', p.chunks_committed::pg_catalog.float8)) m(metric, value)
UNION ALL
SELECT 'etc_batch_job_status_current',
       pg_catalog.jsonb_build_object('job_id', p.job_id, 'status', p.status::pg_catalog.text), 1
  FROM etc_batch.job_progress p
UNION ALL
SELECT m.metric, pg_catalog.jsonb_build_object('job_id', w.job_id, 'waited_for', w.waited_for), m.value
  FROM etc_batch.job_wait w
  JOIN etc_batch.job_progress p ON p.job_id OPERATOR(pg_catalog.=) w.job_id
 CROSS JOIN LATERAL (VALUES ('etc_batch_job_waited_seconds', w.seconds),
                            ('etc_batch_job_waited_waits', w.waits::pg_catalog.float8)) m(metric, value)
UNION ALL
SELECT 'etc_batch_chain_steps', pg_catalog.jsonb_build_object('batch', c.batch, 'status', s.status), s.steps
  FROM etc_batch.chain_progress c
 CROSS JOIN LATERAL (VALUES ('done', c.done::pg_catalog.float8), ('failed', c.failed::pg_catalog.float8),
                            ('pending', c.pending::pg_catalog.float8)) s(status, steps)
UNION ALL
-- a launched worker holds its mark (src/session_lock.rs, Space::Worker) while it lives
SELECT 'etc_batch_workers_running', '{}'::pg_catalog.jsonb, pg_catalog.count(*)::pg_catalog.float8
  FROM pg_catalog.pg_locks x
 WHERE x.locktype OPERATOR(pg_catalog.=) 'advisory' AND x.granted
   AND x.objsubid OPERATOR(pg_catalog.=) 5
   AND x.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                           WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database());

COMMENT ON VIEW etc_batch.metrics IS
    'The metrics of etc_batch, one row per sample: its name (etc_batch_...), its labels (job_id; job_id and status; job_id and waited_for; batch and status) and its value. Per job (those job_progress shows the reader): items approved and committed, chunks committed and in all, retries, seconds at work, the chunks'' own seconds (sum and count), its status, and the seconds and number of waits per kind; per chain, its steps by status; the launched workers at work in this database. contrib/prometheus-postgres-exporter.yaml exports them.';

REVOKE ALL ON etc_batch.metrics FROM PUBLIC;

-- A revert's approval leaves out the committed items of the job it reverts whose rows
-- drifted or went away since that job changed them: never overwritten, named here.
CREATE TABLE etc_batch.job_left_out (
    job_id     text    NOT NULL,
    "position" integer NOT NULL,
    item_key   text    NOT NULL,
    state      text    NOT NULL CHECK (state IN ('drifted', 'gone')),
    PRIMARY KEY (job_id, "position")
);

COMMENT ON TABLE etc_batch.job_left_out IS
    'For a revert (register_revert), the committed items of the job it reverts that it left out of its approval: the item''s position in that job, its key, and whether its row had drifted since that job changed it or was gone.';
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_left_out', '');
REVOKE ALL ON etc_batch.job_left_out FROM PUBLIC;
