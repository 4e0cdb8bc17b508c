-- The examples of docs/reference.md, one or more per entry, in the page's order, as a DBA
-- pastes them into psql on a fresh database. The page quotes this file's output.
\set SHOW_CONTEXT never
CREATE EXTENSION etc_batch;
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, total numeric NOT NULL);
INSERT INTO orders
SELECT g, CASE WHEN g % 4 = 0 THEN 'unpaid' ELSE 'paid' END, g FROM generate_series(1, 100) g;

-- [register_job]
SELECT * FROM etc_batch.register_job('cancel-4-and-8', NULL, 'orders',
    '[{"id": 4}, {"id": 8}]', 10,
    set_values => '{"status": "cancelled"}', expect => '{"status": "unpaid"}',
    revision_column => NULL);
-- [register_job_from_query]
SELECT * FROM etc_batch.register_job_from_query('cancel-unpaid', NULL, 'orders',
    'SELECT id FROM orders WHERE status = ''unpaid'' AND id > 8', 5,
    set_values => '{"status": "cancelled"}', expect => '{"status": "unpaid"}',
    revision_column => NULL);
-- [drain_job]
CALL etc_batch.drain_job('cancel-4-and-8');
CALL etc_batch.drain_job('cancel-unpaid', max_chunks => 2);
-- [job_summary]
SELECT status, approved, committed, unprocessed, matching, drifted
  FROM etc_batch.job_summary('cancel-unpaid');
-- [job_report]
SELECT position, item_key, state FROM etc_batch.job_report('cancel-4-and-8');
-- [verify_job]
SELECT * FROM etc_batch.verify_job('cancel-4-and-8');
-- [pause_job]
SELECT etc_batch.pause_job('cancel-unpaid');
\set VERBOSITY terse
CALL etc_batch.drain_job('cancel-unpaid');
\set VERBOSITY default
-- [job_pause]
SELECT job_id, paused_by, reason FROM etc_batch.job_pause;
-- [resume_job]
SELECT etc_batch.resume_job('cancel-unpaid');
-- [pace_job]
SELECT etc_batch.pace_job('cancel-unpaid', rows_per_second => 500,
    windows => ARRAY['mon-fri 22:00-06:00', 'sat 06:00-24:00', 'sun 00:00-24:00'], time_zone => 'UTC');
SELECT job_id, rows_per_second, windows, time_zone FROM etc_batch.job_pace;
SELECT etc_batch.pace_job('cancel-unpaid', rows_per_second => 20);
CALL etc_batch.drain_job('cancel-unpaid');

-- [register_revert]
SELECT * FROM etc_batch.register_revert('cancel-4-and-8', 'cancel-4-and-8-undo');
-- [revert_preview]
SELECT items, drifted, gone, set_back, expected FROM etc_batch.revert_preview('cancel-unpaid');
-- [revert_preview_left_out]
UPDATE orders SET status = 'refunded' WHERE id = 12;
SELECT * FROM etc_batch.revert_preview_left_out('cancel-unpaid');
-- [abort_job]
SELECT etc_batch.abort_job('cancel-4-and-8-undo', 'the cancellations stand');
SELECT job_id, status, status_reason FROM etc_batch.job WHERE job_id = 'cancel-4-and-8-undo';

-- [register_remainder]
UPDATE orders SET status = 'unpaid' WHERE id IN (1, 2, 3);
SELECT * FROM etc_batch.register_job('cancel-1-to-3', NULL, 'orders',
    '[{"id": 1}, {"id": 2}, {"id": 3}]', 1,
    set_values => '{"status": "cancelled"}', expect => '{"status": "unpaid"}',
    revision_column => NULL);
UPDATE orders SET status = 'paid' WHERE id = 2;
CALL etc_batch.drain_job('cancel-1-to-3');
SELECT * FROM etc_batch.register_remainder('cancel-1-to-3', 'cancel-3');
-- [job_left_out]
SELECT * FROM etc_batch.job_left_out;

-- [chunk_items]
SELECT * FROM etc_batch.chunk_items(7, ARRAY['4', '8'], ARRAY[NULL, NULL]::bigint[],
    ARRAY['{"status": "unpaid"}', '{"status": "unpaid"}']);
