-- Checkpointed jobs: a frozen, approved list of items, drained chunk by chunk.
--
-- The three tables hold the promise a checkpoint makes: job.next_index says that every
-- approved item (job_item_chunk) below it has been changed and audited (job_audit_chunk), in the same
-- transaction, and nothing at or beyond it has. Like the chain tables, they belong to the
-- extension's owner and only etc_batch's functions write them.
--
-- job_item_chunk and job_audit_chunk are partitioned by job: each job has a partition of
-- each, job_item_chunk_<job_number> and job_audit_chunk_<job_number>, created when it is registered and
-- dropped whole when its history is pruned, so that neither a chunk's statements nor
-- pruning ever depend on how many other jobs there are.

CREATE TABLE etc_batch.job (
    job_id           text        PRIMARY KEY,
    tenant           text,
    target           regclass    NOT NULL,
    tenant_column    name,
    revision_column  name,
    chunk_size       integer     NOT NULL,
    set_values       jsonb,
    handler          text,
    expect           jsonb       NOT NULL DEFAULT '{}',
    guard_columns    text[]      NOT NULL DEFAULT '{}',
    item_count       integer     NOT NULL,
    fingerprint      text        NOT NULL,
    status           etc_batch.job_status NOT NULL DEFAULT 'pending',
    next_index       integer     NOT NULL DEFAULT 0,
    chunks_committed integer     NOT NULL DEFAULT 0,
    seal             bigint      NOT NULL,
    audit_changes    bigint      NOT NULL DEFAULT 0,
    item_changes     bigint      NOT NULL DEFAULT 0,
    problem          jsonb,
    status_reason    text,
    registered_by    regrole     NOT NULL,
    registered_at    timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    last_commit_at   timestamptz,
    finished_at      timestamptz,
    search_path      text        NOT NULL,
    job_number       bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
    parallel         boolean     NOT NULL DEFAULT false,
    key_columns      name[]      NOT NULL,
    guard            text        NOT NULL DEFAULT 'revision'
                                 CHECK (guard IN ('revision', 'row', 'columns')),
    on_drift         text        NOT NULL DEFAULT 'stop' CHECK (on_drift IN ('stop', 'skip')),
    target_name      text        NOT NULL,
    continued_as     text,
    failed_at        timestamptz,
    failure_sqlstate text,
    failure_message  text,
    failure_chunk    integer,
    seconds_at_work  float8      NOT NULL DEFAULT 0,
    -- a sequential job's chunks' own seconds, from opening to checkpoint, added up
    -- (the metrics); NULL: none yet. A parallel job's are in job_chunk.
    chunk_seconds    float8,
    -- a revert (register_revert): the job whose committed items it sets back
    reverts          text,
    -- a job reverted: the job that sets its committed items back
    reverted_by      text,
    record_before    boolean     NOT NULL DEFAULT false,
    set_from_items   name[]      NOT NULL DEFAULT '{}',
    set_expressions  jsonb,
    action           text        NOT NULL DEFAULT 'update'
                                 CHECK (action IN ('update', 'delete', 'move', 'restore')),
    archive          text,
    keep_deleted     boolean     NOT NULL DEFAULT true,
    -- a sequential job's last transaction: how many chunks it committed together (pace_job's
    -- transaction_time); NULL: none yet. A parallel job's chunk rows tell it by their txid.
    chunks_per_transaction integer,
    -- a job on a table Citus distributes by a column of its key: its chunks by shard
    shards           jsonb,
    CONSTRAINT job_archive_check CHECK (action = 'restore' OR (action = 'move') = (archive IS NOT NULL))
);

COMMENT ON TABLE etc_batch.job IS
    'One row per registered approval: what to change, on which table, for which tenant, in chunks of what size, and the checkpoint next_index.';
