-- The demo's nightly chain, defined once: each night's run is a copy of its steps,
-- named by tonight's date. Step 1 approves tonight's unpaid orders older than a week
-- as a job named after the night; step 2 drains it (a step that commits, a COMMIT per
-- chunk); step 3 prunes old history.
SELECT etc_batch.define_chain('nightly', time_zone => 'UTC');
SELECT etc_batch.add_step('nightly', $$
    SELECT etc_batch.register_job_from_query(
        'cancel-unpaid-' || etc_batch.current_run(), NULL, 'orders',
        'SELECT id FROM orders WHERE status = ''unpaid''
            AND placed_at < date ''2026-12-01'' - 7',
        500, set_values => '{"status": "cancelled"}', expect => '{"status": "unpaid"}',
        revision_column => NULL)
$$);
SELECT etc_batch.add_step('nightly',
    $$CALL etc_batch.drain_job('cancel-unpaid-' || etc_batch.current_run())$$,
    commits => true);
SELECT etc_batch.add_step('nightly', $$SELECT etc_batch.prune_history('90 days')$$);
