-- Leases, fencing, lock helpers and the doctor: the SQL surface. Leadership through a
-- real PgBouncer, killed leaders and stale holders are in tests/pooler.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

-- Free: taken, generation 1. Held by the caller: renewed, same generation. Held by
-- another: not taken, and the holder is named.
SELECT acquired, holder, generation, expires_at > now() AS in_future
  FROM etc_batch.acquire_lease('leader', 'w1', '1 hour');
SELECT acquired, holder, generation FROM etc_batch.acquire_lease('leader', 'w1', '1 hour');
SELECT acquired, holder, generation FROM etc_batch.acquire_lease('leader', 'w2', '1 hour');
SELECT name, holder, generation, expires_in > '59 minutes' AS fresh, expired FROM etc_batch.leases;

-- Fencing: only the holder at its generation passes.
SELECT etc_batch.check_lease('leader', 'w1', 1);
SELECT etc_batch.check_lease('leader', 'w2', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.check_lease('leader', 'w1', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.check_lease('nobody', 'w1', 1);
\echo :LAST_ERROR_SQLSTATE

-- Released: expired at once, generation kept; the next holder gets generation 2.
SELECT etc_batch.release_lease('leader', 'w2');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.release_lease('leader', 'w1');
SELECT etc_batch.release_lease('leader', 'w1');
SELECT acquired, holder, generation FROM etc_batch.acquire_lease('leader', 'w2', '1 hour');
SELECT etc_batch.check_lease('leader', 'w1', 1);
\echo :LAST_ERROR_SQLSTATE

-- A stale holder's drain_job and exec_batch_from_id commit nothing.
CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1, status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id) SELECT 'X', g FROM generate_series(1, 4) g;
SELECT created FROM etc_batch.register_job('j', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders), 2, '{"status": "cancelled"}');
CALL etc_batch.drain_job('j', lease_name => 'leader', lease_holder => 'w1', lease_generation => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT next_index FROM etc_batch.job WHERE job_id = 'j';
CREATE TABLE side (step int);
SELECT etc_batch.add_step('fenced', 'INSERT INTO side VALUES (1)', 1);
CALL etc_batch.exec_batch_from_id(1, lease_name => 'leader', lease_holder => 'w1', lease_generation => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS side_rows, (SELECT status FROM etc_batch.batch_log WHERE id = 1) FROM side;
-- the holder of generation 2 may
CALL etc_batch.drain_job('j', lease_name => 'leader', lease_holder => 'w2', lease_generation => 2);
CALL etc_batch.exec_batch_from_id(1, lease_name => 'leader', lease_holder => 'w2', lease_generation => 2);
SELECT count(*) AS side_rows FROM side;
-- a lease is named by all three arguments or none
CALL etc_batch.drain_job('j', lease_name => 'leader');
\echo :LAST_ERROR_SQLSTATE

-- Bad input: a clear error, nothing changed.
SELECT * FROM etc_batch.acquire_lease(NULL, 'w1', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.acquire_lease('', 'w1', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.acquire_lease('leader', ' ', '1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.acquire_lease('leader', 'w3', '0 seconds');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.acquire_lease('leader', 'w3', '-5 minutes');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM etc_batch.acquire_lease('leader', 'w3', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.release_lease('no such lease', 'w1');
\echo :LAST_ERROR_SQLSTATE
SELECT name, holder, generation FROM etc_batch.leases ORDER BY name;

-- Lock keys: stable, documented, and never shared by a different (namespace, key).
SELECT etc_batch.lock_key('orders', '42') AS key,
       etc_batch.lock_key('orders', '42') = hashtextextended('6:orders42', 0) AS documented_formula,
       etc_batch.lock_key('ab', 'c') <> etc_batch.lock_key('a', 'bc') AS unambiguous;
SELECT etc_batch.lock_key(NULL, '42');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.lock_key('', '42');
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT etc_batch.try_xact_lock('orders', '42');
SELECT etc_batch.xact_lock('orders', '43');
SELECT kind, mode, granted, session_level, stands_for FROM etc_batch.locks WHERE kind = 'advisory' ORDER BY stands_for;
COMMIT;
-- transaction-scoped: gone at COMMIT
SELECT count(*) AS advisory_locks_left FROM etc_batch.locks WHERE kind = 'advisory';

-- The doctor: every check has a status, and the facts it can know here.
SELECT check_name, status FROM etc_batch.doctor()
 WHERE check_name IN ('default_transaction_isolation', 'synchronous_commit', 'etc_batch.crash_at',
                      'extension version', 'session advisory locks')
 ORDER BY check_name;
SET statement_timeout = '5min';
SELECT status, detail, hint FROM etc_batch.doctor() WHERE check_name = 'statement_timeout (this session)';
RESET statement_timeout;
SELECT status, hint FROM etc_batch.doctor() WHERE check_name = 'statement_timeout (this session)';
SELECT check_name, status, detail FROM etc_batch.doctor() WHERE check_name LIKE 'job %' OR check_name LIKE 'chain %';
SELECT count(*) FILTER (WHERE status NOT IN ('ok', 'warn', 'fail')) AS unknown_statuses FROM etc_batch.doctor();

-- The library users install has no test aid: the setting is refused, as is any
-- etc_batch.* name the library does not define.
SET etc_batch.crash_at = 'after_change';
SET etc_batch.chunk_size_typo = '10';
SELECT check_name, status, detail FROM etc_batch.doctor() WHERE check_name = 'etc_batch.crash_at';

-- The doctor names work that stopped half-way or cannot go on.
SELECT created FROM etc_batch.register_job('j2', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders), 2, '{"status": "shipped"}');
CALL etc_batch.drain_job('j2', 1);
SELECT created FROM etc_batch.register_job('j3', 'X', 'orders', '[{"id": 4, "revision": 1}]', 1, '{"status": "shipped"}');
CALL etc_batch.drain_job('j3');
SELECT etc_batch.add_step('stopped', 'SELECT 1', 11);
SELECT etc_batch.add_step('stopped', 'SELECT 1/0', 12);
CALL etc_batch.exec_batch_from_id(11);
SELECT check_name, status, detail, hint FROM etc_batch.doctor()
 WHERE check_name LIKE 'job %' OR check_name LIKE 'chain %' ORDER BY check_name;