COMMENT ON COLUMN etc_batch.job.next_index IS 'The checkpoint: every approved item at a lower position is committed, change and audit together; none at or beyond it is.';
COMMENT ON COLUMN etc_batch.job.seal IS 'A hash of the job id, next_index and chunks_committed, written with every checkpoint: a checkpoint changed by hand no longer matches it.';
COMMENT ON COLUMN etc_batch.job.audit_changes IS 'Updates, deletes and truncates of this job''s audit rows, counted by a trigger; anything but 0 makes the job corrupt.';
COMMENT ON COLUMN etc_batch.job.item_changes IS 'Updates, deletes and truncates of this job''s approved items, counted by a trigger; anything but 0 makes the job corrupt.';
COMMENT ON COLUMN etc_batch.job.search_path IS
    'The search_path of the session that registered the job. The change, its handler and the target''s triggers run with it, never with the caller''s.';
COMMENT ON COLUMN etc_batch.job.handler IS
    'A handler job''s function, by its schema-qualified name and argument (schema.name(pg_catalog.jsonb)), found by that name when a chunk runs: a name survives pg_upgrade, which keeps no function''s OID. A handler dropped, renamed or moved after registration stops the job before it changes anything.';
COMMENT ON COLUMN etc_batch.job.problem IS 'For a job in conflict or corrupt: what was expected and what was found.';
COMMENT ON COLUMN etc_batch.job.parallel IS
    'Whether the approval lets chunks commit in any order, each claimed by one of any number of drainers: then job_chunk_<job_number> holds which chunks are committed, and next_index reaches item_count only when the job is done.';
COMMENT ON COLUMN etc_batch.job.key_columns IS
    'The columns an approved item names its row by: the target''s primary key or a unique index of it (less the tenant column), one column or several.';
COMMENT ON COLUMN etc_batch.job.shards IS
    'For a job on a table Citus distributes by a column of its key, its chunks by shard, frozen at registration: [{"shard": shardid, "first_chunk": n, "last_chunk": m}, ...] in chunk order, a chunk across two shards under both; NULL for any other job. job_progress.chunks_per_node counts them by the node each shard is on now.';
COMMENT ON COLUMN etc_batch.job.guard IS
    'How a row is recognised as unchanged since it was approved: revision (the revision column is still at the approved revision; the change increments it), row (a digest of every column of the row, taken at registration), columns (only the guard columns the items name and expect).';
COMMENT ON COLUMN etc_batch.job.on_drift IS
    'What a row that drifted or went away does to the job: stop (the job stops in conflict for a person to decide) or skip (the item is left unchanged, recorded in the audit as skipped with what was found, and the job goes on).';
COMMENT ON COLUMN etc_batch.job.target_name IS 'The target as it was named when the job was registered, for messages once it is gone.';
COMMENT ON COLUMN etc_batch.job.continued_as IS 'For a job that ended continued: the job its remaining items were approved as (register_remainder).';
COMMENT ON COLUMN etc_batch.job.failed_at IS
    'When a drain of the job last failed for a reason other than a conflict (a constraint, a trigger, a permission, a timeout), with failure_sqlstate, failure_message and failure_chunk; the chunk was rolled back and the job is still pending.';
COMMENT ON COLUMN etc_batch.job.seconds_at_work IS
    'Wall-clock seconds some drainer spent at work on the job, chunks and the waits between them, not time paused or with nobody draining: what the estimated finish is reckoned from.';
COMMENT ON COLUMN etc_batch.job.reverts IS
    'For a revert registered by register_revert: the job whose committed items it sets back.';
COMMENT ON COLUMN etc_batch.job.reverted_by IS
    'For a job reverted (status reverted): the job registered to set its committed items back.';
COMMENT ON COLUMN etc_batch.job.record_before IS
    'Whether registration recorded, in each approved item''s guards, the values its row held then in the columns the job sets (register_job''s record_before): guarded like any guard, they are exactly what the change replaced, and what register_revert sets back.';
