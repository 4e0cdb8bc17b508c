-- Chains that run every night: a chain defined once, and a run of it each night, made
-- once however many times the schedule's line fires; last night's failure held until it
-- is retried or abandoned; a step that knows its run.
CREATE EXTENSION etc_batch;
SET client_min_messages = notice;

CREATE TABLE loaded (night text, step int);
CREATE TABLE knob (ok boolean);
INSERT INTO knob VALUES (true);
CREATE FUNCTION check_knob() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (SELECT ok FROM knob) THEN
        RAISE EXCEPTION 'the exchange rates are not loaded';
    END IF;
END $$;

-- The definition: its steps are added under its name, and never run themselves.
SELECT etc_batch.define_chain('nightly', time_zone => 'UTC');
SELECT etc_batch.add_step('nightly', $$INSERT INTO loaded VALUES (etc_batch.current_run(), 1)$$, 21);
SELECT etc_batch.add_step('nightly', $$SELECT check_knob()$$, 22);
SELECT etc_batch.add_step('nightly', $$INSERT INTO loaded VALUES (etc_batch.current_run(), 3)$$, 23);
SELECT chain, time_zone, overlap FROM etc_batch.chain;

-- Night 1, and the same line firing again: one run, each step once.
CALL etc_batch.run_chain('nightly', '2026-12-01');
CALL etc_batch.run_chain('nightly', '2026-12-01');
SELECT chain, run_key, batch, first_step FROM etc_batch.chain_run ORDER BY run_number;
SELECT id, batch, command, status FROM etc_batch.batch_log ORDER BY id;
SELECT night, step FROM loaded ORDER BY night, step;

-- Night 2 fails at its second step; night 3 waits its turn.
UPDATE knob SET ok = false;
CALL etc_batch.run_chain('nightly', '2026-12-02');
\echo :LAST_ERROR_SQLSTATE
CALL etc_batch.run_chain('nightly', '2026-12-03');
SELECT batch, steps, done, failed, pending FROM etc_batch.chain_progress ORDER BY batch;

-- The cause fixed, the failed step retried (the failure stays in step_audit), night 2
-- finished, then night 3.
UPDATE knob SET ok = true;
SELECT etc_batch.retry_step(28);
CALL etc_batch.run_chain('nightly', '2026-12-02');
CALL etc_batch.run_chain('nightly', '2026-12-03');
SELECT night, step FROM loaded ORDER BY night, step;
SELECT step_id, batch, attempt, outcome, sqlstate FROM etc_batch.step_audit
 WHERE batch = 'nightly/2026-12-02' ORDER BY audit_id;

-- Night 4 fails and is abandoned: night 5 no longer waits for it, and night 4 never
-- runs again.
UPDATE knob SET ok = false;
CALL etc_batch.run_chain('nightly', '2026-12-04');
SELECT etc_batch.abandon_run('nightly', '2026-12-04');
SELECT etc_batch.abandon_run('nightly', '2026-12-04');
UPDATE knob SET ok = true;
CALL etc_batch.run_chain('nightly', '2026-12-05');
-- (the detail says who abandoned it and when: left out here, as the time changes)
\set VERBOSITY terse
CALL etc_batch.run_chain('nightly', '2026-12-04');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.resume_batch('nightly/2026-12-04');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT run_key, abandoned_by IS NOT NULL AS abandoned FROM etc_batch.chain_run ORDER BY run_number;

-- A chain whose nights are independent runs tonight's even when last night's failed.
SELECT etc_batch.define_chain('hourly', time_zone => 'UTC', overlap => true);
SELECT etc_batch.add_step('hourly', $$SELECT check_knob()$$);
UPDATE knob SET ok = false;
CALL etc_batch.run_chain('hourly', '01');
UPDATE knob SET ok = true;
CALL etc_batch.run_chain('hourly', '02');

