-- Who a launch's workers connect as: the role that launched it. On PostgreSQL 15 and 16
-- a background worker connects only as a role that can log in, so a launch by a NOLOGIN
-- role is refused (28000) before anything starts (expected/launch_roles.out); from 17 on
-- any role may launch, and its workers drain as that role (expected/launch_roles_1.out).
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
    jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean) TO regress_nologin_launcher;
GRANT EXECUTE ON PROCEDURE etc_batch.drain_job(text, integer, text, text, bigint, integer,
    bigint, text, text, text) TO regress_nologin_launcher;
GRANT SELECT, UPDATE ON orders TO regress_nologin_launcher;

SET ROLE regress_nologin_launcher;
SELECT items, chunks FROM etc_batch.register_job_from_query('by-nologin', NULL, 'orders',
    $$SELECT id FROM orders$$, 50, '{"status": "shipped"}',
    tenant_column => NULL, revision_column => NULL);
SELECT launch_id, workers FROM etc_batch.launch_job('by-nologin', 1);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

SELECT wait_for((SELECT max(launch_id) FROM etc_batch.launch WHERE job_id = 'by-nologin'));
SELECT count(*) FILTER (WHERE status = 'shipped') AS shipped, count(*) FROM orders;
SELECT DISTINCT role = 'regress_nologin_launcher'::regrole AS as_the_launcher, outcome
  FROM etc_batch.launches WHERE job_id = 'by-nologin';

DROP OWNED BY regress_nologin_launcher;
DROP ROLE regress_nologin_launcher;
