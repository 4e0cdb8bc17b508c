-- The signals of a job's pace: set by pace_job's named arguments, shown in job_pace,
-- each refused when it cannot work (nothing stored then); windows that say when a job
-- may run; a critical signal and a failing query that pause the job with the reason.
-- Waits on the live system (archiving, VACUUM, a throttle query, the replicas) are in
-- tests/clients/test_signals.py.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT never

CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1,
                     status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id) SELECT 'X', g FROM generate_series(1, 12) g;
SELECT * FROM etc_batch.register_job('night', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    3, '{"status": "cancelled"}');

-- Every signal set, none tripping: the drain goes on as without them.
SELECT etc_batch.pace_job('night',
    max_replica_lag_bytes => 1024 * 1024 * 1024,
    max_archive_backlog => 100,
    yield_to_vacuum => true,
    windows => ARRAY['mon-sun 00:00-24:00'],
    time_zone => 'Asia/Tokyo',
    throttle_query => 'SELECT count(*) > 1000000 FROM orders',
    pause_above_replica_lag_bytes => 8 * 1024 * 1024 * 1024::bigint,
    pause_above_archive_backlog => 1000,
    critical_query => 'SELECT false');
SELECT rows_per_second, max_replica_lag_bytes, max_archive_backlog, yield_to_vacuum, windows,
       time_zone, throttle_query, pause_above_replica_lag_bytes, pause_above_archive_backlog,
       critical_query
  FROM etc_batch.job_pace WHERE job_id = 'night';
CALL etc_batch.drain_job('night', 1);

-- A later call sets the whole pace: what it does not name has no limit afterwards, and
-- the windows' time zone is the session's when it names none.
SET TimeZone = 'Europe/Berlin';
SELECT etc_batch.pace_job('night', windows => ARRAY['sat,sun 00:00-24:00', 'mon-thu 22:00-06:00', 'fri 22:00-24:00']);
SELECT rows_per_second, max_archive_backlog, yield_to_vacuum, windows, time_zone, throttle_query
  FROM etc_batch.job_pace WHERE job_id = 'night';
RESET TimeZone;

-- Outside its windows a call returns at once with status outside_windows (when the next
-- window opens is in the DETAIL, hidden by terse verbosity); nothing changes.
SELECT CASE extract(isodow FROM now() AT TIME ZONE 'UTC')::int
            WHEN 1 THEN 'wed' WHEN 2 THEN 'thu' WHEN 3 THEN 'fri' WHEN 4 THEN 'sat'
            WHEN 5 THEN 'sun' WHEN 6 THEN 'mon' ELSE 'tue' END AS not_today \gset
SELECT etc_batch.pace_job('night', windows => ARRAY[:'not_today' || ' 00:00-24:00'], time_zone => 'UTC');
\set VERBOSITY terse
CALL etc_batch.drain_job('night');
\set VERBOSITY default
SELECT status, committed FROM etc_batch.job_progress WHERE job_id = 'night';

-- A critical query that says true pauses the job, as pause_job would, with the reason
-- kept: job_progress and the doctor show it, and a person resumes. (Signals are read at
-- most once per etc_batch.signal_interval; 0 reads them before every chunk.)
SET etc_batch.signal_interval = 0;
SELECT etc_batch.pace_job('night', critical_query => 'SELECT count(*) > 0 FROM orders WHERE status = ''cancelled''');
\set VERBOSITY terse
CALL etc_batch.drain_job('night');
\set VERBOSITY default
SELECT status, committed, paused_by IS NOT NULL AS paused, pause_reason FROM etc_batch.job_progress WHERE job_id = 'night';
SELECT check_name, status, detail ~ '^The job was paused by etc_batch at .*: its critical_query returned true; 3 of 12 items committed\.$' AS says_why, hint
  FROM etc_batch.doctor() WHERE check_name = 'job night';
\set VERBOSITY terse
CALL etc_batch.drain_job('night');
\set VERBOSITY default
SELECT etc_batch.resume_job('night');

-- A throttle query that fails while the job runs pauses it with the query's own SQLSTATE
-- and message, and changes nothing.
SELECT etc_batch.pace_job('night', throttle_query => 'SELECT 1 / (count(*) - 12) > 0 FROM orders');
\set VERBOSITY terse
CALL etc_batch.drain_job('night');
\set VERBOSITY default
SELECT status, committed, pause_reason FROM etc_batch.job_progress WHERE job_id = 'night';
SELECT etc_batch.resume_job('night');

-- A DBA's query runs as the registrant, with the job's search_path, and whatever it
-- calls writes is rolled back: a throttle query that says false lets the job finish.
CREATE TABLE noted (at timestamptz);
CREATE FUNCTION note() RETURNS boolean LANGUAGE sql AS 'INSERT INTO noted VALUES (now()) RETURNING false';
SELECT etc_batch.pace_job('night', throttle_query => 'SELECT note()');
CALL etc_batch.drain_job('night');
SELECT count(*) AS noted FROM noted;
SELECT status, committed, approved FROM etc_batch.job_progress WHERE job_id = 'night';

-- Refusals, each with nothing stored: the pace stays as it was.
SELECT etc_batch.pace_job('night', max_archive_backlog => 5, windows => ARRAY['mon-fri 08:00-18:00']);
SELECT etc_batch.pace_job('night', max_archive_backlog => -1);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', pause_above_replica_lag_bytes => -5);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', pause_above_archive_backlog => -1);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', no_such_signal => 1);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', windows => ARRAY['mon 08:00-18:00'], time_zone => 'Mars/Olympus_Mons');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', time_zone => 'UTC');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', windows => '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', windows => ARRAY['mon 08:00-08:00']);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', windows => ARRAY['mon-fri 22:00-06:00', 'sat 05:00-07:00']);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', windows => ARRAY['weekdays 22:00-06:00']);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', windows => ARRAY['mon 8:00-18:00']);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', throttle_query => 'DELETE FROM orders RETURNING true');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', throttle_query => 'WITH d AS (DELETE FROM orders RETURNING 1) SELECT true');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', critical_query => 'SELECT true FROM orders FOR UPDATE');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', throttle_query => 'SELECT true; SELECT true');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', throttle_query => 'SELEC true');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', throttle_query => 'SELECT true, false');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', critical_query => 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('night', throttle_query => 'SELECT true FROM no_such_table');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.pace_job('nope', throttle_query => 'SELECT true');
\echo :LAST_ERROR_SQLSTATE
SELECT max_archive_backlog, windows, throttle_query, critical_query
  FROM etc_batch.job_pace WHERE job_id = 'night';

-- Another role's job: its signals are set by its registrant (or a member of it), 42501.
CREATE ROLE signals_other;
GRANT USAGE ON SCHEMA etc_batch TO signals_other;
GRANT EXECUTE ON FUNCTION etc_batch.pace_job TO signals_other;
SET ROLE signals_other;
SELECT etc_batch.pace_job('night', yield_to_vacuum => true);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- One call clears it all.
SELECT etc_batch.pace_job('night');
SELECT count(*) AS paces FROM etc_batch.job_pace WHERE job_id = 'night';
REVOKE ALL ON SCHEMA etc_batch FROM signals_other;
REVOKE ALL ON FUNCTION etc_batch.pace_job FROM signals_other;
DROP ROLE signals_other;
