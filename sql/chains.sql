-- Chains: one row per step (batch_log) and one per attempt or skip (step_audit).

-- Ids, batch names, chunk sizes and the like are checked by the functions that write
-- them (the only writers): see src/api.
CREATE TABLE etc_batch.batch_log (
    id            bigint      PRIMARY KEY,
    batch         text        NOT NULL,
    command       text        NOT NULL,
    status        etc_batch.step_status NOT NULL DEFAULT 'pending',
    attempts      integer     NOT NULL DEFAULT 0,
    started_at    timestamptz,
    finished_at   timestamptz,
    last_error    text,
    last_sqlstate text,
    added_by      regrole     NOT NULL,
    added_at      timestamptz NOT NULL DEFAULT now(),
    search_path   text        NOT NULL,
    paused_at     timestamptz,
    paused_by     regrole,
    commits       boolean     NOT NULL DEFAULT false,
    timeout       interval,
    max_attempts  integer     NOT NULL DEFAULT 1,
    last_detail   text
) WITH (fillfactor = 50);
COMMENT ON COLUMN etc_batch.batch_log.search_path IS
    'The search_path of the session that added the step. The command runs with it, never with the caller''s, as a function with SET search_path FROM CURRENT does.';

-- A step's row is changed once or twice per run of its chain: half of each page is left
-- free so that the change is a HOT update, with no new index entries.
CREATE INDEX batch_log_batch_id ON etc_batch.batch_log (batch, id);
-- the paused steps of a batch, found without reading its other steps: add_step looks for
-- one (a step added to a paused batch is paused with it), and read every step of the
-- batch each time, which made adding 10,000 steps to one batch take seconds
CREATE INDEX batch_log_paused ON etc_batch.batch_log (batch) WHERE paused_at IS NOT NULL;

COMMENT ON TABLE etc_batch.batch_log IS
    'One row per ETL step: the chain (batch) it belongs to, the SQL it runs, its status in the current run, and the role it runs as.';
COMMENT ON COLUMN etc_batch.batch_log.id IS 'The step number; exec_batch_from_id(id) runs this step and every later step of its batch, in id order.';
COMMENT ON COLUMN etc_batch.batch_log.command IS 'The SQL the step runs, as one transaction, with the privileges of added_by.';
COMMENT ON COLUMN etc_batch.batch_log.status IS 'pending, done or failed; there is no running state: a step being run is row-locked and still pending until its transaction commits.';
COMMENT ON COLUMN etc_batch.batch_log.attempts IS 'Attempts in the current run; reset_batch sets it back to 0.';
COMMENT ON COLUMN etc_batch.batch_log.paused_at IS
    'When pause_batch paused the step''s batch: a runner stops before the step until resume_batch. pause_batch marks every step of the batch but the one a runner holds, so it waits for nothing.';
COMMENT ON COLUMN etc_batch.batch_log.paused_by IS 'Who paused the step''s batch.';
COMMENT ON COLUMN etc_batch.batch_log.commits IS
    'The step is a single CALL of a procedure that may COMMIT: it runs in the runner''s own non-atomic context, not in a subtransaction; what it committed stays, and a run that dies inside it calls it again (at least once, exactly once when the procedure is resumable).';
COMMENT ON COLUMN etc_batch.batch_log.timeout IS
    'The statement_timeout the step runs with, and only it; exceeded, the step fails with 57014, recorded as timed_out.';
COMMENT ON COLUMN etc_batch.batch_log.max_attempts IS
    'Attempts in all for a step that fails with 40001, 40P01 or 55P03: each is rolled back and run again after a backoff that doubles.';
COMMENT ON COLUMN etc_batch.batch_log.added_by IS 'The role that added the step; the step runs with its privileges.';
COMMENT ON COLUMN etc_batch.batch_log.last_detail IS
    'The DETAIL of the step''s last error, beside its message (last_error) and SQLSTATE (last_sqlstate): a step run by a worker connected as its author raises its error to the caller from these.';

CREATE TABLE etc_batch.step_audit (
    audit_id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    step_id           bigint      NOT NULL,
    batch             text        NOT NULL,
    attempt           integer     NOT NULL,
    pid               integer     NOT NULL,
    run_by            regrole     NOT NULL,
    ran_as            regrole     NOT NULL,
    lock_requested_at timestamptz NOT NULL,
    lock_acquired_at  timestamptz NOT NULL,
    status_seen       text        NOT NULL,
    outcome           etc_batch.attempt_outcome NOT NULL,
    started_at        timestamptz,
    finished_at       timestamptz,
    error             text,
    sqlstate          text,
    txid              bigint      NOT NULL
);

CREATE INDEX step_audit_step ON etc_batch.step_audit (step_id, audit_id);

COMMENT ON TABLE etc_batch.step_audit IS
    'One row per attempt to run a step and per skip of a step that was already done; committed in the same transaction as the step''s own writes.';
COMMENT ON COLUMN etc_batch.step_audit.status_seen IS 'The status the runner read after its lock on the step was granted.';
COMMENT ON COLUMN etc_batch.step_audit.run_by IS 'The role that called exec_batch_from_id.';
COMMENT ON COLUMN etc_batch.step_audit.ran_as IS 'The role whose privileges the step ran with (the role that added it).';
COMMENT ON COLUMN etc_batch.step_audit.txid IS 'The transaction that committed the step (or its failure record).';

-- pg_dump keeps the contents of both tables, not just their definitions.
SELECT pg_catalog.pg_extension_config_dump('etc_batch.batch_log', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.step_audit', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.step_audit_audit_id_seq', '');

REVOKE ALL ON etc_batch.batch_log, etc_batch.step_audit FROM PUBLIC;
