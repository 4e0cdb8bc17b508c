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

-- Parallel jobs: whether chunks may commit in any order, and a parallel job's chunks.
ALTER TABLE etc_batch.job ADD COLUMN parallel boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN etc_batch.job.parallel IS
    'Whether the approval lets chunks commit in any order, each claimed by one of any number of drainers: then job_chunk_<job_number> holds which chunks are committed, and next_index reaches item_count only when the job is done.';

CREATE TABLE etc_batch.job_chunk (
    job_id       text        NOT NULL,
    chunk        integer     NOT NULL,
    committed    boolean     NOT NULL DEFAULT false,
    seal         bigint      NOT NULL,
    txid         bigint,
    committed_at timestamptz
) PARTITION BY LIST (job_id);

COMMENT ON TABLE etc_batch.job_chunk IS
    'For a parallel job, one row per chunk: whether it is committed, with a seal of that written with it, and the transaction that committed it. A drainer claims a chunk by locking its row, skipping rows other drainers hold, and commits the chunk''s change, its audit rows and committed = true in one transaction; a drainer that dies leaves the row unlocked and the chunk unwritten. One partition per parallel job, job_chunk_<job_number>, keyed by chunk.';

CREATE FUNCTION etc_batch.create_job_tables(job_number bigint, job_id text, registrant regrole,
                                            parallel boolean)
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
    IF parallel THEN
        -- half of each page left free: a chunk's row is changed once, as a HOT update
        EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_chunk INCLUDING CONSTRAINTS
                            INCLUDING DEFAULTS, CHECK (job_id = %L), PRIMARY KEY (chunk))
                            WITH (fillfactor = 50)', 'job_chunk_' || job_number, job_id);
    END IF;
END
$$;

-- A parallel job's chunk rows, one per chunk, open, each with its seal (see
-- src/job/claim.rs), written once the item count is known; then the partitions attached.
CREATE FUNCTION etc_batch.attach_job_tables(job_number bigint, job_id text, chunks integer)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('etc_batch.%I', 'job_chunk_' || job_number)) IS NOT NULL THEN
        EXECUTE format('INSERT INTO etc_batch.%I (job_id, chunk, seal)
                        SELECT $1, c, pg_catalog.hashtextextended($1 || '':chunk:'' || c || '':0'', 7919)
                          FROM pg_catalog.generate_series(1, $2) c', 'job_chunk_' || job_number)
            USING job_id, chunks;
        EXECUTE format('ALTER TABLE etc_batch.job_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                       'job_chunk_' || job_number, job_id);
    END IF;
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

REVOKE ALL ON etc_batch.job_item, etc_batch.job_audit, etc_batch.job_chunk, etc_batch.job_audit_items FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.create_job_tables(bigint, text, regrole, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.attach_job_tables(bigint, text, integer) FROM PUBLIC;

DO $move$
DECLARE
    j record;
BEGIN
    FOR j IN SELECT job_id, job_number, registered_by FROM etc_batch.job ORDER BY job_number LOOP
        PERFORM etc_batch.create_job_tables(j.job_number, j.job_id, j.registered_by, false);
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
        PERFORM etc_batch.attach_job_tables(j.job_number, j.job_id, NULL);
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
    -- whole jobs that ended (done or aborted) before the cutoff: approval, audit and
    -- checkpoint together; a job in conflict or corrupt waits for a person
    jobs_forgotten := 0;
    FOR gone IN
        DELETE FROM etc_batch.job j
         WHERE j.status IN ('done', 'aborted') AND j.finished_at < cutoff
        RETURNING j.job_id, j.job_number, j.parallel
    LOOP
        DELETE FROM etc_batch.job_pause z WHERE z.job_id = gone.job_id;
        DELETE FROM etc_batch.job_pace c WHERE c.job_id = gone.job_id;
        DELETE FROM etc_batch.job_retry r WHERE r.job_id = gone.job_id;
        EXECUTE format('DROP TABLE IF EXISTS etc_batch.%I, etc_batch.%I',
                       'job_item_' || gone.job_number, 'job_audit_' || gone.job_number);
        IF gone.parallel THEN
            EXECUTE format('DROP TABLE IF EXISTS etc_batch.%I', 'job_chunk_' || gone.job_number);
        END IF;
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
    handler regprocedure DEFAULT NULL, parallel boolean DEFAULT false)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_from_query_wrapper';
COMMENT ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean) IS
    'Freezes the rows of a SELECT, run once as the registering role in one snapshot, as the approved items of a job; otherwise as register_job.';
REVOKE ALL ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean) FROM PUBLIC;

