-- Chains that run every night: a chain defined once (define_chain, its steps added with
-- add_step under the chain's name) and run as a new run each time (run_chain), whose
-- steps are copies of the definition's with ids of their own, in a batch of its own,
-- "<chain>/<run key>". A run is a batch like any other: chain_progress, batch_log,
-- step_audit, pause_batch and the doctor see it as one.

CREATE TABLE etc_batch.chain (
    chain       text        PRIMARY KEY,
    time_zone   text        NOT NULL,
    overlap     boolean     NOT NULL DEFAULT false,
    defined_by  regrole     NOT NULL,
    defined_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE etc_batch.chain IS
    'One row per chain definition: the batch of that name holds its steps, which never run themselves; run_chain runs copies of them.';
COMMENT ON COLUMN etc_batch.chain.time_zone IS
    'The time zone in which a run''s default key, the date of the day it starts, is taken.';
COMMENT ON COLUMN etc_batch.chain.overlap IS
    'Whether a run may start while an earlier one is unfinished (nights that do not depend on each other); by default it waits its turn.';

CREATE TABLE etc_batch.chain_run (
    run_number   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    chain        text        NOT NULL,
    run_key      text        NOT NULL,
    batch        text        NOT NULL UNIQUE,
    first_step   bigint      NOT NULL,
    created_by   regrole     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    abandoned_by regrole,
    abandoned_at timestamptz,
    UNIQUE (chain, run_key)
);

COMMENT ON TABLE etc_batch.chain_run IS
    'One row per run of a chain definition: its key, the batch that holds its steps (copies of the definition''s when it was created), who created it and, for a run ended on purpose, who abandoned it and when.';
COMMENT ON COLUMN etc_batch.chain_run.run_number IS 'Runs of a chain in the order they were created: a run waits for the unfinished ones before it.';

-- pg_dump keeps their contents, as it keeps batch_log's.
SELECT pg_catalog.pg_extension_config_dump('etc_batch.chain', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.chain_run', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.chain_run_run_number_seq', '');

REVOKE ALL ON etc_batch.chain, etc_batch.chain_run FROM PUBLIC;
