//! The statements of launches, run as the extension's owner unless said otherwise.

/// A new launch, written in the launching transaction, whose id it is given.
/// $1 job, $2 first step, $3 workers, $4 the launching role, $5 client_min_messages.
pub const INSERT_LAUNCH: &str = "\
INSERT INTO etc_batch.launch (job_id, step_id, workers, launched_by, launching_xid, client_min_messages)
VALUES ($1, $2, $3, $4::pg_catalog.oid::pg_catalog.regrole, pg_catalog.pg_current_xact_id(), $5)
RETURNING launch_id, launching_xid::pg_catalog.text AS launching_xid";

/// A launch as a worker reads it when it starts. $1 launch.
pub const LAUNCH: &str = "\
SELECT l.job_id, l.step_id, l.workers, l.launched_by::pg_catalog.oid AS launched_by,
       l.launching_xid::pg_catalog.text AS launching_xid, l.client_min_messages, l.status
  FROM etc_batch.launch l
 WHERE l.launch_id OPERATOR(pg_catalog.=) $1";

/// A worker's start: its runs before that never ended are interrupted (their process is
/// gone, the worker's lock says so), and a new run begins. $1 launch, $2 worker,
/// $3 who started it ("launch" or "resume").
pub const BEGIN_RUN: &str = "\
WITH gone AS (
    UPDATE etc_batch.launch_run r
       SET ended_at = pg_catalog.now(), outcome = 'interrupted'
     WHERE r.launch_id OPERATOR(pg_catalog.=) $1 AND r.worker OPERATOR(pg_catalog.=) $2
       AND r.ended_at IS NULL
    RETURNING r.run),
  before AS (
    SELECT pg_catalog.max(r.run) AS run FROM etc_batch.launch_run r
     WHERE r.launch_id OPERATOR(pg_catalog.=) $1 AND r.worker OPERATOR(pg_catalog.=) $2)
INSERT INTO etc_batch.launch_run (launch_id, worker, run, pid, started_by)
SELECT $1, $2, COALESCE(b.run, 0) OPERATOR(pg_catalog.+) 1, pg_catalog.pg_backend_pid(),
       $3
  FROM before b
RETURNING run";

/// How a run ended. $1 launch, $2 worker, $3 run, $4 outcome, $5 SQLSTATE, $6 message.
pub const END_RUN: &str = "\
UPDATE etc_batch.launch_run
   SET ended_at = pg_catalog.now(), outcome = $4, sqlstate = $5, message = $6
 WHERE launch_id OPERATOR(pg_catalog.=) $1 AND worker OPERATOR(pg_catalog.=) $2
   AND run OPERATOR(pg_catalog.=) $3";

/// The launch ends, unless it ended already (stopped, or ended by another worker): true
/// when it ended now. $1 launch, $2 status.
pub const END_LAUNCH: &str = "\
UPDATE etc_batch.launch
   SET status = $2, ended_at = pg_catalog.now()
 WHERE launch_id OPERATOR(pg_catalog.=) $1 AND status OPERATOR(pg_catalog.=) 'running'
RETURNING true";

/// stop_launch: the launch stopped, if it runs; its status either way, and who launched
/// it. $1 launch, $2 the stopping role.
pub const STOP_LAUNCH: &str = "\
WITH stopped AS (
    UPDATE etc_batch.launch
       SET status = 'stopped', stopped_by = $2::pg_catalog.oid::pg_catalog.regrole,
           ended_at = pg_catalog.now()
     WHERE launch_id OPERATOR(pg_catalog.=) $1 AND status OPERATOR(pg_catalog.=) 'running'
    RETURNING launch_id)
SELECT l.status, l.launched_by::pg_catalog.oid AS launched_by,
       EXISTS (SELECT FROM stopped) AS stopped
  FROM etc_batch.launch l
 WHERE l.launch_id OPERATOR(pg_catalog.=) $1";

/// Launches of this database that run, with their workers: what a supervisor keeps at
/// work; and whether each is of the last ten seconds, when its first workers may still
/// be starting.
pub const RUNNING_LAUNCHES: &str = "\
SELECT l.launch_id, l.workers, l.launched_by::pg_catalog.oid AS launched_by,
       l.launching_xid::pg_catalog.text AS launching_xid,
       -- OPERATOR() forms all share one precedence: the parentheses are the order
       l.launched_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) interval '10 seconds')
         AS young
  FROM etc_batch.launch l
 WHERE l.status OPERATOR(pg_catalog.=) 'running'
 ORDER BY l.launch_id";

/// Runs of launches that ended, whose process is gone without saying how: interrupted.
/// $1 launch, $2 worker.
pub const INTERRUPTED: &str = "\
UPDATE etc_batch.launch_run
   SET ended_at = pg_catalog.now(), outcome = 'interrupted'
 WHERE launch_id OPERATOR(pg_catalog.=) $1 AND worker OPERATOR(pg_catalog.=) $2
   AND ended_at IS NULL";

