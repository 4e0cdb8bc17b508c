-- etc_batch 0.2.0 -> 0.3.0. Run by ALTER EXTENSION etc_batch UPDATE; never edit it once
-- 0.3.0 is released: later changes go into a script of their own.
\echo Use "ALTER EXTENSION etc_batch UPDATE" to load this file. \quit

-- Jobs get a number, which names their own partitions of job_item and job_audit.
ALTER TABLE etc_batch.job ADD COLUMN job_number bigint GENERATED ALWAYS AS IDENTITY UNIQUE;
COMMENT ON COLUMN etc_batch.job.job_number IS
    'Names the job''s partitions of job_item and job_audit: job_item_<job_number>, job_audit_<job_number>.';
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_job_number_seq', '');

-- A partition's own TRUNCATE trigger names its job.
CREATE OR REPLACE FUNCTION etc_batch.count_job_changes() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    counter text := TG_ARGV[0];
BEGIN
    IF TG_OP = 'TRUNCATE' AND TG_NARGS > 1 THEN
        EXECUTE format('UPDATE etc_batch.job SET %I = %I + 1 WHERE job_id = $1', counter, counter)
            USING TG_ARGV[1];
    ELSIF TG_OP = 'TRUNCATE' THEN
        EXECUTE format('UPDATE etc_batch.job SET %I = %I + 1', counter, counter);
    ELSIF TG_OP = 'DELETE' THEN
        EXECUTE format('UPDATE etc_batch.job SET %I = %I + 1 WHERE job_id = $1', counter, counter)
            USING OLD.job_id;
    ELSE
        EXECUTE format('UPDATE etc_batch.job SET %I = %I + 1 WHERE job_id IN ($1, $2)', counter, counter)
            USING OLD.job_id, NEW.job_id;
    END IF;
    RETURN NULL;
END
$$;

-- job_item and job_audit become partitioned by job; the rows of every job move into
-- partitions of its own, and the tables they were in go.
ALTER TABLE etc_batch.job_item RENAME TO job_item_0_2_0;
ALTER TABLE etc_batch.job_audit RENAME TO job_audit_0_2_0;
ALTER EXTENSION etc_batch DROP TABLE etc_batch.job_item_0_2_0;
ALTER EXTENSION etc_batch DROP TABLE etc_batch.job_audit_0_2_0;

CREATE TABLE etc_batch.job_item (
    job_id   text    NOT NULL,
    position integer NOT NULL CHECK (position >= 0),
    item_key text    NOT NULL,
    revision bigint  NOT NULL,
    guards   jsonb   NOT NULL
) PARTITION BY LIST (job_id);

COMMENT ON TABLE etc_batch.job_item IS
    'The approved list, frozen at registration in key order: position, key, the revision the operator saw, and the guard values that must still hold. One partition per job, job_item_<job_number>, keyed by position.';

CREATE TABLE etc_batch.job_audit (
    job_id          text        NOT NULL,
    position        integer     NOT NULL,
    revision_after  bigint,
    chunk           integer     NOT NULL,
    txid            bigint      NOT NULL,
    committed_at    timestamptz NOT NULL
) PARTITION BY LIST (job_id);

COMMENT ON TABLE etc_batch.job_audit IS
    'One row per changed item, written in the same transaction as the change and the checkpoint: the position of its approved item in job_item (whose key, revision and guards never change), the revision the change left the row at, the chunk, the transaction and its time. One partition per job, job_audit_<job_number>, keyed by position.';

CREATE TRIGGER job_audit_changed AFTER UPDATE OR DELETE ON etc_batch.job_audit
    FOR EACH ROW EXECUTE FUNCTION etc_batch.count_job_changes('audit_changes');
CREATE TRIGGER job_audit_truncated AFTER TRUNCATE ON etc_batch.job_audit
    FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes('audit_changes');
