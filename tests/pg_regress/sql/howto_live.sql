-- docs/how-to/live-primary.md: a job paced on a primary that serves an application:
-- rows per second, replicas, WAL archiving, a VACUUM, windows, a critical signal that
-- pauses it, and a pause by hand. At the default settings.
\set SHOW_CONTEXT never
CREATE EXTENSION etc_batch;
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL);
INSERT INTO orders SELECT g, 'paid' FROM generate_series(1, 2000) g;
CREATE TABLE alarms (raised_at timestamptz NOT NULL DEFAULT now());
SELECT * FROM etc_batch.register_job_from_query('settle', NULL, 'orders',
    'SELECT id FROM orders', 200, set_values => '{"status": "settled"}',
    revision_column => NULL);

-- The pace: at most 5,000 rows a second; wait while a replica is 64 MB behind or 8
-- WAL segments wait to be archived, and while a VACUUM of the table runs; work only
-- at night on weekdays and all weekend; pause when the application raises an alarm.
SELECT etc_batch.pace_job('settle', rows_per_second => 5000,
    max_replica_lag_bytes => 64 * 1024 * 1024, max_archive_backlog => 8,
    yield_to_vacuum => true,
    windows => ARRAY['mon-fri 22:00-06:00', 'sat 06:00-24:00', 'sun 00:00-24:00'],
    time_zone => 'Europe/Berlin',
    critical_query => 'SELECT count(*) > 0 FROM alarms');
SELECT job_id, rows_per_second, max_replica_lag_bytes, windows FROM etc_batch.job_pace;

-- The pace is changed while the job runs; here the windows go, the rest stays.
SELECT etc_batch.pace_job('settle', rows_per_second => 5000,
    max_replica_lag_bytes => 64 * 1024 * 1024, max_archive_backlog => 8,
    yield_to_vacuum => true, critical_query => 'SELECT count(*) > 0 FROM alarms');

-- An alarm: the next chunk's drainer pauses the job, naming why.
INSERT INTO alarms DEFAULT VALUES;
\set VERBOSITY terse
CALL etc_batch.drain_job('settle', max_chunks => 2);
\set VERBOSITY default
SELECT job_id, committed, paused_at IS NOT NULL AS paused, pause_reason FROM etc_batch.job_progress;

-- The alarm cleared, a person resumes it; a pause by hand works the same way.
DELETE FROM alarms;
SELECT etc_batch.resume_job('settle');
CALL etc_batch.drain_job('settle', max_chunks => 2);
SELECT etc_batch.pause_job('settle');
SELECT etc_batch.resume_job('settle');
CALL etc_batch.drain_job('settle');
