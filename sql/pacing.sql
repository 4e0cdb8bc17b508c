-- Pacing: pauses, and the pace of a job. A person stops a job's drainers at their next
-- chunk and lets them go on later, or sets how fast a job may go and how far behind the
-- replicas may fall. Each is a row of its own, never a change to the job's row, which a
-- drainer holds for the span of each chunk: setting it waits for nothing, and the work
-- in flight reads it at its next chunk. Neither is part of an approval, and neither
-- changes anything committed. (A batch's pause is on its steps' rows: see
-- batch_log.paused_at.) And the retries: the chunks rolled back for a transient error
-- (a lock wait that timed out, a deadlock, a serialization failure) and tried again.

CREATE TABLE etc_batch.job_pause (
    job_id    text        PRIMARY KEY,
    paused_at timestamptz NOT NULL,
    paused_by regrole     NOT NULL,
    -- why etc_batch paused it itself (a critical signal of its pace); NULL: a person did
    reason    text
);

COMMENT ON TABLE etc_batch.job_pause IS
    'The jobs paused by pause_job, when and by whom, or by etc_batch itself for a critical signal of their pace, with the reason: their drainers stop before their next chunk and return with status paused, until resume_job.';

CREATE TABLE etc_batch.job_pace (
    job_id                text        PRIMARY KEY,
    rows_per_second       integer     CHECK (rows_per_second > 0),
    max_replica_lag_bytes bigint      CHECK (max_replica_lag_bytes >= 0),
    set_at                timestamptz NOT NULL,
    set_by                regrole     NOT NULL,
    -- where the pace's clock is: the next chunk of any drainer starts no earlier
    next_slot             timestamptz,
    -- the signals of the whole system (src/job/signals.rs): drainers wait while one
    -- trips, read at most once per etc_batch.signal_interval
    max_archive_backlog   integer     CHECK (max_archive_backlog >= 0),
    yield_to_vacuum       boolean     NOT NULL DEFAULT false,
    windows               text[],
    time_zone             text,
    throttle_query        text,
    -- the critical ones: the job is paused, with the reason in job_pause
    pause_above_replica_lag_bytes bigint  CHECK (pause_above_replica_lag_bytes >= 0),
    pause_above_archive_backlog   integer CHECK (pause_above_archive_backlog >= 0),
    critical_query        text,
    -- how long one transaction of a drain may take: as many chunks as fit go in one
    transaction_time      interval    CHECK (transaction_time > '0' AND transaction_time <= '1 hour')
);

COMMENT ON TABLE etc_batch.job_pace IS
    'The pace set by pace_job: rows per second for all drainers of the job together, and how many WAL bytes the slowest standby or replication slot may be behind before drainers wait. next_slot is when the next chunk may start. The signals drainers wait for: WAL segments waiting to be archived, a VACUUM of the target, the windows (in time_zone) and a throttle query; and those that pause the job: a replica lag, an archive backlog, a critical query. transaction_time sizes each transaction of a drain: as many consecutive chunks as fit it commit together.';

CREATE TABLE etc_batch.job_wait (
    job_id     text   NOT NULL,
    waited_for text   NOT NULL,
    waits      bigint NOT NULL,
    seconds    float8 NOT NULL,
    PRIMARY KEY (job_id, waited_for)
);

COMMENT ON TABLE etc_batch.job_wait IS
    'How often and how long a job''s drainers waited for the signals of its pace, per kind (replicas, archiving, vacuum, windows, throttle_query), added up at the end of each wait: the metrics'' etc_batch_job_waited_seconds and etc_batch_job_waited_waits.';

CREATE TABLE etc_batch.job_retry (
    job_id     text        NOT NULL,
    chunk      integer     NOT NULL,
    attempt    integer     NOT NULL,
    sqlstate   text        NOT NULL,
    message    text        NOT NULL,
    retried_at timestamptz NOT NULL,
    pid        integer     NOT NULL
);

CREATE INDEX job_retry_job_id ON etc_batch.job_retry (job_id, retried_at);

COMMENT ON TABLE etc_batch.job_retry IS
    'Every chunk rolled back for a transient error (40001, 40P01, 55P03) and tried again: which job and chunk, which failed attempt, the SQLSTATE and message, when, and the drainer''s pid. The chunk committed nothing of that attempt.';

SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_pace', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_pause', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_retry', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_wait', '');
REVOKE ALL ON etc_batch.job_pause, etc_batch.job_pace, etc_batch.job_retry, etc_batch.job_wait FROM PUBLIC;