-- [chunk_audit_items]
SELECT * FROM etc_batch.chunk_audit_items(7, ARRAY[NULL, NULL]::bigint[], ARRAY[8],
    '{"8": {"status": "paid"}}');

-- [job]
SELECT job_id, target, chunk_size, item_count, status, action, on_drift
  FROM etc_batch.job ORDER BY job_number;
-- [job_item]
SELECT job_id, position, item_key, guards FROM etc_batch.job_item WHERE job_id = 'cancel-4-and-8';
-- [job_audit]
SELECT job_id, position, chunk, skipped, found FROM etc_batch.job_audit
 WHERE job_id = 'cancel-1-to-3';
-- [job_audit_items]
SELECT position, item_key, outcome, guards, found FROM etc_batch.job_audit_items
 WHERE job_id = 'cancel-1-to-3';
-- [job_progress]
SELECT job_id, status, committed, approved, percent, chunks_committed, chunks_total
  FROM etc_batch.job_progress ORDER BY job_number;

-- [add_step]
SELECT etc_batch.add_step('load', $$CREATE TABLE staged AS SELECT id, total FROM orders$$);
SELECT etc_batch.add_step('load', $$UPDATE staged SET total = total * 2$$);
SELECT etc_batch.add_step('load', $$SELECT count(*) FROM staged$$, max_attempts => 3);
-- [exec_batch_from_id]
CALL etc_batch.exec_batch_from_id(1);
CALL etc_batch.exec_batch_from_id(1);
-- [batch_log]
SELECT id, batch, status, attempts, commits, max_attempts FROM etc_batch.batch_log ORDER BY id;
-- [step_audit]
SELECT step_id, attempt, status_seen, outcome FROM etc_batch.step_audit ORDER BY audit_id;
-- [retry_step]
SELECT etc_batch.add_step('fails', $$SELECT 1 / 0$$);
CALL etc_batch.exec_batch_from_id(4);
SELECT etc_batch.retry_step(4);
SELECT id, status, attempts, last_sqlstate FROM etc_batch.batch_log WHERE id = 4;
-- [reset_batch]
SELECT etc_batch.reset_batch('load');
-- [pause_batch]
SELECT etc_batch.pause_batch('load');
\set VERBOSITY terse
CALL etc_batch.exec_batch_from_id(1);
\set VERBOSITY default
-- [resume_batch]
SELECT etc_batch.resume_batch('load');
-- [chain_progress]
SELECT batch, steps, done, failed, pending FROM etc_batch.chain_progress ORDER BY batch;

-- [define_chain]
CREATE TABLE rates (day date PRIMARY KEY, eur numeric NOT NULL);
INSERT INTO rates VALUES ('2026-12-01', 0.92);
CREATE TABLE nights (run_key text PRIMARY KEY, cancelled bigint NOT NULL);
SELECT etc_batch.define_chain('nightly', time_zone => 'UTC');
SELECT etc_batch.add_step('nightly',
    $$SELECT 1 / count(*) FROM rates WHERE day = etc_batch.current_run()::date$$);
-- [current_run]
SELECT etc_batch.add_step('nightly',
    $$INSERT INTO nights SELECT etc_batch.current_run(), count(*) FROM orders
       WHERE status = 'cancelled'$$);
-- [run_chain]
CALL etc_batch.run_chain('nightly', '2026-12-01');
CALL etc_batch.run_chain('nightly', '2026-12-01');
SELECT * FROM nights;
CALL etc_batch.run_chain('nightly', '2026-12-02');
CALL etc_batch.run_chain('nightly', '2026-12-03');
-- [abandon_run]
SELECT etc_batch.abandon_run('nightly', '2026-12-02');
INSERT INTO rates VALUES ('2026-12-03', 0.93);
CALL etc_batch.run_chain('nightly', '2026-12-03');
-- [chain]
SELECT chain, time_zone, overlap FROM etc_batch.chain;
-- [chain_run]
SELECT chain, run_key, batch, first_step, abandoned_at IS NOT NULL AS abandoned
  FROM etc_batch.chain_run ORDER BY run_number;

