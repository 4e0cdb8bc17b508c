-- Every step's own SQLSTATE: a step's error reaches the caller, batch_log and step_audit
-- with the SQLSTATE, message, detail, hint and context the step raised, whatever the
-- SQLSTATE: built-in, or user-defined with RAISE ... USING ERRCODE. The same for a job
-- handler's errors.
CREATE EXTENSION IF NOT EXISTS etc_batch;
\set SHOW_CONTEXT always

CREATE FUNCTION boom(code text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'failed with %', code
        USING ERRCODE = code, DETAIL = 'Raised on purpose.', HINT = 'Nothing to do.';
END $$;

SELECT etc_batch.add_step('codes', $$SELECT boom('UE001')$$, 1);
SELECT etc_batch.add_step('codes', $$SELECT boom('22P99')$$, 2);
SELECT etc_batch.add_step('codes', $$SELECT boom('P0099')$$, 3);
SELECT etc_batch.add_step('codes', $$SELECT 1 / 0$$, 4);

CALL etc_batch.exec_batch_from_id(1);
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.retry_step(1);
UPDATE etc_batch.batch_log SET status = 'done' WHERE id = 1;
CALL etc_batch.exec_batch_from_id(2);
\echo :LAST_ERROR_SQLSTATE
UPDATE etc_batch.batch_log SET status = 'done' WHERE id = 2;
CALL etc_batch.exec_batch_from_id(3);
\echo :LAST_ERROR_SQLSTATE
UPDATE etc_batch.batch_log SET status = 'done' WHERE id = 3;
CALL etc_batch.exec_batch_from_id(4);
\echo :LAST_ERROR_SQLSTATE

SELECT id, status, last_sqlstate, last_error FROM etc_batch.batch_log ORDER BY id;
SELECT step_id, outcome, sqlstate, error FROM etc_batch.step_audit ORDER BY audit_id;

-- A failed step stops the next run with its own SQLSTATE in the DETAIL.
\set SHOW_CONTEXT never
CALL etc_batch.exec_batch_from_id(4);
\set SHOW_CONTEXT always

-- A job handler's error.
CREATE TABLE orders (tenant text, id int, revision int NOT NULL DEFAULT 1,
                     status text NOT NULL DEFAULT 'pending', PRIMARY KEY (tenant, id));
INSERT INTO orders (tenant, id) SELECT 'X', g FROM generate_series(1, 4) g;
CREATE FUNCTION refuse(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'order % cannot be cancelled', item->>'id'
        USING ERRCODE = 'UE002', DETAIL = 'It is shipped.';
END $$;
SELECT * FROM etc_batch.register_job('refused', 'X', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision)) FROM orders),
    2, NULL, handler => 'refuse(jsonb)');
CALL etc_batch.drain_job('refused');
\echo :LAST_ERROR_SQLSTATE
