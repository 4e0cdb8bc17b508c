-- Progress a person can watch: one row per job and one row per chain, read from the
-- checkpoint and the step statuses (what is committed) and from pg_locks (who is at
-- work on it right now).

CREATE VIEW etc_batch.job_progress AS
SELECT j.job_id, j.status,
       j.next_index AS committed,
       j.item_count AS approved,
       pg_catalog.round(100.0 OPERATOR(pg_catalog.*) j.next_index OPERATOR(pg_catalog./) j.item_count, 1) AS percent,
       j.chunks_committed,
       ((j.item_count::pg_catalog.int8 OPERATOR(pg_catalog.+) j.chunk_size OPERATOR(pg_catalog.-) 1)
         OPERATOR(pg_catalog./) j.chunk_size)::pg_catalog.int4 AS chunks_total,
       j.started_at,
       j.last_commit_at,
       -- items per second between the first and the last commit of the job
       CASE WHEN j.last_commit_at OPERATOR(pg_catalog.>) j.started_at
            THEN pg_catalog.round((j.next_index OPERATOR(pg_catalog./)
                 pg_catalog.date_part('epoch', j.last_commit_at OPERATOR(pg_catalog.-) j.started_at))::pg_catalog.numeric, 1)
       END AS items_per_second,
       CASE WHEN j.status OPERATOR(pg_catalog.=) 'pending'
             AND j.last_commit_at OPERATOR(pg_catalog.>) j.started_at
             AND j.next_index OPERATOR(pg_catalog.>) 0
            -- OPERATOR() forms all share one precedence: the parentheses are the order.
            THEN j.last_commit_at OPERATOR(pg_catalog.+)
                 ((j.last_commit_at OPERATOR(pg_catalog.-) j.started_at)
                  OPERATOR(pg_catalog.*) ((j.item_count OPERATOR(pg_catalog.-) j.next_index)::pg_catalog.float8
                                          OPERATOR(pg_catalog./) j.next_index))
       END AS estimated_finish,
       x.pid AS drainer_pid,
       j.status_reason
  FROM etc_batch.job j
  LEFT JOIN pg_catalog.pg_locks x
    ON x.locktype OPERATOR(pg_catalog.=) 'transactionid' AND x.granted
   AND x.transactionid OPERATOR(pg_catalog.=) j.xmax;

COMMENT ON VIEW etc_batch.job_progress IS
    'Per job: status, items committed of approved, percent, chunks, when it started and last committed, the rate between those, an estimated finish at that rate, and the pid of the drainer at work on it now.';

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
            FILTER (WHERE b.status OPERATOR(pg_catalog.=) 'failed'))[1] AS last_error
  FROM etc_batch.batch_log b
  LEFT JOIN running r ON r.id OPERATOR(pg_catalog.=) b.id
 GROUP BY b.batch;

COMMENT ON VIEW etc_batch.chain_progress IS
    'Per chain: steps done, failed and pending, the step being run now and the pid running it, when a step last finished, and the last error of a failed step.';

REVOKE ALL ON etc_batch.job_progress, etc_batch.chain_progress FROM PUBLIC;

-- Pruning history. step_audit and job_audit only grow; pg_dump keeps them. A DBA who
-- wants them shorter asks for it, by age, and never for work that is still open. A job
-- goes with its partitions, dropped whole: no DELETE of its rows, no bloat, no WAL but
-- the catalog's, in the same time for ten items as for ten million. Dropping a
-- partition takes a brief ACCESS EXCLUSIVE lock on the parent (etc_batch.job_item or
-- etc_batch.job_audit); chunks and reports read a job's own partitions, never the parent.
CREATE FUNCTION etc_batch.prune_history(older_than interval)
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

COMMENT ON FUNCTION etc_batch.prune_history(interval) IS
    'Deletes step_audit rows older than the interval, and whole jobs (approval, audit, checkpoint) that ended, done or aborted, before it. Open jobs and jobs in conflict or corrupt are kept.';
REVOKE ALL ON FUNCTION etc_batch.prune_history(interval) FROM PUBLIC;
