-- etc_batch 0.3.0 -> 0.4.0. Run by ALTER EXTENSION etc_batch UPDATE; never edit it once
-- 0.4.0 is released: later changes go into a script of their own.
\echo Use "ALTER EXTENSION etc_batch UPDATE" to load this file. \quit

-- A parallel job's chunk rows are written by the library, with the seals it computes
-- (src/job/seal.rs); the function only attaches a job's partitions.
DROP FUNCTION etc_batch.attach_job_tables(bigint, text, integer);
CREATE FUNCTION etc_batch.attach_job_tables(job_number bigint, job_id text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('etc_batch.%I', 'job_chunk_' || job_number)) IS NOT NULL THEN
        EXECUTE format('ALTER TABLE etc_batch.job_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                       'job_chunk_' || job_number, job_id);
    END IF;
    EXECUTE format('ALTER TABLE etc_batch.job_item ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                   'job_item_' || job_number, job_id);
    EXECUTE format('ALTER TABLE etc_batch.job_audit ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                   'job_audit_' || job_number, job_id);
END
$$;
REVOKE ALL ON FUNCTION etc_batch.attach_job_tables(bigint, text) FROM PUBLIC;