CREATE TRIGGER job_item_changed AFTER UPDATE OR DELETE ON etc_batch.job_item
    FOR EACH ROW EXECUTE FUNCTION etc_batch.count_job_changes('item_changes');
CREATE TRIGGER job_item_truncated AFTER TRUNCATE ON etc_batch.job_item
    FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes('item_changes');

CREATE FUNCTION etc_batch.create_job_tables(job_number bigint, job_id text, registrant regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    items text := 'job_item_' || job_number;
    audit text := 'job_audit_' || job_number;
BEGIN
    EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_item INCLUDING CONSTRAINTS,
                        CHECK (job_id = %L), PRIMARY KEY (position))', items, job_id);
    EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_audit INCLUDING CONSTRAINTS,
                        CHECK (job_id = %L), PRIMARY KEY (position))', audit, job_id);
    EXECUTE format('CREATE TRIGGER job_item_truncated AFTER TRUNCATE ON etc_batch.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes(%L, %L)',
                   items, 'item_changes', job_id);
    EXECUTE format('CREATE TRIGGER job_audit_truncated AFTER TRUNCATE ON etc_batch.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes(%L, %L)',
                   audit, 'audit_changes', job_id);
    EXECUTE format('GRANT SELECT ON etc_batch.%I TO %s', items, registrant);
END
$$;