-- A run keeps the steps it was made with: a step added to the definition later is in
-- the next run only.
SELECT etc_batch.add_step('nightly', $$INSERT INTO loaded VALUES (etc_batch.current_run(), 4)$$);
CALL etc_batch.run_chain('nightly', '2026-12-06');
SELECT night, step FROM loaded WHERE night >= '2026-12-05' ORDER BY night, step;

-- A chain that holds a job, over three nights: each night approves that night's pending
-- orders under a job id of its own run (current_run()), and drains it.
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL DEFAULT 'pending');
SELECT etc_batch.define_chain('cancel', time_zone => 'UTC');
SELECT etc_batch.add_step('cancel', $$SELECT etc_batch.register_job_from_query(
    'cancel-' || etc_batch.current_run(), NULL, 'orders',
    'SELECT id FROM orders WHERE status = ''pending''', 2, '{"status": "cancelled"}',
    tenant_column => NULL, revision_column => NULL)$$);
SELECT etc_batch.add_step('cancel', $$CALL etc_batch.drain_job('cancel-' || etc_batch.current_run())$$,
    commits => true);
INSERT INTO orders SELECT g FROM generate_series(1, 3) g;
CALL etc_batch.run_chain('cancel', '2026-12-01');
INSERT INTO orders SELECT g FROM generate_series(4, 5) g;
CALL etc_batch.run_chain('cancel', '2026-12-02');
CALL etc_batch.run_chain('cancel', '2026-12-02');
INSERT INTO orders SELECT g FROM generate_series(6, 9) g;
CALL etc_batch.run_chain('cancel', '2026-12-03');
SELECT job_id, status, committed, approved FROM etc_batch.job_progress ORDER BY job_id;
SELECT status, count(*) FROM orders GROUP BY status;

-- reset_batch says what it puts back to pending.
SELECT etc_batch.reset_batch('nightly/2026-12-06');

-- Bad input: nothing is made.
CALL etc_batch.run_chain('nobody', '2026-12-01');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.define_chain('empty', time_zone => 'UTC');
CALL etc_batch.run_chain('empty', '2026-12-01');
\echo :LAST_ERROR_SQLSTATE
CALL etc_batch.run_chain('nightly', 'a/b');
\echo :LAST_ERROR_SQLSTATE
CALL etc_batch.run_chain('nightly', '');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.define_chain('elsewhere', time_zone => 'Mars/Olympus_Mons');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.define_chain('nightly/2026-12-01');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.abandon_run('nightly', '1999-01-01');
\echo :LAST_ERROR_SQLSTATE
SELECT etc_batch.abandon_run('nightly', '2026-12-01');
\echo :LAST_ERROR_SQLSTATE
-- the definition's own steps never run
CALL etc_batch.exec_batch_from_id(21);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS runs FROM etc_batch.chain_run WHERE chain IN ('nobody', 'empty');
SELECT etc_batch.current_run() IS NULL AS outside_a_run;

-- A night that finds nothing to approve: chain 'cancel' registers its job from a query
-- that finds no pending order tonight, then drains it. An approval of no items is a job
-- done at once (a NOTICE says so), its drain finds nothing to do, and the night's run
-- is done; the next night runs as any night after a finished one.
CALL etc_batch.run_chain('cancel', '2026-12-04');
SELECT batch, steps, done, failed, pending FROM etc_batch.chain_progress WHERE batch = 'cancel/2026-12-04';
SELECT outcome, sqlstate FROM etc_batch.step_audit WHERE batch = 'cancel/2026-12-04' ORDER BY audit_id;
SELECT status, item_count, next_index, chunks_committed, finished_at IS NOT NULL AS finished
  FROM etc_batch.job WHERE job_id = 'cancel-2026-12-04';
SELECT status, approved, committed, unprocessed FROM etc_batch.job_summary('cancel-2026-12-04');
SELECT count(*) FILTER (WHERE NOT ok) AS failed_checks FROM etc_batch.verify_job('cancel-2026-12-04');
INSERT INTO orders SELECT g FROM generate_series(10, 11) g;
CALL etc_batch.run_chain('cancel', '2026-12-05');
SELECT status, count(*) FROM orders GROUP BY status ORDER BY status;