-- A step's row is changed once or twice per run of its chain: half of each new page is
-- left free so that the change is a HOT update.
ALTER TABLE etc_batch.batch_log SET (fillfactor = 50);

-- register_job and job_summary change their arguments and results: made again, with
-- the EXECUTE grants they had.
DO $remake$
DECLARE
    old regprocedure;
    grantees regrole[];
    g regrole;
    grant_sql text;
    signatures constant text[][] := ARRAY[
        ['etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure)',
         'etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean)'],
        ['etc_batch.job_summary(text)', 'etc_batch.job_summary(text)']];
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
    set_values jsonb, expect jsonb DEFAULT '{}', key_column name DEFAULT 'id',
    tenant_column name DEFAULT 'tenant', revision_column name DEFAULT 'revision',
    handler regprocedure DEFAULT NULL, parallel boolean DEFAULT false)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_wrapper';
COMMENT ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean) IS
    'Freezes an approved list of items for a job, whose chunks commit in order or, with parallel, in any order by many drainers; the same request again changes nothing, a different one under the same job id is refused.';
REVOKE ALL ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean) FROM PUBLIC;

CREATE FUNCTION etc_batch.job_summary(job_id text)
RETURNS TABLE (status text, approved integer, committed integer, unprocessed integer,
               matching integer, drifted integer, missing integer, parallel boolean)
STABLE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'job_summary_wrapper';
COMMENT ON FUNCTION etc_batch.job_summary(text) IS
    'A job''s status and its items counted by state.';
REVOKE ALL ON FUNCTION etc_batch.job_summary(text) FROM PUBLIC;
$ddl$;
    FOREACH grant_sql IN ARRAY grants LOOP
        EXECUTE grant_sql;
    END LOOP;
END
$remake$;

-- Pacing: pauses, and the pace of a job.
ALTER TABLE etc_batch.batch_log ADD COLUMN paused_at timestamptz, ADD COLUMN paused_by regrole;
COMMENT ON COLUMN etc_batch.batch_log.paused_at IS
    'When pause_batch paused the step''s batch: a runner stops before the step until resume_batch. pause_batch marks every step of the batch but the one a runner holds, so it waits for nothing.';
COMMENT ON COLUMN etc_batch.batch_log.paused_by IS 'Who paused the step''s batch.';

CREATE TABLE etc_batch.job_pause (
    job_id    text        PRIMARY KEY,
    paused_at timestamptz NOT NULL,
    paused_by regrole     NOT NULL
);

COMMENT ON TABLE etc_batch.job_pause IS
    'The jobs paused by pause_job, when and by whom: their drainers stop before their next chunk and return with status paused, until resume_job.';

CREATE TABLE etc_batch.job_pace (
    job_id                text        PRIMARY KEY,
    rows_per_second       integer     CHECK (rows_per_second > 0),
    max_replica_lag_bytes bigint      CHECK (max_replica_lag_bytes >= 0),
    set_at                timestamptz NOT NULL,
    set_by                regrole     NOT NULL,
    -- where the pace's clock is: the next chunk of any drainer starts no earlier
    next_slot             timestamptz
);

COMMENT ON TABLE etc_batch.job_pace IS
    'The pace set by pace_job: rows per second for all drainers of the job together, and how many WAL bytes the slowest standby or replication slot may be behind before drainers wait. next_slot is when the next chunk may start.';

CREATE TABLE etc_batch.job_retry (
    job_id     text        NOT NULL,
    chunk      integer     NOT NULL,
    attempt    integer     NOT NULL,
    sqlstate   text        NOT NULL,
    message    text        NOT NULL,
    retried_at timestamptz NOT NULL,
    pid        integer     NOT NULL
);

CREATE INDEX job_retry_job_id ON etc_batch.job_retry (job_id, retried_at);

COMMENT ON TABLE etc_batch.job_retry IS
    'Every chunk rolled back for a transient error (40001, 40P01, 55P03) and tried again: which job and chunk, which failed attempt, the SQLSTATE and message, when, and the drainer''s pid. The chunk committed nothing of that attempt.';

SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_pace', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_pause', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_retry', '');
REVOKE ALL ON etc_batch.job_pause, etc_batch.job_pace, etc_batch.job_retry FROM PUBLIC;

CREATE FUNCTION etc_batch.pause_batch(batch text) RETURNS void
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'pause_batch_wrapper';
CREATE FUNCTION etc_batch.resume_batch(batch text) RETURNS void
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'resume_batch_wrapper';
CREATE FUNCTION etc_batch.pause_job(job_id text) RETURNS void
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'pause_job_wrapper';
CREATE FUNCTION etc_batch.resume_job(job_id text) RETURNS void
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'resume_job_wrapper';
CREATE FUNCTION etc_batch.pace_job(
    job_id text, rows_per_second integer, max_replica_lag_bytes bigint DEFAULT NULL)
RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'pace_job_wrapper';
COMMENT ON FUNCTION etc_batch.pause_batch(text) IS
    'Pauses a batch: a runner at work stops after the step in flight, and runs stop before its first pending step until resume_batch.';
REVOKE ALL ON FUNCTION etc_batch.pause_batch(text) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.resume_batch(text) IS
    'Lets a paused batch go on.';
REVOKE ALL ON FUNCTION etc_batch.resume_batch(text) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.pause_job(text) IS
    'Pauses a job: its drainers stop before their next chunk and return with status paused, until resume_job. Not part of the approval.';
REVOKE ALL ON FUNCTION etc_batch.pause_job(text) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.resume_job(text) IS
    'Lets a paused job go on from its checkpoint.';
REVOKE ALL ON FUNCTION etc_batch.resume_job(text) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.pace_job(text, integer, bigint) IS
    'Sets how fast a job may go: rows per second for all its drainers together, and how many WAL bytes the slowest standby or replication slot may be behind before they wait; NULL: no limit. Not part of the approval.';
REVOKE ALL ON FUNCTION etc_batch.pace_job(text, integer, bigint) FROM PUBLIC;

-- Progress and the doctor know parallel jobs, their drainers, pauses and paces.
CREATE OR REPLACE VIEW etc_batch.job_progress AS
WITH p AS (
    -- A sequential job's progress is its checkpoint, on its row; a parallel job's is
    -- its committed chunks, in job_chunk (its row says nothing of it until it is done).
    -- Its drainers are the sessions writing its chunk partition: each holds the
    -- partition's ROW EXCLUSIVE lock for the span of a chunk.
    SELECT j.*,
           CASE WHEN j.parallel THEN c.items ELSE j.next_index END AS committed_items,
           CASE WHEN j.parallel THEN c.chunks ELSE j.chunks_committed END AS committed_chunks,
           CASE WHEN j.parallel THEN c.first_commit ELSE j.started_at END AS first_commit,
           CASE WHEN j.parallel THEN c.last_commit ELSE j.last_commit_at END AS last_commit,
           CASE WHEN j.parallel THEN d.pids ELSE s.pids END AS pids
      FROM etc_batch.job j
      LEFT JOIN LATERAL (
            SELECT (pg_catalog.count(*) FILTER (WHERE c.committed))::pg_catalog.int4 AS chunks,
                   -- OPERATOR() forms all share one precedence: the parentheses are the order
                   COALESCE(pg_catalog.sum(LEAST(j.chunk_size, j.item_count OPERATOR(pg_catalog.-)
                                ((c.chunk OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) j.chunk_size)))
                            FILTER (WHERE c.committed), 0)::pg_catalog.int4 AS items,
                   pg_catalog.min(c.committed_at) AS first_commit,
                   pg_catalog.max(c.committed_at) AS last_commit
              FROM etc_batch.job_chunk c
             WHERE j.parallel AND c.job_id OPERATOR(pg_catalog.=) j.job_id) c ON true
      LEFT JOIN LATERAL (
            SELECT pg_catalog.array_agg(x.pid ORDER BY x.pid) AS pids
              FROM pg_catalog.pg_locks x
             WHERE j.parallel AND x.locktype OPERATOR(pg_catalog.=) 'relation' AND x.granted
               AND x.mode OPERATOR(pg_catalog.=) 'RowExclusiveLock'
               AND x.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                       WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
               AND x.relation OPERATOR(pg_catalog.=) pg_catalog.to_regclass(
                       pg_catalog.format('etc_batch.%I', 'job_chunk_' OPERATOR(pg_catalog.||) j.job_number))) d ON true
      LEFT JOIN LATERAL (
            SELECT pg_catalog.array_agg(x.pid) AS pids
              FROM pg_catalog.pg_locks x
             WHERE NOT j.parallel AND x.locktype OPERATOR(pg_catalog.=) 'transactionid' AND x.granted
               AND x.transactionid OPERATOR(pg_catalog.=) j.xmax) s ON true)
