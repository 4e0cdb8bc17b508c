-- etc_batch 0.4.0 -> 0.5.0. Run by ALTER EXTENSION etc_batch UPDATE; never edit it once
-- 0.5.0 is released: later changes go into a script of their own.
\echo Use "ALTER EXTENSION etc_batch UPDATE" to load this file. \quit

-- job_progress shows a job's number last: an event names the job by it (src/events.rs),
-- and a role that may see the job turns it into the job here. Made again in place, so
-- that it keeps its grants.
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
       COALESCE(w.at_work, 0) AS launched_workers,
       -- the number an event names the job by (src/events.rs), for a role that may see it
       p.job_number
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
    'Per job (the jobs of roles whose privileges the caller has, or all of them for a reader of etc_batch.job): status, items committed of approved, percent, chunks, when it started and last committed, its rate and an estimated finish reckoned from its time at work (not time paused or with nobody draining), whether chunks may commit in any order (parallel), the drainers in a drain_job of it now, waiting between chunks included: how many, and their pids; when and by whom it was paused (by etc_batch itself for a critical signal of its pace, with the reason), its pace, what its drainers wait for (a pace, the replicas, WAL archiving, a VACUUM, its windows, its throttle query, a retry), how many chunks were rolled back for a transient error and tried again (job_retry); on_standby: read on a hot standby, as of the WAL replayed there; the seconds at work; when its last drain failed for a reason other than a conflict, with what SQLSTATE and message, in which chunk; what the approval does with a drifted item; and for a job continued by register_remainder, its successor; the job''s launch that runs, and how many of its background workers are at work; the job''s number, which its events on the channel etc_batch name it by.';