COMMENT ON COLUMN etc_batch.job.set_from_items IS
    'The columns set to each item''s own value (register_job''s set_from_query; a revert''s, the values before of a job that recorded them), which its item carries in job_item.guards under the column''s name (not a guard: what the job sets); what the row held before in those columns is recorded at registration under the member named '''' (the empty name, which no column has), and guarded.';
COMMENT ON COLUMN etc_batch.job.set_expressions IS
    'The columns the job sets to an SQL expression over the row''s own columns (register_job''s set_expressions), each as PostgreSQL printed it back at registration, with every object outside pg_catalog schema-qualified: what the chunk''s UPDATE evaluates, with pg_catalog first in its search_path. The values these columns held before are recorded in each item''s guards. NULL: none.';
COMMENT ON COLUMN etc_batch.job.action IS
    'What the job does to each approved row that passes its guard: update (set_values, or a handler), delete, or move (inserted into archive and deleted, in one statement); restore, for a revert of a delete or a move, puts back the rows it kept (taken from archive again, for a move) whose key is free.';
COMMENT ON COLUMN etc_batch.job.archive IS
    'For a job that moves its rows (action move): the table they are moved to, which has every column of the target, by its schema-qualified name, found by that name when a chunk runs (as a handler is); for a restore of a move, the table they are taken back from.';
COMMENT ON COLUMN etc_batch.job.keep_deleted IS
    'For a job that deletes or moves its rows: whether each row''s whole content is kept with its chunk''s audit (job_audit_chunk.kept), what a revert puts back. false for a purge that must not keep what it deleted; such a job cannot be reverted.';
COMMENT ON COLUMN etc_batch.job.job_number IS
    'Names the job''s partitions of job_item_chunk and job_audit_chunk: job_item_chunk_<job_number>, job_audit_chunk_<job_number>.';

CREATE TABLE etc_batch.job_item_chunk (
    job_id         text      NOT NULL,
    first_position integer   NOT NULL CHECK (first_position >= 0),
    last_position  integer   NOT NULL,
    keys           text[]    NOT NULL,
    revisions      bigint[]  NOT NULL,
    guards         text[],
    CHECK (last_position = first_position + pg_catalog.cardinality(keys) - 1),
    CHECK (pg_catalog.cardinality(revisions) = pg_catalog.cardinality(keys)),
    CHECK (guards IS NULL OR pg_catalog.cardinality(guards) = pg_catalog.cardinality(keys))
) PARTITION BY LIST (job_id);

COMMENT ON TABLE etc_batch.job_item_chunk IS
    'The approved list, frozen at registration in key order, one row per chunk of the job: the positions of its items (first_position to last_position), and for each in order its key, the revision the operator saw, and the guard values that must still hold, as JSON text (NULL for an item without any; guards NULL when no item of the chunk has any). One partition per job, job_item_chunk_<job_number>, keyed by first_position. etc_batch.job_item shows it one row per item.';

CREATE TABLE etc_batch.job_audit_chunk (
    job_id          text        NOT NULL,
    first_position  integer     NOT NULL CHECK (first_position >= 0),
    last_position   integer     NOT NULL,
    chunk           integer     NOT NULL,
    txid            bigint      NOT NULL,
    committed_at    timestamptz NOT NULL,
    revisions_after bigint[]    NOT NULL,
    skipped         integer[],
    found           jsonb,
    kept            text[],
    CHECK (last_position = first_position + pg_catalog.cardinality(revisions_after) - 1),
    CONSTRAINT job_audit_chunk_kept_check
        CHECK (kept IS NULL OR pg_catalog.cardinality(kept) = pg_catalog.cardinality(revisions_after))
) PARTITION BY LIST (job_id);

COMMENT ON TABLE etc_batch.job_audit_chunk IS
    'One row per committed chunk, written in the same transaction as the change and the checkpoint: the positions of its approved items in job_item (first_position to last_position), the transaction and its time, and for each position in order the revision (or row digest) the change left the row at (NULL for a job guarded by named columns, and for an item skipped); skipped lists the positions of the items a job approved with on_drift => skip left unchanged because their rows had drifted or gone, and found the rows found, a JSON array in the same order (JSON null for a row gone). One partition per job, job_audit_chunk_<job_number>, keyed by first_position. etc_batch.job_audit shows it one row per item.';
COMMENT ON COLUMN etc_batch.job_audit_chunk.kept IS
    'For a job that deletes or moves its rows and keeps them (keep_deleted): each position''s row as it was when the chunk deleted it, in the table''s row type''s text form (NULL for an item skipped), compressed with the row as any long value is.';

CREATE TABLE etc_batch.job_chunk (
    job_id       text        NOT NULL,
    chunk        integer     NOT NULL,
    committed    boolean     NOT NULL DEFAULT false,
    seal         bigint      NOT NULL,
    txid         bigint,
    committed_at timestamptz,
    started_at   timestamptz,
    -- the chunk's own seconds, from its opening to its commit (the metrics)
    chunk_seconds float8
) PARTITION BY LIST (job_id);

COMMENT ON TABLE etc_batch.job_chunk IS
    'For a parallel job, one row per chunk: whether it is committed, with a seal of that written with it, and the transaction that committed it. A drainer claims a chunk by locking its row, skipping rows other drainers hold, and commits the chunk''s change, its audit rows and committed = true in one transaction; a drainer that dies leaves the row unlocked and the chunk unwritten. One partition per parallel job, job_chunk_<job_number>, keyed by chunk.';

-- Counting changes to what must never change: the per-chunk check reads one number
-- instead of comparing a million rows (see src/job/progress.rs). A partition's own
-- TRUNCATE trigger names its job (TG_ARGV[1]); one on the parent counts for every job.
CREATE FUNCTION etc_batch.count_job_changes() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    counter text := TG_ARGV[0];
BEGIN
    IF TG_OP = 'TRUNCATE' AND TG_NARGS > 1 THEN
        EXECUTE format('UPDATE etc_batch.job SET %I = %I + 1 WHERE job_id = $1', counter, counter)
            USING TG_ARGV[1];
    ELSIF TG_OP = 'TRUNCATE' THEN
        EXECUTE format('UPDATE etc_batch.job SET %I = %I + 1', counter, counter);
    ELSIF TG_OP = 'DELETE' THEN
        EXECUTE format('UPDATE etc_batch.job SET %I = %I + 1 WHERE job_id = $1', counter, counter)
            USING OLD.job_id;
    ELSE
        EXECUTE format('UPDATE etc_batch.job SET %I = %I + 1 WHERE job_id IN ($1, $2)', counter, counter)
            USING OLD.job_id, NEW.job_id;
    END IF;
    RETURN NULL;
END
$$;

-- Row triggers on the parents are cloned onto every partition as it is attached.
CREATE TRIGGER job_audit_changed AFTER UPDATE OR DELETE ON etc_batch.job_audit_chunk
    FOR EACH ROW EXECUTE FUNCTION etc_batch.count_job_changes('audit_changes');
CREATE TRIGGER job_audit_truncated AFTER TRUNCATE ON etc_batch.job_audit_chunk
    FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes('audit_changes');
CREATE TRIGGER job_item_changed AFTER UPDATE OR DELETE ON etc_batch.job_item_chunk
    FOR EACH ROW EXECUTE FUNCTION etc_batch.count_job_changes('item_changes');
CREATE TRIGGER job_item_truncated AFTER TRUNCATE ON etc_batch.job_item_chunk
    FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes('item_changes');

-- A job's two partitions, made as tables of their own that registration fills, and
-- attached when it is done: attaching takes a SHARE UPDATE EXCLUSIVE lock on the
-- parents, which readers never wait for, and only for the end of the registering
-- transaction; a CHECK on the job id spares it the scan of the rows. The registering
-- role may read its job's partitions (a chunk's change reads the frozen list as that
-- role; job_report and job_summary read the audit and chunks for it) and nothing else
-- of etc_batch's tables.
CREATE FUNCTION etc_batch.create_job_tables(job_number bigint, job_id text, registrant regrole,
                                            parallel boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    items text := 'job_item_chunk_' || job_number;
    audit text := 'job_audit_chunk_' || job_number;
BEGIN
    -- each keyed by both ends: a chunk's row found from its first position (where the
    -- checkpoint stands) or its last (the row that holds a position; whether any audit
    -- lies at or beyond a position)
    EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_item_chunk INCLUDING CONSTRAINTS,
                        CHECK (job_id = %L), PRIMARY KEY (first_position), UNIQUE (last_position))',
                   items, job_id);
    EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_audit_chunk INCLUDING CONSTRAINTS,
                        CHECK (job_id = %L), PRIMARY KEY (first_position), UNIQUE (last_position))',
                   audit, job_id);
    EXECUTE format('CREATE TRIGGER job_item_truncated AFTER TRUNCATE ON etc_batch.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes(%L, %L)',
                   items, 'item_changes', job_id);
    EXECUTE format('CREATE TRIGGER job_audit_truncated AFTER TRUNCATE ON etc_batch.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION etc_batch.count_job_changes(%L, %L)',
                   audit, 'audit_changes', job_id);
    EXECUTE format('GRANT SELECT ON etc_batch.%I, etc_batch.%I TO %s', items, audit, registrant);
    IF parallel THEN
        -- half of each page left free: a chunk's row is changed once, as a HOT update
        EXECUTE format('CREATE TABLE etc_batch.%I (LIKE etc_batch.job_chunk INCLUDING CONSTRAINTS
                            INCLUDING DEFAULTS, CHECK (job_id = %L), PRIMARY KEY (chunk))
                            WITH (fillfactor = 50)', 'job_chunk_' || job_number, job_id);
        EXECUTE format('GRANT SELECT ON etc_batch.%I TO %s', 'job_chunk_' || job_number, registrant);
    END IF;
END
$$;

-- A job's partitions attached, once registration has filled them (a parallel job's
-- chunk rows, one per chunk, open, each with its seal, written by src/job/claim.rs).
CREATE FUNCTION etc_batch.attach_job_tables(job_number bigint, job_id text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('etc_batch.%I', 'job_chunk_' || job_number)) IS NOT NULL THEN
        EXECUTE format('ALTER TABLE etc_batch.job_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                       'job_chunk_' || job_number, job_id);
    END IF;
    EXECUTE format('ALTER TABLE etc_batch.job_item_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                   'job_item_chunk_' || job_number, job_id);
    EXECUTE format('ALTER TABLE etc_batch.job_audit_chunk ATTACH PARTITION etc_batch.%I FOR VALUES IN (%L)',
                   'job_audit_chunk_' || job_number, job_id);
END
$$;

-- The job rows and their numbers; a job's partitions are tables of their own, which
-- pg_dump keeps with their rows (see docs/upgrading.md, "Backups").
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job', '');
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_job_number_seq', '');

-- A chunk's frozen items as one row per item: the one rule for it, which the view
-- job_item, the change of every chunk and the statements that read one job's list
-- (src/job/tables.rs, target.rs) share. Inlined, bound and callable by anyone, as
-- chunk_audit_items below.
CREATE FUNCTION etc_batch.chunk_items(first_position integer, item_keys text[],
                                      item_revisions bigint[], item_guards text[])
RETURNS TABLE ("position" integer, item_key text, revision bigint, guards jsonb)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
SELECT ($1 OPERATOR(pg_catalog.+) u.n OPERATOR(pg_catalog.-) 1)::pg_catalog.int4, u.k, u.r,
       COALESCE(u.g::pg_catalog.jsonb, '{}'::pg_catalog.jsonb)
  FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4))
       WITH ORDINALITY AS u(k, r, g, n);
END;

CREATE VIEW etc_batch.job_item AS
SELECT c.job_id, u.position, u.item_key, u.revision, u.guards
  FROM etc_batch.job_item_chunk c,
       etc_batch.chunk_items(c.first_position, c.keys, c.revisions, c.guards) u;

COMMENT ON VIEW etc_batch.job_item IS
    'The approved list, frozen at registration in key order, one row per item, as job_item_chunk holds it: position, key, the revision the operator saw, and the guard values that must still hold. WHERE job_id = ... reads that job''s partition only.';

-- A chunk's audit row as one row per item: the one rule for it, which the view
-- job_audit and the statements that read one job's audit (src/job/tables.rs) share.
-- Inlined into the statement that calls it (LANGUAGE sql, IMMUTABLE, no SET); its body,
-- SQL-standard, is bound when it is made, whatever the caller's search_path. Anyone may
-- call it: it reads nothing, and a reader of the view job_audit calls it.
CREATE FUNCTION etc_batch.chunk_audit_items(first_position integer, revisions_after bigint[],
                                            skipped_positions integer[], found_rows jsonb)
RETURNS TABLE ("position" integer, revision_after bigint, skipped boolean, found jsonb)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
SELECT p.position, u.revision_after, s.k IS NOT NULL, $4 OPERATOR(pg_catalog.->) (s.k OPERATOR(pg_catalog.-) 1)
  FROM pg_catalog.unnest($2) WITH ORDINALITY AS u(revision_after, n),
       LATERAL (SELECT ($1 OPERATOR(pg_catalog.+) u.n OPERATOR(pg_catalog.-) 1)::pg_catalog.int4 AS position) p,
       LATERAL (SELECT pg_catalog.array_position($3, p.position) AS k) s;
END;

CREATE VIEW etc_batch.job_audit AS
SELECT a.job_id, u.position, u.revision_after, a.chunk, a.txid, a.committed_at, u.skipped, u.found
  FROM etc_batch.job_audit_chunk a,
       etc_batch.chunk_audit_items(a.first_position, a.revisions_after, a.skipped, a.found) u;

COMMENT ON VIEW etc_batch.job_audit IS
    'The audit, one row per item of a committed chunk, as job_audit_chunk holds it: the position of its approved item in job_item (whose key, revision and guards never change), the revision (or row digest) the change left the row at, the chunk, the transaction and its time; for an item a job approved with on_drift => skip left unchanged because its row had drifted or gone, skipped and the row found (JSON null when it was gone). WHERE job_id = ... reads that job''s partition only.';

CREATE VIEW etc_batch.job_audit_items AS
SELECT a.job_id, a.position, i.item_key, i.revision AS revision_before, a.revision_after,
       i.guards, a.chunk, a.txid, a.committed_at,
       CASE WHEN a.skipped THEN 'skipped' ELSE 'changed' END AS outcome, a.found,
       CASE j.guard WHEN 'revision' THEN 'revision column ' || pg_catalog.quote_ident(j.revision_column)
                    WHEN 'row' THEN 'row digest'
                    ELSE 'columns' END AS guarded_by
  FROM etc_batch.job_audit a
  JOIN etc_batch.job_item i ON i.job_id = a.job_id AND i.position = a.position
  JOIN etc_batch.job j ON j.job_id = a.job_id;

COMMENT ON VIEW etc_batch.job_audit_items IS
    'The audit rows with their approved items: for each item of a committed chunk, its key, the revision (or row digest) approved and the guards, the revision after, the chunk, the transaction and its time, whether it was changed or skipped (and the row found then), and how the job recognised an unchanged row. WHERE job_id = ... reads that job''s partitions only.';

REVOKE ALL ON etc_batch.job, etc_batch.job_item_chunk, etc_batch.job_item, etc_batch.job_audit_chunk, etc_batch.job_audit,
              etc_batch.job_chunk, etc_batch.job_audit_items FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.count_job_changes() FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.create_job_tables(bigint, text, regrole, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION etc_batch.attach_job_tables(bigint, text) FROM PUBLIC;

-- An approval made from a job's items (a revert, a remainder) leaves out those whose rows
-- drifted or went away: never overwritten, named here, so that every item of the job is
-- accounted for.
CREATE TABLE etc_batch.job_left_out (
    job_id            text    NOT NULL,
    "position"        integer NOT NULL,
    item_key          text    NOT NULL,
    state             text    NOT NULL CHECK (state IN ('drifted', 'gone', 'another tenant', 'taken')),
    approved_again_as text,
    PRIMARY KEY (job_id, "position")
);

COMMENT ON TABLE etc_batch.job_left_out IS
    'The items of a job that an approval made from them left out: for a revert (register_revert), the committed items of the job it reverts; for a remainder (register_remainder), the items the job it continues did not change. job_id is the revert or the remainder; position and item_key the item''s in the job it was made from; state whether its row had drifted, was gone, or its key named another tenant''s row (for a revert of a delete or a move: whether its key was taken by a row again, or its row was no longer in the archive as it was moved); approved_again_as, for a drifted item of a remainder, the job that approved it again at its row''s state (register_remainder with include_drifted on the continued job).';
SELECT pg_catalog.pg_extension_config_dump('etc_batch.job_left_out', '');
REVOKE ALL ON etc_batch.job_left_out FROM PUBLIC;