SELECT p.job_id, p.status,
       p.committed_items AS committed,
       p.item_count AS approved,
       pg_catalog.round(100.0 OPERATOR(pg_catalog.*) p.committed_items OPERATOR(pg_catalog./) p.item_count, 1) AS percent,
       p.committed_chunks AS chunks_committed,
       ((p.item_count::pg_catalog.int8 OPERATOR(pg_catalog.+) p.chunk_size OPERATOR(pg_catalog.-) 1)
         OPERATOR(pg_catalog./) p.chunk_size)::pg_catalog.int4 AS chunks_total,
       p.first_commit AS started_at,
       p.last_commit AS last_commit_at,
       -- items per second between the first and the last commit of the job
       CASE WHEN p.last_commit OPERATOR(pg_catalog.>) p.first_commit
            THEN pg_catalog.round((p.committed_items OPERATOR(pg_catalog./)
                 pg_catalog.date_part('epoch', p.last_commit OPERATOR(pg_catalog.-) p.first_commit))::pg_catalog.numeric, 1)
       END AS items_per_second,
       CASE WHEN p.status OPERATOR(pg_catalog.=) 'pending'
             AND p.last_commit OPERATOR(pg_catalog.>) p.first_commit
             AND p.committed_items OPERATOR(pg_catalog.>) 0
            -- OPERATOR() forms all share one precedence: the parentheses are the order.
            THEN p.last_commit OPERATOR(pg_catalog.+)
                 ((p.last_commit OPERATOR(pg_catalog.-) p.first_commit)
                  OPERATOR(pg_catalog.*) ((p.item_count OPERATOR(pg_catalog.-) p.committed_items)::pg_catalog.float8
                                          OPERATOR(pg_catalog./) p.committed_items))
       END AS estimated_finish,
       p.pids[1] AS drainer_pid,
       p.status_reason,
       p.parallel,
       COALESCE(pg_catalog.cardinality(p.pids), 0) AS drainers,
       COALESCE(p.pids, '{}') AS drainer_pids,
       z.paused_at,
       z.paused_by,
       c.rows_per_second,
       c.max_replica_lag_bytes,
       -- what a drainer waits for now, as its pg_stat_activity says
       (SELECT pg_catalog.min(pg_catalog.substr(a.query, 15, pg_catalog.strpos(a.query, ' */') OPERATOR(pg_catalog.-) 15))
          FROM pg_catalog.pg_stat_activity a
         WHERE pg_catalog.strpos(a.query, '/* etc_batch: job "' OPERATOR(pg_catalog.||) p.job_id
                                          OPERATOR(pg_catalog.||) '": waiting') OPERATOR(pg_catalog.=) 1) AS waiting,
       (SELECT pg_catalog.count(*) FROM etc_batch.job_retry r
         WHERE r.job_id OPERATOR(pg_catalog.=) p.job_id) AS retries,
       -- read on a hot standby: as of the WAL replayed there, with no drainer at work
       pg_catalog.pg_is_in_recovery() AS on_standby
  FROM p
  LEFT JOIN etc_batch.job_pause z ON z.job_id OPERATOR(pg_catalog.=) p.job_id
  LEFT JOIN etc_batch.job_pace c ON c.job_id OPERATOR(pg_catalog.=) p.job_id;

COMMENT ON VIEW etc_batch.job_progress IS
    'Per job: status, items committed of approved, percent, chunks, when it started and last committed, the rate between those, an estimated finish at that rate, whether chunks may commit in any order (parallel), the drainers at work on it now: how many, and their pids; when and by whom it was paused, its pace, what its drainers wait for, and how many chunks were rolled back for a transient error and tried again (job_retry); on_standby: read on a hot standby, as of the WAL replayed there.';


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
       pg_catalog.pg_is_in_recovery() AS on_standby
  FROM etc_batch.batch_log b
  LEFT JOIN running r ON r.id OPERATOR(pg_catalog.=) b.id
 GROUP BY b.batch;

