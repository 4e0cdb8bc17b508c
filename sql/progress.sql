-- Progress a person can watch: one row per job and one row per chain, read from the
-- checkpoint and the step statuses (what is committed) and from pg_locks (who is at
-- work on it right now).

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

CREATE VIEW etc_batch.chain_progress AS
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

REVOKE ALL ON etc_batch.job_progress, etc_batch.chain_progress, etc_batch.metrics FROM PUBLIC;
GRANT SELECT ON etc_batch.job_progress TO PUBLIC;

-- Pruning history. step_audit and job_audit only grow; pg_dump keeps them. A DBA who
-- wants them shorter asks for it, by age, and never for work that is still open. A job
-- goes with its partitions, dropped whole: no DELETE of its rows, no bloat, no WAL but
-- the catalog's, in the same time for ten items as for ten million. Dropping a
-- partition takes a brief ACCESS EXCLUSIVE lock on the parent (etc_batch.job_item_chunk or
-- etc_batch.job_audit_chunk); chunks and reports read a job's own partitions, never the parent.
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
