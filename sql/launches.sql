-- Launches: work the server finishes by itself. launch_job and launch_batch start
-- background workers that drain a job or run a chain to the end with no client session
-- held (src/launch). A launch is a row here, written in the launching transaction: its
-- workers act only once that transaction has committed, and a launch rolled back runs
-- nothing. Every start of a worker is a run, with its outcome, in the shape of pg_cron's
-- job_run_details.

CREATE TABLE etc_batch.launch (
    launch_id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id              text,
    step_id             bigint,
    workers             integer     NOT NULL CHECK (workers > 0),
    launched_by         regrole     NOT NULL,
    launched_at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- the launching transaction, which its workers wait for before they act
    launching_xid       xid8        NOT NULL,
    -- what a NOTICE of the work would have reached the launching client at, and so
    -- reaches the server log at
    client_min_messages text        NOT NULL,
    status              text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'done', 'paused', 'conflict', 'failed', 'stopped')),
    stopped_by          regrole,
    ended_at            timestamptz,
    CHECK ((job_id IS NULL) <> (step_id IS NULL))
);

COMMENT ON TABLE etc_batch.launch IS
    'Work launched to run in background workers: a job''s drain (job_id) or a chain from a step (step_id), by how many workers, by whom and when; running until its work ends (done, paused, in conflict, failed) or stop_launch stops it. Its workers act only once the launching transaction (launching_xid) has committed.';

CREATE TABLE etc_batch.launch_run (
    launch_id  bigint      NOT NULL REFERENCES etc_batch.launch ON DELETE CASCADE,
    worker     integer     NOT NULL,
    run        integer     NOT NULL,
    pid        integer     NOT NULL,
    -- who started this run: the launch itself, or, once an earlier process of the worker
    -- ended without saying how (terminated, a crash, a restart) or a pause of its work
    -- ended, its database's supervisor or resume_launches
    started_by text        NOT NULL CHECK (started_by IN ('launch', 'resume')),
    started_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    ended_at   timestamptz,
    outcome    text CHECK (outcome IN ('done', 'pending', 'paused', 'conflict', 'failed', 'stopped',
                                       'interrupted')),
    sqlstate   text,
    message    text,
    PRIMARY KEY (launch_id, worker, run)
);

COMMENT ON TABLE etc_batch.launch_run IS
    'Every start of a launch''s worker: which of its workers, the how-many-th start of it, the pid, who started it and when, when it ended and how: done, pending (the chunks left were all held by its fellow workers), paused, conflict, failed (with the SQLSTATE and message), stopped, or interrupted (its process ended without saying: terminated, a crash, a restart).';

-- A launch and its runs as pg_cron's job_run_details shows them. Each role sees the
-- launches of roles whose privileges it has; a reader of etc_batch.launch sees all.
CREATE VIEW etc_batch.launches WITH (security_barrier) AS
SELECT l.launch_id, r.worker, r.run, l.job_id, l.step_id,
       l.launched_by AS role, pg_catalog.current_database() AS database,
       r.pid, r.started_by, r.started_at, r.ended_at, r.outcome, r.sqlstate, r.message,
       l.status AS launch_status, l.workers
  FROM etc_batch.launch l
  LEFT JOIN etc_batch.launch_run r ON r.launch_id OPERATOR(pg_catalog.=) l.launch_id
 WHERE pg_catalog.has_table_privilege('etc_batch.launch', 'SELECT')
    OR pg_catalog.pg_has_role(l.launched_by::pg_catalog.oid, 'USAGE');

COMMENT ON VIEW etc_batch.launches IS
    'Every run of every launch''s workers, in the shape of pg_cron''s job_run_details: launch, worker, run, job or chain, role, database, pid, who started it, when it started and ended, its outcome, SQLSTATE and message, and the launch''s status. Shows the launches of roles whose privileges the reader has, or all of them to a reader of etc_batch.launch.';

SELECT pg_catalog.pg_extension_config_dump('etc_batch.launch', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.launch_run', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.launch_launch_id_seq', '');
REVOKE ALL ON etc_batch.launch, etc_batch.launch_run, etc_batch.launches FROM PUBLIC;
GRANT SELECT ON etc_batch.launches TO PUBLIC;