CREATE FUNCTION etc_batch.attach_job_tables(job_number bigint, job_id text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('ALTER TABLE etc_batch.job_item ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                   'job_item_' || job_number, job_id);
    EXECUTE format('ALTER TABLE etc_batch.job_audit ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                   'job_audit_' || job_number, job_id);
END
$$;

CREATE VIEW etc_batch.job_audit_items AS
SELECT a.job_id, a.position, i.item_key, i.revision AS revision_before, a.revision_after,
       i.guards, a.chunk, a.txid, a.committed_at
  FROM etc_batch.job_audit a
  JOIN etc_batch.job_item i ON i.job_id = a.job_id AND i.position = a.position;

COMMENT ON VIEW etc_batch.job_audit_items IS
    'The audit rows with their approved items: for each changed item, its key, the revision approved and the guards, the revision after, the chunk, the transaction and its time. WHERE job_id = ... reads that job''s partitions only.';

REVOKE ALL ON etc_batch.job_item, etc_batch.job_audit, etc_batch.job_audit_items FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.create_job_tables(bigint, text, regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.attach_job_tables(bigint, text) FROM PUBLIC;

DO $move$
DECLARE
    j record;
BEGIN
    FOR j IN SELECT job_id, job_number, registered_by FROM etc_batch.job ORDER BY job_number LOOP
        PERFORM etc_batch.create_job_tables(j.job_number, j.job_id, j.registered_by);
        -- made by this script, they would belong to the extension; a registration's are
        -- tables of their own, which pg_dump keeps with their rows
        EXECUTE format('ALTER EXTENSION etc_batch DROP TABLE etc_batch.%I', 'job_item_' || j.job_number);
        EXECUTE format('ALTER EXTENSION etc_batch DROP TABLE etc_batch.%I', 'job_audit_' || j.job_number);
        EXECUTE format('INSERT INTO etc_batch.%I SELECT * FROM etc_batch.job_item_0_2_0 WHERE job_id = $1',
                       'job_item_' || j.job_number) USING j.job_id;
        -- the key, the revision before and the guards are the approved item's, in job_item
        EXECUTE format('INSERT INTO etc_batch.%I (job_id, position, revision_after, chunk, txid, committed_at)
                        SELECT job_id, position, revision_after, chunk, txid, committed_at
                          FROM etc_batch.job_audit_0_2_0 WHERE job_id = $1',
                       'job_audit_' || j.job_number) USING j.job_id;
        PERFORM etc_batch.attach_job_tables(j.job_number, j.job_id);
    END LOOP;
END
$move$;

DROP TABLE etc_batch.job_item_0_2_0, etc_batch.job_audit_0_2_0;

-- Pruning drops a job's partitions.
CREATE OR REPLACE FUNCTION etc_batch.prune_history(older_than interval)
RETURNS TABLE (step_audit_rows bigint, jobs_forgotten bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff timestamptz;
    gone record;
BEGIN
    IF older_than IS NULL OR older_than <= interval '0' THEN
        RAISE EXCEPTION 'older_than must be a positive interval'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    cutoff := clock_timestamp() - older_than;
    -- attempts and skips of steps, finished before the cutoff
    DELETE FROM etc_batch.step_audit a
     WHERE coalesce(a.finished_at, a.lock_acquired_at) < cutoff;
    GET DIAGNOSTICS step_audit_rows = ROW_COUNT;
    -- whole jobs that ended (done or aborted) before the cutoff: approval, audit and
    -- checkpoint together; a job in conflict or corrupt waits for a person
    jobs_forgotten := 0;
    FOR gone IN
        DELETE FROM etc_batch.job j
         WHERE j.status IN ('done', 'aborted') AND j.finished_at < cutoff
        RETURNING j.job_number
    LOOP
        EXECUTE format('DROP TABLE IF EXISTS etc_batch.%I, etc_batch.%I',
                       'job_item_' || gone.job_number, 'job_audit_' || gone.job_number);
        jobs_forgotten := jobs_forgotten + 1;
    END LOOP;
    RETURN NEXT;
END
$$;


-- drain_job returns counts and the first and last key instead of every key it
-- committed. Its arguments change, so it is made again, with the EXECUTE grants it had.
DO $drain_job$
DECLARE
    old constant regprocedure :=
        'etc_batch.drain_job(text, integer, text, text, bigint, text[], integer, text)'::regprocedure;
    grantees regrole[];
    g regrole;
BEGIN
    SELECT array_agg(DISTINCT a.grantee::regrole) INTO grantees
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid = old AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
       AND a.grantee <> 0;
    EXECUTE 'DROP PROCEDURE ' || old::text;
    EXECUTE $ddl$
CREATE PROCEDURE etc_batch.drain_job(
    job_id text,
    max_chunks integer DEFAULT NULL,
    lease_name text DEFAULT NULL,
    lease_holder text DEFAULT NULL,
    lease_generation bigint DEFAULT NULL,
    INOUT committed_chunks integer DEFAULT NULL,
    INOUT committed_items bigint DEFAULT NULL,
    INOUT first_key text DEFAULT NULL,
    INOUT last_key text DEFAULT NULL,
    INOUT status text DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_drain_job';

COMMENT ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, text, text) IS
    'Commits the next chunks of a registered job, each in a transaction of its own with its audit rows and checkpoint; returns how many chunks and items this call committed, the first and last key of them, and the job''s status.';

REVOKE ALL ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, text, text) FROM PUBLIC;
$ddl$;
    FOREACH g IN ARRAY coalesce(grantees, '{}') LOOP
        EXECUTE format('GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, text, text) TO %s', g);
    END LOOP;
END
$drain_job$;

-- Approvals frozen from a query.
CREATE FUNCTION etc_batch.register_job_from_query(
    job_id text, tenant text, target regclass, items_query text, chunk_size integer,
    set_values jsonb, expect jsonb DEFAULT '{}', key_column name DEFAULT 'id',
    tenant_column name DEFAULT 'tenant', revision_column name DEFAULT 'revision',
    handler regprocedure DEFAULT NULL)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_from_query_wrapper';
COMMENT ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure) IS
    'Freezes the rows of a SELECT, run once as the registering role in one snapshot, as the approved items of a job; otherwise as register_job.';
REVOKE ALL ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure) FROM PUBLIC;

-- A step's row is changed once or twice per run of its chain: half of each new page is
-- left free so that the change is a HOT update.
ALTER TABLE etc_batch.batch_log SET (fillfactor = 50);
