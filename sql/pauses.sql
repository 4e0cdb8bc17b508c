-- Pauses: a person stops a job's drainers or a chain's runners at their next chunk or
-- step, and lets them go on later. A pause is a row of its own, never a change to the row
-- the work locks: pausing waits for nothing, and the work in flight sees it at its next
-- boundary (a job's next chunk, a chain's next step). Not part of an approval: pausing
-- changes nothing committed.

CREATE TABLE etc_batch.job_pause (
    job_id    text        PRIMARY KEY,
    paused_at timestamptz NOT NULL,
    paused_by regrole     NOT NULL
);

COMMENT ON TABLE etc_batch.job_pause IS
    'The jobs paused by pause_job, when and by whom: their drainers stop before their next chunk and return with status paused, until resume_job.';

CREATE TABLE etc_batch.batch_pause (
    batch     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL,
    paused_by regrole     NOT NULL
);

COMMENT ON TABLE etc_batch.batch_pause IS
    'The batches paused by pause_batch, when and by whom: their runners stop before their next step, until resume_batch.';

SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_pause', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.batch_pause', '');
REVOKE ALL ON etc_batch.job_pause, etc_batch.batch_pause FROM PUBLIC;
