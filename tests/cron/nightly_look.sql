-- docs/how-to/nightly-chain.md, "Look at a night": run by tests/cron with psql in the
-- database shop once the night has run.
SELECT batch, steps, done, failed, pending, last_error
  FROM etc_batch.chain_progress WHERE batch LIKE 'nightly/%' ORDER BY batch;
SELECT job_id, status, committed, approved FROM etc_batch.job_progress
 WHERE job_id LIKE 'cancel-unpaid-%' ORDER BY job_id;
