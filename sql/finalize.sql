-- Loaded last: the procedures (C functions declared by hand, since they commit),
-- comments, and privileges.

CREATE PROCEDURE etc_batch.exec_batch_from_id(
    p_id bigint,
    wait boolean DEFAULT true,
    lease_name text DEFAULT NULL,
    lease_holder text DEFAULT NULL,
    lease_generation bigint DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_exec_batch_from_id';

COMMENT ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean, text, text, bigint) IS
    'Runs step p_id and every later step of its batch, each exactly once in a transaction of its own; wait => false returns at once when another runner holds the step.';
COMMENT ON FUNCTION etc_batch.add_step(text, text, bigint) IS
    'Adds a step to a batch and returns its id; the step will run with the privileges of the role that adds it.';
COMMENT ON FUNCTION etc_batch.reset_batch(text) IS
    'Puts every step of a batch back to pending for its next run and returns how many; step_audit keeps the history.';
COMMENT ON FUNCTION etc_batch.retry_step(bigint) IS
    'Puts a failed step back to pending.';

-- Who may run and change chains is the administrator's decision, as with pg_cron.
REVOKE ALL ON PROCEDURE etc_batch.exec_batch_from_id(bigint, boolean, text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.add_step(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.reset_batch(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.retry_step(bigint) FROM PUBLIC;

CREATE PROCEDURE etc_batch.drain_job(
    job_id text,
    max_chunks integer DEFAULT NULL,
    lease_name text DEFAULT NULL,
    lease_holder text DEFAULT NULL,
    lease_generation bigint DEFAULT NULL,
    INOUT committed_keys text[] DEFAULT NULL,
    INOUT committed_chunks integer DEFAULT NULL,
    INOUT status text DEFAULT NULL)
LANGUAGE c AS 'MODULE_PATHNAME', 'etc_batch_drain_job';

COMMENT ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, text[], integer, text) IS
    'Commits the next chunks of a registered job, each in a transaction of its own with its audit rows and checkpoint; returns the keys and chunks this call committed and the job''s status.';
COMMENT ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure) IS
    'Freezes an approved list of items for a job; the same request again changes nothing, a different one under the same job id is refused.';
COMMENT ON FUNCTION etc_batch.job_report(text) IS
    'Every approved item of a job: unprocessed, or committed and now matching, drifted or missing.';
COMMENT ON FUNCTION etc_batch.job_summary(text) IS
    'A job''s status and its items counted by state.';
COMMENT ON FUNCTION etc_batch.verify_job(text) IS
    'Compares every audit row of a job with its approved list; a pending job that fails becomes corrupt.';
COMMENT ON FUNCTION etc_batch.abort_job(text, text) IS
    'Stops a job for good, keeping its approval, audit and checkpoint.';

REVOKE ALL ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, text[], integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.job_report(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.job_summary(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.verify_job(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.abort_job(text, text) FROM PUBLIC;

-- Leases ---------------------------------------------------------------------------

CREATE VIEW etc_batch.leases AS
SELECT l.name, l.holder, l.generation,
       l.acquired_at AS acquired,
       l.renewed_at AS renewed,
       l.expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS expires_in,
       l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() AS expired
  FROM etc_batch.lease l;

COMMENT ON VIEW etc_batch.leases IS
    'Every lease: its holder, generation, when it was acquired and renewed, and how long until it expires (negative once expired).';
COMMENT ON FUNCTION etc_batch.acquire_lease(text, text, interval) IS
    'Takes a free or expired lease (generation + 1), renews the caller''s own (same generation), or returns acquired = false with the current holder.';
COMMENT ON FUNCTION etc_batch.release_lease(text, text) IS
    'Ends the caller''s lease now; the generation stays.';
COMMENT ON FUNCTION etc_batch.check_lease(text, text, bigint) IS
    'Raises SQLSTATE 0B000 unless the holder still holds that generation, unexpired; the lease then cannot change hands until the calling transaction ends.';

-- Lock helpers: transaction-scoped only, safe behind a transaction-mode pooler -----

CREATE FUNCTION etc_batch.lock_key(namespace text, key text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF namespace IS NULL OR key IS NULL THEN
        RAISE EXCEPTION 'namespace and key of a lock must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF namespace = '' THEN
        RAISE EXCEPTION 'namespace of a lock must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The byte length first, so that ('ab', 'c') and ('a', 'bc') never share a key.
    RETURN hashtextextended(octet_length(namespace)::text || ':' || namespace || key, 0);
END
$$;

CREATE FUNCTION etc_batch.try_xact_lock(namespace text, key text) RETURNS boolean
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN pg_catalog.pg_try_advisory_xact_lock(etc_batch.lock_key(namespace, key));

CREATE FUNCTION etc_batch.xact_lock(namespace text, key text) RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN pg_catalog.pg_advisory_xact_lock(etc_batch.lock_key(namespace, key));

COMMENT ON FUNCTION etc_batch.lock_key(text, text) IS
    'A stable 64-bit advisory lock key for (namespace, key): hashtextextended(octet_length(namespace) || '':'' || namespace || key, 0).';
COMMENT ON FUNCTION etc_batch.try_xact_lock(text, text) IS
    'pg_try_advisory_xact_lock on lock_key(namespace, key): released at COMMIT or ROLLBACK, so it works behind a transaction-mode pooler.';
COMMENT ON FUNCTION etc_batch.xact_lock(text, text) IS
    'pg_advisory_xact_lock on lock_key(namespace, key): waits, and is released at COMMIT or ROLLBACK.';

-- Every advisory lock held or awaited now, every lock on etc_batch's tables, and the
-- steps, jobs and leases whose rows are locked, with who holds them.
CREATE VIEW etc_batch.locks AS
WITH ours AS (
    SELECT c.oid, c.oid::pg_catalog.regclass::pg_catalog.text AS name,
           CASE c.relkind WHEN 'i' THEN 'index' ELSE 'table' END AS kind
      FROM pg_catalog.pg_class c
     WHERE c.relnamespace OPERATOR(pg_catalog.=) 'etc_batch'::pg_catalog.regnamespace
       AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'i']::pg_catalog."char"[])),
held AS (
    SELECT l.pid, 'advisory'::pg_catalog.text AS kind, l.mode, l.granted,
           CASE WHEN l.objsubid OPERATOR(pg_catalog.=) 1
                THEN 'advisory key ' OPERATOR(pg_catalog.||)
                     ((l.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
                      OPERATOR(pg_catalog.|) l.objid::pg_catalog.int8)::pg_catalog.text
                ELSE 'advisory key pair (' OPERATOR(pg_catalog.||) l.classid::pg_catalog.text
                     OPERATOR(pg_catalog.||) ', ' OPERATOR(pg_catalog.||) l.objid::pg_catalog.text
                     OPERATOR(pg_catalog.||) ')' END AS stands_for
      FROM pg_catalog.pg_locks l
     WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
    UNION ALL
    -- AccessShareLock is what every reader takes (this view included) and blocks only
    -- ACCESS EXCLUSIVE, so it is left out.
    SELECT l.pid, 'table', l.mode, l.granted, o.kind OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) o.name
      FROM pg_catalog.pg_locks l
      JOIN ours o ON o.oid OPERATOR(pg_catalog.=) l.relation
     WHERE l.locktype OPERATOR(pg_catalog.=) 'relation'
       AND l.mode OPERATOR(pg_catalog.<>) 'AccessShareLock'
    UNION ALL
    SELECT x.pid, 'row', 'FOR UPDATE', true,
           pg_catalog.format('step %s of batch %s', b.id, pg_catalog.quote_literal(b.batch))
      FROM etc_batch.batch_log b
      JOIN pg_catalog.pg_locks x
        ON x.locktype OPERATOR(pg_catalog.=) 'transactionid' AND x.granted
       AND x.transactionid OPERATOR(pg_catalog.=) b.xmax
    UNION ALL
    SELECT x.pid, 'row', 'FOR UPDATE', true,
           pg_catalog.format('job %s', pg_catalog.quote_literal(j.job_id))
      FROM etc_batch.job j
      JOIN pg_catalog.pg_locks x
        ON x.locktype OPERATOR(pg_catalog.=) 'transactionid' AND x.granted
       AND x.transactionid OPERATOR(pg_catalog.=) j.xmax
    UNION ALL
    SELECT x.pid, 'row', 'FOR SHARE', true,
           pg_catalog.format('lease %s', pg_catalog.quote_literal(e.name))
      FROM etc_batch.lease e
      JOIN pg_catalog.pg_locks x
        ON x.locktype OPERATOR(pg_catalog.=) 'transactionid' AND x.granted
       AND x.transactionid OPERATOR(pg_catalog.=) e.xmax)
SELECT h.pid, h.kind, h.mode, h.granted,
       -- pg_locks does not say whether an advisory lock is session-level. A granted
       -- one whose holder has no transaction open can only be: true. Otherwise NULL.
       CASE WHEN h.kind OPERATOR(pg_catalog.=) 'advisory' AND h.granted AND a.xact_start IS NULL
            THEN true END AS session_level,
       h.stands_for,
       a.usename AS holder_role,
       a.state AS holder_state,
       a.query AS holder_query,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) a.xact_start AS transaction_age,
       pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) a.state_change AS in_state_for
  FROM held h
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) h.pid;

COMMENT ON VIEW etc_batch.locks IS
    'Every advisory lock held or awaited, every lock on etc_batch''s tables, and the steps, jobs and leases whose rows are locked now, with the holder''s pid, role, state, query and transaction age.';

REVOKE ALL ON etc_batch.leases, etc_batch.locks FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.acquire_lease(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.release_lease(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.check_lease(text, text, bigint) FROM PUBLIC;
-- The lock helpers hold no data and change nothing of etc_batch's: open to all.
GRANT EXECUTE ON FUNCTION etc_batch.lock_key(text, text), etc_batch.try_xact_lock(text, text),
    etc_batch.xact_lock(text, text) TO PUBLIC;
