-- docs/jobs.md "Transactions sized by time": pace_job's transaction_time commits as many
-- consecutive chunks in one transaction as fit it, each with its own audit rows and its
-- own place in the checkpoint. At the default settings.
\set SHOW_CONTEXT never
-- as psql shows intervals by default (pg_regress sets another style)
SET intervalstyle = postgres;
CREATE EXTENSION etc_batch;
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL);
INSERT INTO orders SELECT g, 'paid' FROM generate_series(1, 100) g;

-- Chunks of 10 rows, the size a DBA picks when unsure how long a chunk holds its locks.
SELECT * FROM etc_batch.register_job_from_query('settle', NULL, 'orders',
    'SELECT id FROM orders', 10, set_values => '{"status": "settled"}',
    expect => '{"status": "paid"}', revision_column => NULL);

-- Transactions of up to a second (a live system would take 100 to 500 ms; a second
-- here so that the four chunks below fit one however busy the machine is).
SELECT etc_batch.pace_job('settle', transaction_time => '1s');

-- max_chunks counts chunks, not transactions: four chunks, one COMMIT.
CALL etc_batch.drain_job('settle', 4);
SELECT chunks_committed, transaction_time, chunks_per_transaction
  FROM etc_batch.job_progress WHERE job_id = 'settle';

-- Each chunk has its audit rows, and one transaction wrote all four chunks.
SELECT chunk, count(*) AS items, min(txid) = max(min(txid)) OVER () AS same_transaction
  FROM etc_batch.job_audit_items WHERE job_id = 'settle' GROUP BY chunk ORDER BY chunk;

-- pace_job sets the whole pace: without transaction_time, one chunk per transaction.
SELECT etc_batch.pace_job('settle');
CALL etc_batch.drain_job('settle', 2);
SELECT chunks_committed, transaction_time, chunks_per_transaction
  FROM etc_batch.job_progress WHERE job_id = 'settle';

-- Changed while the job runs: the next transaction takes it.
SELECT etc_batch.pace_job('settle', transaction_time => '1s');
CALL etc_batch.drain_job('settle');
SELECT status, chunks_committed, chunks_per_transaction
  FROM etc_batch.job_progress WHERE job_id = 'settle';
SELECT count(DISTINCT txid) AS transactions
  FROM etc_batch.job_audit_items WHERE job_id = 'settle';
SELECT check_name, ok FROM etc_batch.verify_job('settle');

-- Out of range, or with a rate (whose slots are a chunk's each): refused.
SELECT etc_batch.pace_job('settle', transaction_time => '0');
SELECT etc_batch.pace_job('settle', transaction_time => '2 hours');
SELECT etc_batch.pace_job('settle', rows_per_second => 500, transaction_time => '200ms');