COMMENT ON VIEW etc_batch.chain_progress IS
    'Per chain: steps done, failed and pending, the step being run now and the pid running it, when a step last finished, the last error of a failed step, when and by whom it was paused; on_standby: read on a hot standby, as of the WAL replayed there.';


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
               p.chunks_committed, p.chunks_total, p.drainers, p.paused_at, p.paused_by
          FROM etc_batch.job_progress p
         WHERE p.status IN ('conflict', 'corrupt')
            OR (p.status = 'pending' AND (p.committed > 0 OR p.paused_at IS NOT NULL))
    LOOP
        IF r.status IN ('conflict', 'corrupt') THEN
            RETURN QUERY SELECT format('job %s', r.job_id), 'fail',
                format('The job is %s: %s', CASE r.status WHEN 'conflict' THEN 'in conflict' ELSE 'corrupt' END, r.status_reason),
                'It will not go on: register a new approval for what remains, and abort this one.';
        ELSIF r.paused_at IS NOT NULL THEN
            RETURN QUERY SELECT format('job %s', r.job_id), 'warn',
                format('The job is paused, by %s since %s: %s of %s items committed.',
                       r.paused_by, r.paused_at, r.committed, r.approved),
                format('SELECT etc_batch.resume_job(%L) to let it go on.', r.job_id);
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
                             'pause_batch', 'resume_batch', 'pace_job')
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
    'Checks the facts a deployment depends on: timeouts as the server applies them (for this session and for every role that owns steps or jobs), advisory locks leaked by idle sessions, chains and jobs stopped half-way or in conflict, expired leases, isolation, durability, the crash_at test aid, privileges and the installed version.';
REVOKE ALL ON FUNCTION etc_batch.doctor() FROM PUBLIC;

-- Chains that orchestrate: steps that commit, per-step timeouts and retries.
ALTER TABLE etc_batch.batch_log
    ADD COLUMN commits boolean NOT NULL DEFAULT false,
    ADD COLUMN timeout interval,
    ADD COLUMN max_attempts integer NOT NULL DEFAULT 1;
COMMENT ON COLUMN etc_batch.batch_log.commits IS
    'The step is a single CALL of a procedure that may COMMIT: it runs in the runner''s own non-atomic context, not in a subtransaction; what it committed stays, and a run that dies inside it calls it again (at least once, exactly once when the procedure is resumable).';
COMMENT ON COLUMN etc_batch.batch_log.timeout IS
    'The statement_timeout the step runs with, and only it; exceeded, the step fails with 57014, recorded as timed_out.';
COMMENT ON COLUMN etc_batch.batch_log.max_attempts IS
    'Attempts in all for a step that fails with 40001, 40P01 or 55P03: each is rolled back and run again after a backoff that doubles.';
ALTER DOMAIN etc_batch.attempt_outcome DROP CONSTRAINT attempt_outcome_check;
ALTER DOMAIN etc_batch.attempt_outcome ADD CONSTRAINT attempt_outcome_check
    CHECK (VALUE IN ('done', 'failed', 'skipped', 'timed_out', 'retried'));

-- add_step takes the new arguments: made again, with the EXECUTE grants it had.
DO $add_step$
DECLARE
    old constant regprocedure := 'etc_batch.add_step(text, text, bigint)'::regprocedure;
    grantees regrole[];
    g regrole;
BEGIN
    SELECT array_agg(DISTINCT a.grantee::regrole) INTO grantees
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid = old AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
       AND a.grantee <> 0;
    EXECUTE 'DROP FUNCTION ' || old::text;
    EXECUTE $ddl$
CREATE FUNCTION etc_batch."add_step"(
	"batch" TEXT,
	"command" TEXT,
	"id" bigint DEFAULT NULL,
	"commits" bool DEFAULT false,
	"timeout" interval DEFAULT NULL,
	"max_attempts" INT DEFAULT 1
) RETURNS bigint
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'add_step_wrapper';

COMMENT ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer) IS
    'Adds a step to a batch and returns its id; the step will run with the privileges of the role that adds it. commits: a single CALL of a procedure that may COMMIT; timeout: its statement_timeout; max_attempts: attempts in all after 40001, 40P01 or 55P03.';
REVOKE ALL ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer) FROM PUBLIC;
$ddl$;
    FOREACH g IN ARRAY coalesce(grantees, '{}') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer) TO %s', g);
    END LOOP;
END
$add_step$;
