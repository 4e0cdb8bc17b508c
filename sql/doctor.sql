-- etc_batch.doctor(): checks the facts a deployment depends on, as the server really
-- applies them, not as a configuration file or a connection string intends them.
-- Loaded after the tables it reads (the order is in src/lib.rs).

CREATE FUNCTION etc_batch.doctor()
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
