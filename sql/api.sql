-- Loaded last, after the functions declared in Rust (src/api): their comments and
-- privileges. Who may change and run chains, register and drain jobs, and hold leases
-- is the administrator's decision, as with pg_cron: nothing that acts is granted to
-- PUBLIC.

-- Chains
COMMENT ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer) IS
    'Adds a step to a batch and returns its id; the step will run with the privileges of the role that adds it. commits: a single CALL of a procedure that may COMMIT; timeout: its statement_timeout; max_attempts: attempts in all after 40001, 40P01 or 55P03.';
COMMENT ON FUNCTION etc_batch.reset_batch(text) IS
    'Puts every step of a batch back to pending for its next run and returns how many; step_audit keeps the history.';
COMMENT ON FUNCTION etc_batch.retry_step(bigint) IS
    'Puts a failed step back to pending.';
COMMENT ON FUNCTION etc_batch.pause_batch(text) IS
    'Pauses a batch: a runner at work stops after the step in flight, and runs stop before its first pending step until resume_batch.';
COMMENT ON FUNCTION etc_batch.resume_batch(text) IS
    'Lets a paused batch go on.';
REVOKE ALL ON FUNCTION etc_batch.add_step(text, text, bigint, boolean, interval, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.pause_batch(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.resume_batch(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.reset_batch(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.retry_step(bigint) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.define_chain(text, text, boolean) IS
    'Defines a chain (or defines it again) whose runs run_chain makes: its steps are those added with add_step under its name, which never run themselves; time_zone: the one a run''s default key, today''s date, is taken in (the caller''s TimeZone by default); overlap: a run may start while an earlier one is unfinished.';
COMMENT ON FUNCTION etc_batch.abandon_run(text, text) IS
    'Ends a run of a chain on purpose, kept in history with who and when: it never runs again, and later runs no longer wait for it.';
COMMENT ON FUNCTION etc_batch.current_run() IS
    'The run key of the run whose step is running in this session; NULL outside one.';
REVOKE ALL ON FUNCTION etc_batch.define_chain(text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.abandon_run(text, text) FROM PUBLIC;

-- Jobs
COMMENT ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) IS
    'Freezes an approved list of items for a job on any table with a primary key or unique index (a tenant, a revision column and a key of one column are optional), whose chunks commit in order or, with parallel, in any order by many drainers; each row that passes its guard is updated (set_values sets constants, set_expressions columns to an SQL expression over the row''s own columns, checked and kept as PostgreSQL prints it back, set_from_query columns to each item''s own value, such as a value an items query read through a join, the values before of both recorded; or a handler is called for it), deleted (action delete) or moved to an archive table (action move), a deleted row kept with the audit unless keep_deleted is false; on_drift says whether a drifted row stops the job or is skipped; the same request again changes nothing, a different one under the same job id is refused.';
COMMENT ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) IS
    'Freezes the rows of a SELECT, run once as the registering role in one snapshot, as the approved items of a job; otherwise as register_job.';
COMMENT ON FUNCTION etc_batch.register_remainder(text, text, integer, boolean, boolean) IS
    'Approves again, as a new job, what a job did not change (its unprocessed and skipped items still as approved, and with include_drifted those whose rows drifted, at their state now), with the same change and chunking unless told otherwise; the job ends, continued as the new one. Items left out (drifted, gone, another tenant''s) are named in etc_batch.job_left_out and counted in a NOTICE. On a continued job, include_drifted approves as a new job the drifted items its remainder left out.';
REVOKE ALL ON FUNCTION etc_batch.register_remainder(text, text, integer, boolean, boolean) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.register_revert(text, text, integer, boolean, regprocedure) IS
    'Registers a revert of a job: a new approved, frozen job whose items are the job''s committed items, each expected as its change left the row and set back to the values it had before (the job''s expect values of the columns it set; a handler job''s by the inverse handler given); items whose rows drifted or went away since are left out and named in etc_batch.job_left_out. The job is stopped first and ends reverted. The same revert again changes nothing; a different one under the same job id is refused.';
REVOKE ALL ON FUNCTION etc_batch.register_revert(text, text, integer, boolean, regprocedure) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.revert_preview(text, regprocedure) IS
    'What register_revert would register, registering nothing: how many committed items it would set back, how many drifted, are gone or are another tenant''s since (for a revert of a delete or a move: how many keys a row has taken again), their keys from revert_preview_left_out, which columns go back to which values (set_back) or each to its row''s own value recorded before the change (set_back_per_item), and what every row must still hold (expected).';
REVOKE ALL ON FUNCTION etc_batch.revert_preview(text, regprocedure) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.wall_seconds_in_windows(double precision, text[], text) IS
    'The seconds of the clock, from now, that work_seconds of work take when done only inside windows (a pace''s, read in time_zone): the waits for them to open counted. job_progress''s estimated_finish counts them so.';
COMMENT ON FUNCTION etc_batch.revert_preview_left_out(text, regprocedure) IS
    'The committed items of a job that register_revert would leave out now, one row each in their order in the job: position, key, and whether its row drifted, is gone or its key names another tenant''s row.';
REVOKE ALL ON FUNCTION etc_batch.revert_preview_left_out(text, regprocedure) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.job_report(text) IS
    'Every approved item of a job: unprocessed, skipped, or committed and now matching, drifted or missing (for a job that deletes its rows: deleted by the job, or moved to the archive). Shown to the role that registered the job (and its members) and to readers of etc_batch.job.';
COMMENT ON FUNCTION etc_batch.job_summary(text) IS
    'A job''s status, its items counted by state, and when and how its last drain failed for a reason other than a conflict. Shown to the role that registered the job (and its members) and to readers of etc_batch.job.';
COMMENT ON FUNCTION etc_batch.verify_job(text) IS
    'Compares every audit row of a job with its approved list; a pending job that fails becomes corrupt.';
COMMENT ON FUNCTION etc_batch.abort_job(text, text) IS
    'Stops a job for good, keeping its approval, audit and checkpoint.';
REVOKE ALL ON FUNCTION etc_batch.register_job(text, text, regclass, jsonb, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.register_job_from_query(text, text, regclass, text, integer, jsonb, jsonb, name, name, name, regprocedure, boolean, name[], text, text, boolean, jsonb, text, regclass, boolean, name[]) FROM PUBLIC;
-- job_report and job_summary are executable by PUBLIC, said explicitly: each shows a
-- job only to the roles with the privileges of the one that registered it and to
-- readers of etc_batch.job (42501 for anyone else), as job_progress shows its rows.
REVOKE ALL ON FUNCTION etc_batch.job_report(text), etc_batch.job_summary(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION etc_batch.job_report(text), etc_batch.job_summary(text) TO PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.verify_job(text) FROM PUBLIC;
-- Launches
COMMENT ON FUNCTION etc_batch.launch_job(text, integer) IS
    'Starts background workers that drain a job to the end with no client session held (one for a sequential job, any number for a parallel one); they act once the calling transaction commits. Returns the launch id and the workers'' pids.';
COMMENT ON FUNCTION etc_batch.launch_batch(bigint) IS
    'Starts a background worker that runs a chain from a step to its end, as exec_batch_from_id would, with no client session held; it acts once the calling transaction commits.';
COMMENT ON FUNCTION etc_batch.stop_launch(bigint) IS
    'Stops a launch: its workers end after the chunk or step in flight. Returns whether it was running.';
COMMENT ON FUNCTION etc_batch.resume_launches() IS
    'Starts again the workers of this database''s running launches that are not at work, and its supervisor if none runs: what the launcher does after a restart when etc_batch is preloaded.';
REVOKE ALL ON FUNCTION etc_batch.launch_job(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.launch_batch(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.stop_launch(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.resume_launches() FROM PUBLIC;

COMMENT ON FUNCTION etc_batch.pause_job(text) IS
    'Pauses a job: its drainers stop before their next chunk and return with status paused, until resume_job. Not part of the approval.';
COMMENT ON FUNCTION etc_batch.resume_job(text) IS
    'Lets a paused job go on from its checkpoint.';
REVOKE ALL ON FUNCTION etc_batch.abort_job(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.pause_job(text) FROM PUBLIC;
COMMENT ON FUNCTION etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text, interval) IS
    'Sets a job''s whole pace: rows per second for all its drainers together, the signals they wait for (replica lag, WAL archive backlog, a VACUUM of the table, windows, a throttle query) and those that pause the job (pause_above_replica_lag_bytes, pause_above_archive_backlog, critical_query), and how long a drain''s transaction may take (transaction_time: as many chunks as fit commit together); what a call does not name has no limit afterwards, and pace_job(job_id) clears it all. Not part of the approval.';
REVOKE ALL ON FUNCTION etc_batch.pace_job(text, integer, bigint, integer, boolean, text[], text, text, bigint, integer, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.resume_job(text) FROM PUBLIC;

-- Leases
COMMENT ON FUNCTION etc_batch.acquire_lease(text, text, interval) IS
    'Takes a free or expired lease (generation + 1), renews the caller''s own (same generation), or returns acquired = false with the current holder.';
COMMENT ON FUNCTION etc_batch.release_lease(text, text) IS
    'Ends the caller''s lease now; the generation stays.';
COMMENT ON FUNCTION etc_batch.check_lease(text, text, bigint) IS
    'Raises SQLSTATE 0B000 unless the holder still holds that generation, unexpired; the lease then cannot change hands until the calling transaction ends.';
REVOKE ALL ON FUNCTION etc_batch.acquire_lease(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.release_lease(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.check_lease(text, text, bigint) FROM PUBLIC;