-- [acquire_lease]
SELECT acquired, holder, generation FROM etc_batch.acquire_lease('nightly-leader', 'host-a', '5 min');
SELECT acquired, holder, generation FROM etc_batch.acquire_lease('nightly-leader', 'host-b', '5 min');
-- [check_lease]
SELECT etc_batch.check_lease('nightly-leader', 'host-a', 1);
SELECT etc_batch.check_lease('nightly-leader', 'host-b', 1);
-- [leases]
SELECT name, holder, generation, expired FROM etc_batch.leases;
-- [lease]
SELECT name, holder, generation FROM etc_batch.lease;
-- [release_lease]
SELECT etc_batch.release_lease('nightly-leader', 'host-a');
-- [lock_key]
SELECT etc_batch.lock_key('orders', '42');
-- [try_xact_lock]
BEGIN;
SELECT etc_batch.try_xact_lock('orders', '42');
-- [locks]
SELECT kind, mode, granted, session_level, stands_for FROM etc_batch.locks
 WHERE pid = pg_backend_pid();
COMMIT;
-- [xact_lock]
BEGIN;
SELECT etc_batch.xact_lock('orders', '42');
COMMIT;

-- [wall_seconds_in_windows]
SELECT etc_batch.wall_seconds_in_windows(3600, ARRAY['mon-sun 00:00-24:00'], 'UTC');
-- [doctor]
SELECT check_name, status FROM etc_batch.doctor() ORDER BY check_name;
-- [metrics]
SELECT metric, labels, value FROM etc_batch.metrics
 WHERE metric = 'etc_batch_job_items_committed' ORDER BY labels::text;
-- [prune_history]
SELECT * FROM etc_batch.prune_history('30 days');

-- The workers run on their own: this waits until a launch and its workers' runs ended.
CREATE FUNCTION wait_for(which bigint) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s text;
    busy boolean;
BEGIN
    FOR i IN 1 .. 1200 LOOP
        SELECT l.status, EXISTS (SELECT FROM etc_batch.launch_run r
                                  WHERE r.launch_id = l.launch_id AND r.ended_at IS NULL)
          INTO s, busy
          FROM etc_batch.launch l WHERE l.launch_id = which;
        EXIT WHEN NOT FOUND OR (s IS DISTINCT FROM 'running' AND NOT busy);
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN s;
END $$;
-- [launch_job]
SELECT * FROM etc_batch.register_job_from_query('settle-paid', NULL, 'orders',
    'SELECT id FROM orders WHERE status = ''paid''', 20,
    set_values => '{"status": "settled"}', revision_column => NULL, parallel => true);
SELECT launch_id, workers, cardinality(pids) AS started FROM etc_batch.launch_job('settle-paid');
SELECT wait_for(1);
SELECT status, committed, approved FROM etc_batch.job_progress WHERE job_id = 'settle-paid';
-- [job_chunk]
SELECT job_id, chunk, committed FROM etc_batch.job_chunk WHERE job_id = 'settle-paid';
-- [launch_batch]
SELECT etc_batch.add_step('count', $$SELECT count(*) FROM orders WHERE status = 'settled'$$);
SELECT launch_id, workers FROM etc_batch.launch_batch(13);
SELECT wait_for(2);
-- [stop_launch]
SELECT * FROM etc_batch.register_job_from_query('settle-slowly', NULL, 'orders',
    'SELECT id FROM orders WHERE status = ''settled''', 5,
    set_values => '{"status": "paid"}', revision_column => NULL);
SELECT etc_batch.pace_job('settle-slowly', rows_per_second => 5);
SELECT launch_id FROM etc_batch.launch_job('settle-slowly');
DO $$ BEGIN
    WHILE (SELECT chunks_committed FROM etc_batch.job WHERE job_id = 'settle-slowly') < 1 LOOP
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
SELECT etc_batch.stop_launch(3);
SELECT wait_for(3);
-- [launches]
SELECT launch_id, worker, job_id, step_id, outcome, launch_status FROM etc_batch.launches
 ORDER BY launch_id, worker;
-- [launch]
SELECT launch_id, job_id, step_id, workers, status FROM etc_batch.launch ORDER BY launch_id;
-- [launch_run]
SELECT launch_id, worker, run, started_by, outcome FROM etc_batch.launch_run ORDER BY launch_id;
-- [resume_launches]
SELECT * FROM etc_batch.resume_launches();

-- [shard_node]
SELECT etc_batch.shard_node(102008);

-- [settings]
SELECT name, setting, unit, context FROM pg_settings WHERE name LIKE 'etc_batch.%' ORDER BY name;
