-- etc_batch 0.4.0 -> 0.5.0. Run by ALTER EXTENSION etc_batch UPDATE; never edit it once
-- 0.5.0 is released: later changes go into a script of their own.
\echo Use "ALTER EXTENSION etc_batch UPDATE" to load this file. \quit

-- Kinds of change: a job sets columns to an expression over the row's own columns
-- (src/job/change/set_expressions.rs), deletes its rows, or moves them to an archive
-- table, and keeps what it deleted with its chunks' audit (delete.rs, move_rows.rs).
ALTER TABLE etc_batch.job
    ADD COLUMN set_expressions jsonb,
    ADD COLUMN action text NOT NULL DEFAULT 'update' CHECK (action IN ('update', 'delete', 'move', 'restore')),
    ADD COLUMN archive text,
    ADD COLUMN keep_deleted boolean NOT NULL DEFAULT true,
    ADD CONSTRAINT job_archive_check CHECK (action = 'restore' OR (action = 'move') = (archive IS NOT NULL));
COMMENT ON COLUMN etc_batch.job.set_from_items IS
    'The columns set to each item''s own value (register_job''s set_from_query; a revert''s, the values before of a job that recorded them), which its item carries in job_item.guards under the column''s name (not a guard: what the job sets); what the row held before in those columns is recorded at registration under the member named '''' (the empty name, which no column has), and guarded.';
COMMENT ON COLUMN etc_batch.job.set_expressions IS
    'The columns the job sets to an SQL expression over the row''s own columns (register_job''s set_expressions), each as PostgreSQL printed it back at registration, with every object outside pg_catalog schema-qualified: what the chunk''s UPDATE evaluates, with pg_catalog first in its search_path. The values these columns held before are recorded in each item''s guards. NULL: none.';
COMMENT ON COLUMN etc_batch.job.action IS
    'What the job does to each approved row that passes its guard: update (set_values, or a handler), delete, or move (inserted into archive and deleted, in one statement); restore, for a revert of a delete or a move, puts back the rows it kept (taken from archive again, for a move) whose key is free.';
COMMENT ON COLUMN etc_batch.job.archive IS
    'For a job that moves its rows (action move): the table they are moved to, which has every column of the target, by its schema-qualified name, found by that name when a chunk runs (as a handler is); for a restore of a move, the table they are taken back from.';
COMMENT ON COLUMN etc_batch.job.keep_deleted IS
    'For a job that deletes or moves its rows: whether each row''s whole content is kept with its chunk''s audit (job_audit_chunk.kept), what a revert puts back. false for a purge that must not keep what it deleted; such a job cannot be reverted.';
ALTER TABLE etc_batch.job_audit_chunk
    ADD COLUMN kept text[],
    ADD CONSTRAINT job_audit_chunk_kept_check
        CHECK (kept IS NULL OR pg_catalog.cardinality(kept) = pg_catalog.cardinality(revisions_after));
COMMENT ON COLUMN etc_batch.job_audit_chunk.kept IS
    'For a job that deletes or moves its rows and keeps them (keep_deleted): each position''s row as it was when the chunk deleted it, in the table''s row type''s text form (NULL for an item skipped), compressed with the row as any long value is.';

-- A remainder names the items it leaves out as a revert does, for one more reason too (a
-- key that names another tenant's row now), and a drifted one may be approved again
-- later (src/job/against_rows.rs, src/job/remainder.rs).
ALTER TABLE etc_batch.job_left_out DROP CONSTRAINT job_left_out_state_check;
ALTER TABLE etc_batch.job_left_out ADD CONSTRAINT job_left_out_state_check
    CHECK (state IN ('drifted', 'gone', 'another tenant', 'taken'));
ALTER TABLE etc_batch.job_left_out ADD COLUMN approved_again_as text;
COMMENT ON TABLE etc_batch.job_left_out IS
    'The items of a job that an approval made from them left out: for a revert (register_revert), the committed items of the job it reverts; for a remainder (register_remainder), the items the job it continues did not change. job_id is the revert or the remainder; position and item_key the item''s in the job it was made from; state whether its row had drifted, was gone, or its key named another tenant''s row (for a revert of a delete or a move: whether its key was taken by a row again, or its row was no longer in the archive as it was moved); approved_again_as, for a drifted item of a remainder, the job that approved it again at its row''s state (register_remainder with include_drifted on the continued job).';

COMMENT ON FUNCTION etc_batch.register_remainder(text, text, integer, boolean, boolean) IS
    'Approves again, as a new job, what a job did not change (its unprocessed and skipped items still as approved, and with include_drifted those whose rows drifted, at their state now), with the same change and chunking unless told otherwise; the job ends, continued as the new one. Items left out (drifted, gone, another tenant''s) are named in etc_batch.job_left_out and counted in a NOTICE. On a continued job, include_drifted approves as a new job the drifted items its remainder left out.';

-- revert_preview counts what it leaves out by reason; the keys come one row each from a
-- function of their own (a jsonb cell of every key flooded psql). EXECUTE granted on
-- the old one is granted on the new one.
DO $update$
DECLARE
    grantees regrole[];
    g regrole;
BEGIN
    SELECT pg_catalog.array_agg(DISTINCT a.grantee::regrole) INTO grantees
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid = 'etc_batch.revert_preview(text, regprocedure)'::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;
    DROP FUNCTION etc_batch.revert_preview(text, regprocedure);
    CREATE FUNCTION etc_batch.revert_preview(job_id text, inverse regprocedure DEFAULT NULL)
    RETURNS TABLE (items integer, drifted integer, gone integer, another_tenant integer,
                   taken integer, set_back jsonb, set_back_per_item text[], expected jsonb, inverse text)
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'revert_preview_wrapper';
    FOREACH g IN ARRAY COALESCE(grantees, '{}') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION etc_batch.revert_preview(text, regprocedure) TO %s', g);
    END LOOP;
END
$update$;
CREATE FUNCTION etc_batch.revert_preview_left_out(job_id text, inverse regprocedure DEFAULT NULL)
RETURNS TABLE ("position" integer, item_key text, state text)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'revert_preview_left_out_wrapper';
COMMENT ON FUNCTION etc_batch.revert_preview(text, regprocedure) IS
    'What register_revert would register, registering nothing: how many committed items it would set back, how many drifted, are gone or are another tenant''s since (for a revert of a delete or a move: how many keys a row has taken again), their keys from revert_preview_left_out, which columns go back to which values (set_back) or each to its row''s own value recorded before the change (set_back_per_item), and what every row must still hold (expected).';
REVOKE ALL ON FUNCTION etc_batch.revert_preview(text, regprocedure) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.revert_preview_left_out(text, regprocedure) IS
    'The committed items of a job that register_revert would leave out now, one row each in their order in the job: position, key, and whether its row drifted, is gone or its key names another tenant''s row.';
REVOKE ALL ON FUNCTION etc_batch.revert_preview_left_out(text, regprocedure) FROM PUBLIC;

-- How an audit row was guarded reads "revision column revision", not "revision revision".
CREATE OR REPLACE VIEW etc_batch.job_audit_items AS
SELECT a.job_id, a.position, i.item_key, i.revision AS revision_before, a.revision_after,
       i.guards, a.chunk, a.txid, a.committed_at,
       CASE WHEN a.skipped THEN 'skipped' ELSE 'changed' END AS outcome, a.found,
       CASE j.guard WHEN 'revision' THEN 'revision column ' || pg_catalog.quote_ident(j.revision_column)
                    WHEN 'row' THEN 'row digest'
                    ELSE 'columns' END AS guarded_by
  FROM etc_batch.job_audit a
  JOIN etc_batch.job_item i ON i.job_id = a.job_id AND i.position = a.position
  JOIN etc_batch.job j ON j.job_id = a.job_id;

-- A step's error keeps its DETAIL, so that a step run by a worker connected as its
-- author fails its caller with its own SQLSTATE, message and detail.
ALTER TABLE etc_batch.batch_log ADD COLUMN last_detail text;
COMMENT ON COLUMN etc_batch.batch_log.last_detail IS
    'The DETAIL of the step''s last error, beside its message (last_error) and SQLSTATE (last_sqlstate): a step run by a worker connected as its author raises its error to the caller from these.';

-- Transactions sized by time: pace_job's transaction_time (as many chunks as fit it
-- commit together, src/job/run/group.rs), and how many a sequential job's last
-- transaction committed (a parallel job's chunk rows tell it by their txid); both shown
-- by job_progress.
ALTER TABLE etc_batch.job_pace
    ADD COLUMN transaction_time interval CHECK (transaction_time > '0' AND transaction_time <= '1 hour');
COMMENT ON TABLE etc_batch.job_pace IS
    'The pace set by pace_job: rows per second for all drainers of the job together, and how many WAL bytes the slowest standby or replication slot may be behind before drainers wait. next_slot is when the next chunk may start. The signals drainers wait for: WAL segments waiting to be archived, a VACUUM of the target, the windows (in time_zone) and a throttle query; and those that pause the job: a replica lag, an archive backlog, a critical query. transaction_time sizes each transaction of a drain: as many consecutive chunks as fit it commit together.';
ALTER TABLE etc_batch.job ADD COLUMN chunks_per_transaction integer;

-- a job on a table Citus distributes: its chunks by shard (job_progress.chunks_per_node)
ALTER TABLE etc_batch.job ADD COLUMN shards jsonb;
COMMENT ON COLUMN etc_batch.job.shards IS
    'For a job on a table Citus distributes by a column of its key, its chunks by shard, frozen at registration: [{"shard": shardid, "first_chunk": n, "last_chunk": m}, ...] in chunk order, a chunk across two shards under both; NULL for any other job. job_progress.chunks_per_node counts them by the node each shard is on now.';

-- job_progress: an estimated finish that counts the pace's rate and the waits for the
-- windows to open, the rate of the clock beside the rate at work, and the job's number
-- last (an event names the job by it, src/events.rs, and a role that may see the job
-- turns it into the job here). Made again in place, so that it keeps its grants.
CREATE FUNCTION etc_batch.wall_seconds_in_windows(work_seconds double precision, windows text[], time_zone text)
RETURNS double precision
STABLE PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'wall_seconds_in_windows_wrapper';
COMMENT ON FUNCTION etc_batch.wall_seconds_in_windows(double precision, text[], text) IS
    'The seconds of the clock, from now, that work_seconds of work take when done only inside windows (a pace''s, read in time_zone): the waits for them to open counted. job_progress''s estimated_finish counts them so.';
-- The node a shard of a Citus table is on now, as host:port (several, comma-separated,
-- for a shard replicated to more than one); NULL for a shard Citus does not know, and
-- in a database without Citus, whose catalog this reads only once it is there.
CREATE FUNCTION etc_batch.shard_node(shard bigint) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $shard_node$
BEGIN
    IF to_regclass('pg_catalog.pg_dist_shard_placement') IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT string_agg(format('%s:%s', p.nodename, p.nodeport), ', ' ORDER BY p.nodename, p.nodeport)
              FROM pg_dist_shard_placement p WHERE p.shardid = shard);
END
$shard_node$;

COMMENT ON FUNCTION etc_batch.shard_node(bigint) IS
    'The node a shard of a Citus table is on now, as host:port (several for a shard replicated to more than one); NULL in a database without Citus. job_progress.chunks_per_node counts a job''s chunks by it.';

CREATE OR REPLACE VIEW etc_batch.job_progress WITH (security_barrier) AS
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
           CASE WHEN j.parallel THEN g.chunks ELSE j.chunks_per_transaction END AS per_transaction,
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
      -- a parallel job's last transaction: the chunks committed with its last chunk
      LEFT JOIN LATERAL (
            SELECT NULLIF(pg_catalog.count(*), 0)::pg_catalog.int4 AS chunks
              FROM etc_batch.job_chunk t
             WHERE j.parallel AND t.job_id OPERATOR(pg_catalog.=) j.job_id AND t.committed
               AND t.txid OPERATOR(pg_catalog.=) (
                   SELECT l.txid FROM etc_batch.job_chunk l
                    WHERE l.job_id OPERATOR(pg_catalog.=) j.job_id AND l.committed
                    ORDER BY l.committed_at DESC LIMIT 1)) g ON true
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
       COALESCE(pg_catalog.round(100.0 OPERATOR(pg_catalog.*) p.committed_items
                                  OPERATOR(pg_catalog./) NULLIF(p.item_count, 0), 1), 100.0) AS percent,
       p.committed_chunks AS chunks_committed,
       ((p.item_count::pg_catalog.int8 OPERATOR(pg_catalog.+) p.chunk_size OPERATOR(pg_catalog.-) 1)
         OPERATOR(pg_catalog./) p.chunk_size)::pg_catalog.int4 AS chunks_total,
       p.first_commit AS started_at,
       p.last_commit AS last_commit_at,
       -- items per second of time at work: not time paused, nor with nobody draining
       CASE WHEN p.worked OPERATOR(pg_catalog.>) 0
            THEN pg_catalog.round((p.committed_items OPERATOR(pg_catalog./) p.worked)::pg_catalog.numeric, 1)
       END AS items_per_second,
       -- when the rest is done (e.work seconds of work, below): from the last commit; for
       -- a job with windows, from now, counting the waits for them to open; unknown
       -- while paused
       CASE WHEN p.status OPERATOR(pg_catalog.=) 'pending' AND z.paused_at IS NULL
             AND p.worked OPERATOR(pg_catalog.>) 0 AND p.committed_items OPERATOR(pg_catalog.>) 0
            THEN CASE WHEN c.windows IS NULL
                      THEN p.last_commit OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => e.work)
                      ELSE pg_catalog.now() OPERATOR(pg_catalog.+) pg_catalog.make_interval(
                               secs => etc_batch.wall_seconds_in_windows(e.work, c.windows, c.time_zone))
                 END
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
       COALESCE(w.at_work, 0) AS launched_workers,
       -- items per second of the clock since it started, waits and pauses included,
       -- beside items_per_second, the rate at work
       CASE WHEN COALESCE(p.finished_at, pg_catalog.now()) OPERATOR(pg_catalog.>) p.first_commit
            THEN pg_catalog.round((p.committed_items OPERATOR(pg_catalog./) pg_catalog.date_part('epoch',
                     COALESCE(p.finished_at, pg_catalog.now()) OPERATOR(pg_catalog.-) p.first_commit))::pg_catalog.numeric, 1)
       END AS items_per_second_elapsed,
       -- the number an event names the job by (src/events.rs), for a role that may see it
       p.job_number,
       -- pace_job's target for a drain's transactions, and how many chunks the last one
       -- committed together (1 without a target)
       c.transaction_time,
       p.per_transaction AS chunks_per_transaction,
       -- a job on a table Citus distributes: its chunks and those committed, by the node
       -- each one's shard is on now (a chunk across shards on two nodes counts on both)
       (SELECT pg_catalog.jsonb_object_agg(n.node, pg_catalog.jsonb_build_object('chunks', n.chunks,
                                                                                  'committed', n.committed))
          FROM (SELECT x.node, pg_catalog.count(*)::pg_catalog.int4 AS chunks,
                       (pg_catalog.count(*) FILTER (
                          WHERE CASE WHEN p.parallel
                                     THEN EXISTS (SELECT FROM etc_batch.job_chunk k
                                                   WHERE k.job_id OPERATOR(pg_catalog.=) p.job_id
                                                     AND k.chunk OPERATOR(pg_catalog.=) x.chunk AND k.committed)
                                     ELSE x.chunk OPERATOR(pg_catalog.<=) ((p.committed_items OPERATOR(pg_catalog.+) p.chunk_size
                                                                            OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) p.chunk_size)
                                END))::pg_catalog.int4 AS committed
                  FROM (SELECT DISTINCT w.node, c.chunk
                          FROM pg_catalog.jsonb_to_recordset(p.shards)
                                   AS s(shard pg_catalog.int8, first_chunk pg_catalog.int4, last_chunk pg_catalog.int4)
                         CROSS JOIN LATERAL (SELECT COALESCE(etc_batch.shard_node(s.shard),
                                                             'shard ' OPERATOR(pg_catalog.||) s.shard) AS node) w
                         CROSS JOIN LATERAL pg_catalog.generate_series(s.first_chunk, s.last_chunk) AS c(chunk)) x
                 GROUP BY x.node) n) AS chunks_per_node
  FROM p
  LEFT JOIN etc_batch.job_pause z ON z.job_id OPERATOR(pg_catalog.=) p.job_id
  LEFT JOIN etc_batch.job_pace c ON c.job_id OPERATOR(pg_catalog.=) p.job_id
  -- the seconds of work the rest takes: at its rate at work so far, or at its pace's rows
  -- per second if that is slower
  CROSS JOIN LATERAL (
        SELECT (p.item_count OPERATOR(pg_catalog.-) p.committed_items)::pg_catalog.float8
               OPERATOR(pg_catalog./) LEAST(p.committed_items::pg_catalog.float8
                                            OPERATOR(pg_catalog./) NULLIF(p.worked, 0),
                                            c.rows_per_second::pg_catalog.float8) AS work) e
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
    'Per job (the jobs of roles whose privileges the caller has, or all of them for a reader of etc_batch.job): status, items committed of approved, percent, chunks, when it started and last committed, its rate at work (items_per_second: not time paused or with nobody draining) and of the clock since it started (items_per_second_elapsed), an estimated finish reckoned from its rate at work or its pace''s rows per second, whichever is slower, and for a job with windows from now, counting the waits for them to open, whether chunks may commit in any order (parallel), the drainers in a drain_job of it now, waiting between chunks included: how many, and their pids; when and by whom it was paused (by etc_batch itself for a critical signal of its pace, with the reason), its pace, what its drainers wait for (a pace, the replicas, WAL archiving, a VACUUM, its windows, its throttle query, a retry), how many chunks were rolled back for a transient error and tried again (job_retry); on_standby: read on a hot standby, as of the WAL replayed there; the seconds at work; when its last drain failed for a reason other than a conflict, with what SQLSTATE and message, in which chunk; what the approval does with a drifted item; and for a job continued by register_remainder, its successor; the job''s launch that runs, and how many of its background workers are at work; the job''s number, which its events on the channel etc_batch name it by; its pace''s transaction_time, and how many chunks its last transaction committed together (chunks_per_transaction); for a job on a table Citus distributes, its chunks and those committed by the node of their shards (chunks_per_node).';

-- doctor() says what a job whose drainers wait for their pace waits for, as a row that
-- is no warning. As in sql/doctor.sql:
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
               p.waiting, p.estimated_finish,
               j.target_name, NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = j.target) AS target_gone
          FROM etc_batch.job_progress p
          JOIN etc_batch.job j ON j.job_id = p.job_id
         WHERE p.status IN ('conflict', 'corrupt')
            OR (p.status = 'pending' AND (p.committed > 0 OR p.paused_at IS NOT NULL
                                          OR p.failed_at IS NOT NULL OR p.waiting IS NOT NULL
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
        ELSIF r.waiting IS NOT NULL THEN
            -- nothing wrong: the answer to "why is nothing happening"
            RETURN QUERY SELECT format('job %s', r.job_id), 'ok',
                format('Its drainers wait, as its pace says: %s. %s of %s items committed%s.',
                       -- job_progress.waiting names the job first: said here already
                       substr(r.waiting, length(format('job "%s": ', r.job_id)) + 1), r.committed, r.approved,
                       CASE WHEN r.estimated_finish IS NOT NULL
                            THEN format('; it should finish around %s', date_trunc('minute', r.estimated_finish))
                            ELSE '' END),
                NULL::text;
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

    -- 4b. On a Citus coordinator: every chunk and step that changes a worker commits there
    --     in two phases, which each worker's max_prepared_transactions must allow; and
    --     the chunks of each pending job on a distributed table, by the node of their
    --     shards (job_progress.chunks_per_node).
    IF to_regclass('pg_catalog.pg_dist_node') IS NOT NULL THEN
        FOR r IN SELECT format('%s:%s', w.nodename, w.nodeport) AS node, w.success, w.result
                   FROM run_command_on_workers('SHOW max_prepared_transactions') w
                  ORDER BY 1
        LOOP
            check_name := format('Citus worker %s', r.node);
            IF NOT r.success THEN
                status := 'fail';
                detail := format('The worker did not answer: %s', r.result);
                hint := 'Chunks and steps whose changes reach it fail until it does; start it, or mend its link.';
            ELSIF r.result = '0' THEN
                status := 'fail';
                detail := 'max_prepared_transactions is 0 there: no chunk or step that changes a shard on it can commit, since etc_batch commits every one in two phases.';
                hint := 'Set max_prepared_transactions on the worker to at least its max_connections, and restart it.';
            ELSE
                status := 'ok';
                detail := format('max_prepared_transactions is %s: chunks and steps commit there in two phases.', r.result);
                hint := NULL;
            END IF;
            RETURN NEXT;
        END LOOP;
        FOR r IN SELECT p.job_id, p.chunks_per_node FROM etc_batch.job_progress p
                  WHERE p.status = 'pending' AND p.chunks_per_node IS NOT NULL ORDER BY p.job_id
        LOOP
            RETURN QUERY SELECT format('job %s by node', r.job_id), 'ok',
                format('Chunks committed, by the node of their shard: %s.',
                       (SELECT string_agg(format('%s %s of %s', n.key, n.value ->> 'committed', n.value ->> 'chunks'),
                                          ', ' ORDER BY n.key)
                          FROM jsonb_each(r.chunks_per_node) n)),
                NULL::text;
        END LOOP;
    END IF;

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
    'Checks the facts a deployment depends on: timeouts as the server applies them (for this session and for every role that owns steps or jobs), advisory locks leaked by idle sessions, backends of batch work waiting on a client that stopped reading, chains and jobs stopped half-way, jobs whose drainers wait for their pace (what for, and when they should finish), in conflict, whose last drain failed or whose target is gone, launches whose workers are not all at work, expired leases, on a Citus coordinator each worker''s two-phase commit and the chunks of jobs on distributed tables by node, isolation, durability, the crash_at test aid, privileges and the installed version.';
REVOKE ALL ON FUNCTION etc_batch.doctor() FROM PUBLIC;

-- register_job and register_job_from_query take set_expressions (columns set to an SQL
-- expression over the row's own columns, kept in job.set_expressions as PostgreSQL
-- prints them back: src/job/change/set_expressions.rs), what to do to each row (action),
-- a move's archive, whether a delete keeps its rows (keep_deleted) and the columns set
-- to each item's own value (set_from_query); pace_job takes transaction_time: made
-- again, with the EXECUTE grants they had.
DO $remake$
DECLARE
    old regprocedure;
    grantees regrole[];
    g regrole;
    grant_sql text;
    signatures constant text[][] := ARRAY[
        ['etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean)',
         'etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[])'],
        ['etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean)',
         'etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[])'],
        ['etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text)',
         'etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text, interval)']];
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
    record_before boolean DEFAULT false, set_expressions jsonb DEFAULT NULL,
    action text DEFAULT 'update', archive regclass DEFAULT NULL,
    keep_deleted boolean DEFAULT true, set_from_query name[] DEFAULT NULL)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_wrapper';
COMMENT ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) IS
    'Freezes an approved list of items for a job on any table with a primary key or unique index (a tenant, a revision column and a key of one column are optional), whose chunks commit in order or, with parallel, in any order by many drainers; each row that passes its guard is updated (set_values sets constants, set_expressions columns to an SQL expression over the row''s own columns, checked and kept as PostgreSQL prints it back, set_from_query columns to each item''s own value, such as a value an items query read through a join, the values before of both recorded; or a handler is called for it), deleted (action delete) or moved to an archive table (action move), a deleted row kept with the audit unless keep_deleted is false; on_drift says whether a drifted row stops the job or is skipped; the same request again changes nothing, a different one under the same job id is refused.';
REVOKE ALL ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) FROM PUBLIC;

CREATE FUNCTION etc_batch.register_job_from_query(
    job_id text, tenant text, target regclass, items_query text, chunk_size integer,
    set_values jsonb, expect jsonb DEFAULT '{}', key_column name DEFAULT NULL,
    tenant_column name DEFAULT 'tenant', revision_column name DEFAULT 'revision',
    handler regprocedure DEFAULT NULL, parallel boolean DEFAULT false,
    key_columns name[] DEFAULT NULL, guard text DEFAULT NULL, on_drift text DEFAULT 'stop',
    record_before boolean DEFAULT false, set_expressions jsonb DEFAULT NULL,
    action text DEFAULT 'update', archive regclass DEFAULT NULL,
    keep_deleted boolean DEFAULT true, set_from_query name[] DEFAULT NULL)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_from_query_wrapper';
COMMENT ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) IS
    'Freezes the rows of a SELECT, run once as the registering role in one snapshot, as the approved items of a job; otherwise as register_job.';
REVOKE ALL ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) FROM PUBLIC;

CREATE FUNCTION etc_batch.pace_job(
    job_id text, rows_per_second integer DEFAULT NULL, max_replica_lag_bytes bigint DEFAULT NULL,
    max_archive_backlog integer DEFAULT NULL, yield_to_vacuum boolean DEFAULT false,
    windows text[] DEFAULT NULL, time_zone text DEFAULT NULL, throttle_query text DEFAULT NULL,
    pause_above_replica_lag_bytes bigint DEFAULT NULL, pause_above_archive_backlog integer DEFAULT NULL,
    critical_query text DEFAULT NULL, transaction_time interval DEFAULT NULL)
RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'pace_job_wrapper';
COMMENT ON FUNCTION etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text, interval) IS
    'Sets a job''s whole pace: rows per second for all its drainers together, the signals they wait for (replica lag, WAL archive backlog, a VACUUM of the table, windows, a throttle query) and those that pause the job (pause_above_replica_lag_bytes, pause_above_archive_backlog, critical_query), and how long a drain''s transaction may take (transaction_time: as many chunks as fit commit together); what a call does not name has no limit afterwards, and pace_job(job_id) clears it all. Not part of the approval.';
REVOKE ALL ON FUNCTION etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text, interval) FROM PUBLIC;
$ddl$;
    FOREACH grant_sql IN ARRAY grants LOOP
        EXECUTE grant_sql;
    END LOOP;
END
$remake$;
COMMENT ON FUNCTION etc_batch.job_report(text) IS
    'Every approved item of a job: unprocessed, skipped, or committed and now matching, drifted or missing (for a job that deletes its rows: deleted by the job, or moved to the archive). Shown to the role that registered the job (and its members) and to readers of etc_batch.job.';

-- add_step looked for a paused step of its batch by reading every step of the batch:
-- adding many steps to one batch took time that grew with the square of their number
CREATE INDEX batch_log_paused ON etc_batch.batch_log (batch) WHERE paused_at IS NOT NULL;
