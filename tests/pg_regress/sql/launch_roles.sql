-- Who a launch's workers connect as: the role that launched it. On PostgreSQL 15 and 16
-- a background worker connects only as a role that can log in, so a launch by a NOLOGIN
-- role is refused (28000, its hint the ALTER ROLE that allows it) before anything
-- starts; from 17 on any role may launch, and its workers drain as that role. The
-- output is the same on every version: the last query says what this server's version
-- must do and whether it did, so that each version passes only with its own behaviour.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

-- Waits until a launch has ended and every run of its workers too (one statement, one
-- snapshot, each time round), and says how the launch ended; NULL for no launch.
CREATE FUNCTION wait_for(which bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s text;
    busy boolean;
BEGIN
    FOR i IN 1 .. 1200 LOOP
        SELECT l.status, EXISTS (SELECT FROM etc_batch.launch_run r
                                  WHERE r.launch_id = l.launch_id AND r.ended_at IS NULL)
          INTO s, busy
          FROM etc_batch.launch l WHERE l.launch_id = which;
        EXIT WHEN NOT FOUND OR (s IS DISTINCT FROM 'running' AND NOT busy);
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN s;
END $$;

CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending');
INSERT INTO orders SELECT g FROM generate_series(1, 200) g;
CREATE ROLE regress_nologin_launcher NOLOGIN;
GRANT USAGE ON SCHEMA etc_batch TO regress_nologin_launcher;
GRANT EXECUTE ON FUNCTION etc_batch.launch_job(text, integer) TO regress_nologin_launcher;
GRANT EXECUTE ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer,
    jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) TO regress_nologin_launcher;
GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer,
    bigint, text, text, text) TO regress_nologin_launcher;
GRANT SELECT, UPDATE ON orders TO regress_nologin_launcher;

SET ROLE regress_nologin_launcher;
SELECT items, chunks FROM etc_batch.register_job_from_query('by-nologin', NULL, 'orders',
    $$SELECT id FROM orders$$, 50, '{"status": "shipped"}',
    tenant_column => NULL, revision_column => NULL);
-- The launch, and how it went, kept in regress.launch: 'launched', or the SQLSTATE and
-- the hint of its refusal. (The NOTICE that etc_batch is not preloaded, which a launch
-- made on 17 and 18 gives here, is left out.)
SET client_min_messages = warning;
DO $$
DECLARE
    hint text;
BEGIN
    PERFORM etc_batch.launch_job('by-nologin', 1);
    PERFORM set_config('regress.launch', 'launched', false);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
    PERFORM set_config('regress.launch', SQLSTATE || ' ' || hint, false);
END $$;
RESET client_min_messages;
RESET ROLE;

SELECT coalesce(wait_for((SELECT max(launch_id) FROM etc_batch.launch WHERE job_id = 'by-nologin')),
                'no launch') AS ended \gset
WITH runs AS (
    SELECT count(DISTINCT launch_id) AS launches,
           bool_and(role = 'regress_nologin_launcher'::regrole AND outcome = 'done') AS done_as_the_launcher
      FROM etc_batch.launches WHERE job_id = 'by-nologin'),
     shipped AS (SELECT count(*) FILTER (WHERE status = 'shipped') AS orders FROM orders)
SELECT 'refused with 28000 on 15 and 16, drained as the launcher on 17 and 18' AS a_nologin_launch_is,
       CASE WHEN current_setting('server_version_num')::int < 170000
            THEN current_setting('regress.launch')
                     = '28000 ALTER ROLE "regress_nologin_launcher" LOGIN, or launch as a role that may log in.'
                 AND :'ended' = 'no launch' AND r.launches = 0 AND s.orders = 0
            ELSE current_setting('regress.launch') = 'launched'
                 AND :'ended' = 'done' AND r.launches = 1 AND r.done_as_the_launcher AND s.orders = 200
       END AS on_this_server
  FROM runs r, shipped s;

DROP OWNED BY regress_nologin_launcher;
DROP ROLE regress_nologin_launcher;
