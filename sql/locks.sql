-- Lock helpers and the locks view. The helpers are transaction-scoped only, so they are
-- safe behind a transaction-mode pooler.

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

REVOKE ALL ON etc_batch.locks FROM PUBLIC;
-- The lock helpers hold no data and change nothing of etc_batch's: open to all.
GRANT EXECUTE ON FUNCTION etc_batch.lock_key(text, text), etc_batch.try_xact_lock(text, text),
    etc_batch.xact_lock(text, text) TO PUBLIC;
