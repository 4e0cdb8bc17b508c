-- etc_batch 0.1.0 -> 0.2.0. Run by ALTER EXTENSION etc_batch UPDATE; never edit it once
-- 0.2.0 is released: later changes go into a script of their own.
\echo Use "ALTER EXTENSION etc_batch UPDATE" to load this file. \quit

-- Steps and jobs keep the search_path of the session that added or registered them, and
-- their SQL runs with it instead of the caller's. Steps and jobs from 0.1.0 never recorded
-- one: they get PostgreSQL's default.
ALTER TABLE etc_batch.batch_log ADD COLUMN search_path text;
UPDATE etc_batch.batch_log SET search_path = '"$user", public';
ALTER TABLE etc_batch.batch_log ALTER COLUMN search_path SET NOT NULL;
COMMENT ON COLUMN etc_batch.batch_log.search_path IS
    'The search_path of the session that added the step. The command runs with it, never with the caller''s, as a function with SET search_path FROM CURRENT does.';

ALTER TABLE etc_batch.job ADD COLUMN search_path text;
UPDATE etc_batch.job SET search_path = '"$user", public';
ALTER TABLE etc_batch.job ALTER COLUMN search_path SET NOT NULL;
COMMENT ON COLUMN etc_batch.job.search_path IS
    'The search_path of the session that registered the job. The change, its handler and the target''s triggers run with it, never with the caller''s.';