/// The launches of a job (or a chain's batch) that its pause ended, running again when it
/// is resumed. $1 job, $2 batch.
pub const RESUME_PAUSED: &str = "\
UPDATE etc_batch.launch l
   SET status = 'running', ended_at = NULL
 WHERE l.status OPERATOR(pg_catalog.=) 'paused'
   AND (l.job_id OPERATOR(pg_catalog.=) $1
        OR l.step_id IN (SELECT b.id FROM etc_batch.batch_log b WHERE b.batch OPERATOR(pg_catalog.=) $2))
RETURNING l.launch_id";

/// etc_batch's workers at work in the whole cluster, and every background worker, as
/// pg_stat_activity shows them. $1 etc_batch's worker type.
pub const WORKERS_IN_USE: &str = "\
SELECT (pg_catalog.count(*) FILTER (WHERE a.backend_type OPERATOR(pg_catalog.=) $1))::pg_catalog.int4
         AS running,
       (pg_catalog.count(*) FILTER (WHERE a.backend_type OPERATOR(pg_catalog.<>) ALL (ARRAY[
            'client backend', 'autovacuum launcher', 'autovacuum worker', 'background writer',
            'checkpointer', 'walwriter', 'startup', 'archiver', 'walsender', 'walreceiver',
            'walsummarizer', 'io worker', 'slotsync worker', 'standalone backend'])))::pg_catalog.int4
         AS in_use
  FROM pg_catalog.pg_stat_activity a";

/// The ids of the locks of key space $1 that sessions of this database hold now, as
/// pg_locks shows them (session_lock.rs): a look that takes no lock of its own.
pub const HELD_LOCKS: &str = "\
SELECT (x.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) x.objid::pg_catalog.int8
         AS id
  FROM pg_catalog.pg_locks x
 WHERE x.locktype OPERATOR(pg_catalog.=) 'advisory' AND x.granted
   AND x.objsubid OPERATOR(pg_catalog.=) $1
   AND x.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                           WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())";

/// Whether these pids all show in pg_stat_activity. $1 the pids.
pub const ALL_SHOWN: &str = "\
SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) pg_catalog.cardinality($1::pg_catalog.int4[])
  FROM pg_catalog.pg_stat_activity a
 WHERE a.pid OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.int4[])";

/// Whether role $1 may log in, and whether the caller may EXECUTE the procedure $2
/// (regprocedure text) that the launch runs.
pub const MAY_LAUNCH: &str = "\
SELECT r.rolcanlogin AS can_login,
       pg_catalog.has_function_privilege($2::pg_catalog.regprocedure, 'EXECUTE') AS may_execute
  FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) $1";

/// Whether etc_batch is installed here at this version. $1 the library's version.
pub const INSTALLED_HERE: &str = "\
SELECT EXISTS (SELECT FROM pg_catalog.pg_extension e
                WHERE e.extname OPERATOR(pg_catalog.=) 'etc_batch'
                  AND e.extversion OPERATOR(pg_catalog.=) $1)";

/// A job as a launch needs it: its status and whether it is parallel. $1 job.
pub const JOB_TO_LAUNCH: &str = "\
SELECT j.status, j.parallel FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1";

/// A chain's step as a launch needs it: its batch. $1 step.
pub const STEP_TO_LAUNCH: &str = "\
SELECT b.batch FROM etc_batch.batch_log b WHERE b.id OPERATOR(pg_catalog.=) $1";

/// Whether a chain run from step $1 stopped before its end: a step of its batch from
/// there on is not done (its batch was paused).
pub const CHAIN_PAUSED: &str = "\
SELECT EXISTS (SELECT FROM etc_batch.batch_log b
                WHERE b.batch OPERATOR(pg_catalog.=) (SELECT s.batch FROM etc_batch.batch_log s
                                                       WHERE s.id OPERATOR(pg_catalog.=) $1)
                  AND b.id OPERATOR(pg_catalog.>=) $1
                  AND b.status OPERATOR(pg_catalog.<>) 'done')";

/// How many runs worker $2 of launch $1 has begun.
pub const RUNS_OF_WORKER: &str = "\
SELECT pg_catalog.count(*) FROM etc_batch.launch_run r
 WHERE r.launch_id OPERATOR(pg_catalog.=) $1 AND r.worker OPERATOR(pg_catalog.=) $2";

/// How many launches of this database run.
pub const RUNNING_COUNT: &str = "\
SELECT pg_catalog.count(*) FROM etc_batch.launch l WHERE l.status OPERATOR(pg_catalog.=) 'running'";

/// Whether the work of a launch is paused now: job $1, or the batch of step $2.
pub const STILL_PAUSED: &str = "\
SELECT EXISTS (SELECT FROM etc_batch.job_pause p WHERE p.job_id OPERATOR(pg_catalog.=) $1)
    OR EXISTS (SELECT FROM etc_batch.batch_log b
                WHERE b.batch OPERATOR(pg_catalog.=) (SELECT s.batch FROM etc_batch.batch_log s
                                                       WHERE s.id OPERATOR(pg_catalog.=) $2)
                  AND b.paused_at IS NOT NULL)";

/// Whether role $1 may log in.
pub const ROLE_CAN_LOGIN: &str = "\
SELECT r.rolcanlogin FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) $1";
