//! Every fixed statement the job functions send. As in `chain::sql`: schema-qualified
//! names, OPERATOR(pg_catalog.x), values bound as parameters. The statements that name
//! the business table are built per job in `target`; those that name a job's own
//! partitions are templates here, with `{item_chunks}`, `{audit_chunks}`, `{items}` and
//! `{audit}` for the partitions (see `tables::JobTables::sql`): a chunk never reads a partitioned parent, so
//! its statements cost the same however many jobs there are.

/// Serializes registrations of one job id.
pub const LOCK_JOB_ID: &str = "\
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(
         'etc_batch.job:' OPERATOR(pg_catalog.||) $1, 0))";

/// A job as registered: what it changes and how. Never changes after registration.
pub const JOB_DEFINITION: &str = "\
SELECT j.tenant, j.target::pg_catalog.oid AS target, j.key_columns::pg_catalog.text[] AS key_columns,
       j.tenant_column::pg_catalog.text AS tenant_column,
       j.revision_column::pg_catalog.text AS revision_column, j.chunk_size,
       j.set_values::pg_catalog.text AS set_values,
       (SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.'
               OPERATOR(pg_catalog.||) pg_catalog.quote_ident(p.proname)
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
         WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure(j.handler)::pg_catalog.oid) AS handler,
       j.expect::pg_catalog.text AS expect, j.guard_columns, j.item_count,
       j.registered_by::pg_catalog.oid AS registered_by, j.fingerprint, j.target_name,
       j.search_path, j.handler IS NOT NULL AS has_handler, j.job_number,
       pg_catalog.to_regclass('etc_batch.job_item_chunk_' OPERATOR(pg_catalog.||) j.job_number) IS NOT NULL
       AND pg_catalog.to_regclass('etc_batch.job_audit_chunk_' OPERATOR(pg_catalog.||) j.job_number) IS NOT NULL
       AND (NOT j.parallel
            OR pg_catalog.to_regclass('etc_batch.job_chunk_' OPERATOR(pg_catalog.||) j.job_number) IS NOT NULL)
         AS tables_present,
       j.parallel, j.guard, j.on_drift,
       EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) j.target::pg_catalog.oid)
         AS target_present,
       pg_catalog.to_regprocedure(j.handler)::pg_catalog.oid AS handler_oid,
       j.record_before, j.set_from_items::pg_catalog.text[] AS set_from_items,
       j.set_expressions::pg_catalog.text AS set_expressions, j.reverts,
       j.action, j.archive, j.keep_deleted
  FROM etc_batch.job j
 WHERE j.job_id OPERATOR(pg_catalog.=) $1";

/// The first audit row at or beyond the checkpoint, and the key approved there; there
/// must be none. $1 next_index.
pub const AUDIT_BEYOND: &str = "\
SELECT a.position, i.item_key
  FROM {audit} a
  LEFT JOIN {items} i ON i.position OPERATOR(pg_catalog.=) a.position
 WHERE a.position OPERATOR(pg_catalog.>=) $1
 ORDER BY a.position
 LIMIT 1";

/// The approved items in [$1, $2) that have no audit row, at most $3.
pub const AUDIT_MISSING: &str = "\
SELECT i.position, i.item_key
  FROM {items} i
 WHERE i.position OPERATOR(pg_catalog.>=) $1 AND i.position OPERATOR(pg_catalog.<) $2
   AND NOT EXISTS (SELECT FROM {audit} a WHERE a.position OPERATOR(pg_catalog.=) i.position)
 ORDER BY i.position
 LIMIT $3";

/// The items of the one chunk row of the job's item partition that holds position $1
/// (if any), unfolded as `u`: what ITEMS_IN_RANGE and ITEM read.
macro_rules! items_of_the_chunk_holding_1 {
    () => {
        "(SELECT c.* FROM {item_chunks} c
         WHERE c.last_position OPERATOR(pg_catalog.>=) $1
         ORDER BY c.last_position LIMIT 1) c,
       etc_batch.chunk_items(c.first_position, c.keys, c.revisions, c.guards) u"
    };
}

/// How many approved items positions [$1, $2), a chunk's, hold. Read when a chunk
/// changed fewer rows than it has positions: the list itself may be what is short.
pub const ITEMS_IN_RANGE: &str = concat!(
    "SELECT pg_catalog.count(*)::pg_catalog.int4\n  FROM ",
    items_of_the_chunk_holding_1!(),
    "\n WHERE u.position OPERATOR(pg_catalog.>=) $1 AND u.position OPERATOR(pg_catalog.<) $2"
);

/// One approved item, from the chunk row that holds it. $1 position.
pub const ITEM: &str = concat!(
    "SELECT u.item_key, u.revision, u.guards::pg_catalog.text AS guards\n  FROM ",
    items_of_the_chunk_holding_1!(),
    "\n WHERE u.position OPERATOR(pg_catalog.=) $1"
);

/// Waits for a parallel job's chunks in flight and keeps new ones from starting, until
/// the end of the transaction (see claim::stop).
pub const LOCK_CHUNKS: &str = "LOCK TABLE {chunks} IN EXCLUSIVE MODE";

/// A job's audit rows, counted: the items of its chunks' rows.
pub const AUDIT_ROWS: &str = "\
SELECT COALESCE(pg_catalog.sum(pg_catalog.cardinality(a.revisions_after)), 0)::pg_catalog.int8
  FROM {audit_chunks} a";

/// A job's frozen list one row per item, as the view etc_batch.job_item shows it, read
/// from the job's own partition `{item_chunks}`: what `{items}` stands for in a statement.
pub const ITEMS: &str = "\
(SELECT c.job_id, u.position, u.item_key, u.revision, u.guards
   FROM {item_chunks} c,
        etc_batch.chunk_items(c.first_position, c.keys, c.revisions, c.guards) u)";

/// A job's audit one row per item, as the view etc_batch.job_audit shows it, read from
/// the job's own partition `{audit_chunks}`: what `{audit}` stands for in a statement.
pub const AUDIT_ITEMS: &str = "\
(SELECT a.job_id, u.position, u.revision_after, a.chunk, a.txid, a.committed_at, u.skipped, u.found
   FROM {audit_chunks} a,
        etc_batch.chunk_audit_items(a.first_position, a.revisions_after, a.skipped, a.found) u)";

/// A job done without a chunk of its own making the last checkpoint: a parallel job whose
/// chunks are all committed, or an approval of no items. Its row as a sequential job's
/// reads when done, the checkpoint at the end with its seal. $1 job, $2 chunks, $3 the
/// checkpoint's seal.
pub const FINISH: &str = "\
UPDATE etc_batch.job
   SET next_index = item_count, chunks_committed = $2, seal = $3,
       started_at = COALESCE(started_at, (SELECT pg_catalog.min(c.committed_at) FROM etc_batch.job_chunk c
                                            WHERE c.job_id OPERATOR(pg_catalog.=) $1)),
       last_commit_at = (SELECT pg_catalog.max(c.committed_at) FROM etc_batch.job_chunk c
                          WHERE c.job_id OPERATOR(pg_catalog.=) $1),
       status = 'done', finished_at = pg_catalog.now()
 WHERE job_id OPERATOR(pg_catalog.=) $1 AND status OPERATOR(pg_catalog.=) 'pending'";

/// Puts a pending job into conflict, corrupt or aborted, with what was found: true when
/// it did (another may have stopped it first). $1 job, $2 status, $3 problem (jsonb
/// text), $4 reason.
pub const SET_PROBLEM: &str = "\
UPDATE etc_batch.job
   SET status = $2, problem = $3::pg_catalog.jsonb, status_reason = $4,
       finished_at = pg_catalog.now()
 WHERE job_id OPERATOR(pg_catalog.=) $1 AND status OPERATOR(pg_catalog.=) 'pending'
RETURNING true";

/// A job's number, which names its partitions.
pub const NEXT_JOB_NUMBER: &str = "\
SELECT pg_catalog.nextval('etc_batch.job_job_number_seq'::pg_catalog.regclass)";

/// A job's partitions (two, three for a parallel job), as tables of their own. $1 job
/// number, $2 job, $3 registrant, $4 parallel.
pub const CREATE_JOB_TABLES: &str = "\
SELECT etc_batch.create_job_tables($1, $2, $3::pg_catalog.oid::pg_catalog.regrole, $4)";

/// A job's partitions attached, once the items (and a parallel job's chunk rows) are
/// written. $1 job number, $2 job.
pub const ATTACH_JOB_TABLES: &str = "SELECT etc_batch.attach_job_tables($1, $2)";

/// $1 job, $2 tenant, $3 target, $4 key columns, $5 tenant column, $6 revision column,
/// $7 chunk size, $8 set_values, $9 handler (its OID, kept by its name, as pg_upgrade
/// keeps it), $10 expect, $11 guard columns,
/// $12 item count, $13 fingerprint, $14 registering role, $15 job number, $16 parallel,
/// $17 the seal of its first checkpoint, $18 guard, $19 on_drift, $20 target's name,
/// $21 record_before, $22 set_from_items, $23 set_expressions.
pub const INSERT_JOB: &str = "\
INSERT INTO etc_batch.job
  (job_id, tenant, target, key_columns, tenant_column, revision_column, chunk_size,
   set_values, handler, expect, guard_columns, item_count, fingerprint, registered_by,
   search_path, seal, job_number, parallel, guard, on_drift, target_name, record_before,
   set_from_items, set_expressions, action, archive, keep_deleted)
OVERRIDING SYSTEM VALUE
VALUES ($1, $2, $3, $4::pg_catalog.name[], $5, $6, $7, $8::pg_catalog.jsonb,
        (SELECT pg_catalog.format('%I.%I(pg_catalog.jsonb)', n.nspname, p.proname)
           FROM pg_catalog.pg_proc p
           JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
          WHERE p.oid OPERATOR(pg_catalog.=) $9::pg_catalog.oid),
        $10::pg_catalog.jsonb,
        $11, $12, $13, $14, pg_catalog.current_setting('search_path'), $17, $15, $16, $18, $19, $20,
        $21, $22::pg_catalog.name[], $23::pg_catalog.jsonb, $24, $25, $26)";

/// The frozen list in key order, to compare and fingerprint it a batch at a time: its
/// chunk rows in order, each unfolded in order (a sort within each chunk's row only).
pub const STORED_ITEMS: &str = "\
SELECT u.item_key, u.revision, u.guards::pg_catalog.text AS guards
  FROM {item_chunks} c,
       etc_batch.chunk_items(c.first_position, c.keys, c.revisions, c.guards) u
 ORDER BY c.first_position, u.position";

/// Counts that the full check compares with the checkpoint. $1 next_index.
pub const FULL_COUNTS: &str = "\
SELECT (SELECT pg_catalog.count(*) FROM {items} i)::pg_catalog.int8 AS items,
       (SELECT pg_catalog.count(*) FROM {audit} a)::pg_catalog.int8 AS audits,
       (SELECT pg_catalog.count(*) FROM {audit} a
         WHERE a.position OPERATOR(pg_catalog.>=) $1)::pg_catalog.int8 AS beyond";

/// For a job that keeps the rows it deletes: how many of its audit's positions were
/// changed (neither skipped) and how many rows its audit keeps, for verify_job.
pub const ROWS_KEPT: &str = "\
SELECT COALESCE(pg_catalog.sum(pg_catalog.cardinality(a.revisions_after)
                 OPERATOR(pg_catalog.-) COALESCE(pg_catalog.cardinality(a.skipped), 0)), 0)::pg_catalog.int8 AS changed,
       COALESCE(pg_catalog.sum((SELECT pg_catalog.count(k) FROM pg_catalog.unnest(a.kept) AS k)), 0)::pg_catalog.int8 AS kept
  FROM {audit_chunks} a";

/// A parallel job's records counted, for verify_job: approved items, audit rows, audit
/// rows inside chunks not committed, and the items of the committed chunks (its chunk
/// rows are counted by claim::chunk_rows). $1 chunk size, $2 item count.
pub const PARALLEL_COUNTS: &str = "\
SELECT (SELECT pg_catalog.count(*) FROM {items} i)::pg_catalog.int8 AS items,
       (SELECT pg_catalog.count(*) FROM {audit} a)::pg_catalog.int8 AS audits,
       (SELECT pg_catalog.count(*) FROM {audit} a
          LEFT JOIN {chunks} c
            ON c.chunk OPERATOR(pg_catalog.=) ((a.position OPERATOR(pg_catalog./) $1) OPERATOR(pg_catalog.+) 1)
         WHERE c.committed IS NOT TRUE)::pg_catalog.int8 AS outside,
       (SELECT COALESCE(pg_catalog.sum(LEAST($1, $2 OPERATOR(pg_catalog.-)
                  ((c.chunk OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) $1))), 0)
          FROM {chunks} c WHERE c.committed)::pg_catalog.int8 AS committed_items";

/// The approved items of a parallel job's committed chunks that have no audit row, at
/// most $2. $1 chunk size.
pub const PARALLEL_AUDIT_MISSING: &str = "\
SELECT i.position, i.item_key
  FROM {items} i
  JOIN {chunks} c
    ON c.chunk OPERATOR(pg_catalog.=) ((i.position OPERATOR(pg_catalog./) $1) OPERATOR(pg_catalog.+) 1)
 WHERE c.committed
   AND NOT EXISTS (SELECT FROM {audit} a WHERE a.position OPERATOR(pg_catalog.=) i.position)
 ORDER BY i.position
 LIMIT $2";

/// Sets a job's pace, keeping the clock it has. $1 job, $2 rows per second, $3 max
/// replica lag in bytes, $4 the role setting it.
pub const PACE_JOB: &str = "\
INSERT INTO etc_batch.job_pace (job_id, rows_per_second, max_replica_lag_bytes, set_at, set_by,
       max_archive_backlog, yield_to_vacuum, windows, time_zone, throttle_query,
       pause_above_replica_lag_bytes, pause_above_archive_backlog, critical_query,
       transaction_time)
VALUES ($1, $2, $3, pg_catalog.now(), $4::pg_catalog.oid::pg_catalog.regrole,
        $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (job_id) DO UPDATE
   SET rows_per_second = EXCLUDED.rows_per_second,
       max_replica_lag_bytes = EXCLUDED.max_replica_lag_bytes,
       set_at = EXCLUDED.set_at, set_by = EXCLUDED.set_by,
       max_archive_backlog = EXCLUDED.max_archive_backlog,
       yield_to_vacuum = EXCLUDED.yield_to_vacuum,
       windows = EXCLUDED.windows, time_zone = EXCLUDED.time_zone,
       throttle_query = EXCLUDED.throttle_query,
       pause_above_replica_lag_bytes = EXCLUDED.pause_above_replica_lag_bytes,
       pause_above_archive_backlog = EXCLUDED.pause_above_archive_backlog,
       critical_query = EXCLUDED.critical_query,
       transaction_time = EXCLUDED.transaction_time";

/// A VACUUM at work on table $1 or one of its partitions, in this database: its pid.
/// (pg_partition_tree has no rows for a table that is not partitioned.)
pub const VACUUM_OF: &str = "\
SELECT v.pid FROM pg_catalog.pg_stat_progress_vacuum v
 WHERE v.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
   AND (v.relid OPERATOR(pg_catalog.=) $1
        OR v.relid IN (SELECT t.relid FROM pg_catalog.pg_partition_tree($1::pg_catalog.oid::pg_catalog.regclass) t))
 LIMIT 1";

/// A wait of job $1's drainer for $2 (job/pace, Wait::kind) that lasted $3 seconds,
/// added up per job and kind for the metrics.
pub const RECORD_WAIT: &str = "\
INSERT INTO etc_batch.job_wait AS w (job_id, waited_for, waits, seconds)
VALUES ($1, $2, 1, $3)
ON CONFLICT (job_id, waited_for) DO UPDATE
   SET waits = w.waits OPERATOR(pg_catalog.+) 1,
       seconds = w.seconds OPERATOR(pg_catalog.+) EXCLUDED.seconds";

/// The minute of the week now (Monday 00:00 is 0) in time zone $1.
pub const MINUTE_OF_WEEK: &str = "\
SELECT (((pg_catalog.date_part('isodow', t) OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) 1440)
        OPERATOR(pg_catalog.+) (pg_catalog.date_part('hour', t) OPERATOR(pg_catalog.*) 60)
        OPERATOR(pg_catalog.+) pg_catalog.date_part('minute', t))::pg_catalog.int4
  FROM (SELECT pg_catalog.timezone($1, pg_catalog.clock_timestamp())) s(t)";

/// Job $1 paused by etc_batch itself (as role $2, its owner) for reason $3, unless it
/// is paused already: true when it was paused now.
pub const PAUSE_FOR_SIGNAL: &str = "\
INSERT INTO etc_batch.job_pause (job_id, paused_at, paused_by, reason)
VALUES ($1, pg_catalog.now(), $2::pg_catalog.oid::pg_catalog.regrole, $3)
ON CONFLICT (job_id) DO NOTHING
RETURNING true";

/// No pace for a job. $1 job.
pub const UNPACE_JOB: &str =
    "DELETE FROM etc_batch.job_pace p WHERE p.job_id OPERATOR(pg_catalog.=) $1";

/// A chunk of $2 rows takes the next slot of job $1's pace: it begins at the end of the
/// slot before it, or now if that is past. Returns the seconds until it begins.
pub const TAKE_SLOT: &str = "\
UPDATE etc_batch.job_pace p
   SET next_slot = GREATEST(COALESCE(p.next_slot, pg_catalog.clock_timestamp()), pg_catalog.clock_timestamp())
                   OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs =>
                       $2::pg_catalog.float8 OPERATOR(pg_catalog./) p.rows_per_second)
 WHERE p.job_id OPERATOR(pg_catalog.=) $1 AND p.rows_per_second IS NOT NULL
RETURNING pg_catalog.date_part('epoch', p.next_slot OPERATOR(pg_catalog.-)
              pg_catalog.make_interval(secs => $2::pg_catalog.float8 OPERATOR(pg_catalog./) p.rows_per_second)
              OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp())";

/// The WAL bytes the slowest streaming standby has not replayed, or the slowest
/// replication slot (active or not: one nobody reads retains WAL just the same) has not
/// confirmed; 0 without either.
pub const REPLICA_LAG: &str = "\
SELECT GREATEST(
  (SELECT pg_catalog.max(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), r.replay_lsn))
     FROM pg_catalog.pg_stat_replication r),
  (SELECT pg_catalog.max(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(),
                                                    COALESCE(s.confirmed_flush_lsn, s.restart_lsn)))
     FROM pg_catalog.pg_replication_slots s
    WHERE COALESCE(s.confirmed_flush_lsn, s.restart_lsn) IS NOT NULL),
  0)::pg_catalog.int8";

/// A chunk tried again: $1 job, $2 chunk, $3 the failed attempt, $4 its SQLSTATE,
/// $5 its message.
pub const RECORD_RETRY: &str = "\
INSERT INTO etc_batch.job_retry (job_id, chunk, attempt, sqlstate, message, retried_at, pid)
VALUES ($1, $2, $3, $4, $5, pg_catalog.clock_timestamp(), pg_catalog.pg_backend_pid())";

/// A drain's chunk failed for a reason other than a conflict; the job stays pending.
/// $1 job, $2 SQLSTATE, $3 message, $4 chunk.
pub const RECORD_FAILURE: &str = "\
UPDATE etc_batch.job
   SET failed_at = pg_catalog.clock_timestamp(), failure_sqlstate = $2, failure_message = $3,
       failure_chunk = $4
 WHERE job_id OPERATOR(pg_catalog.=) $1";

/// The items of a job it did not change: without an audit row, or skipped; in position
/// order: position, key, revision, guards.
pub const REMAINING_ITEMS: &str = "\
SELECT i.position, i.item_key, i.revision, i.guards::pg_catalog.text AS guards
  FROM {items} i
  LEFT JOIN {audit} a ON a.position OPERATOR(pg_catalog.=) i.position
 WHERE a.position IS NULL OR a.skipped
 ORDER BY i.position";

/// The items a job changed (committed, not skipped), in position order: position, key,
/// the revision (or row digest) the change left, and the guards less the columns $1
/// (those whose values the change replaced).
pub const COMMITTED_ITEMS: &str = "\
SELECT i.position, i.item_key, a.revision_after AS revision,
       (i.guards OPERATOR(pg_catalog.-) $1::pg_catalog.text[])::pg_catalog.text AS guards
  FROM {items} i
  JOIN {audit} a ON a.position OPERATOR(pg_catalog.=) i.position
 WHERE NOT a.skipped
 ORDER BY i.position";

/// A job ends, reverted by another (its time of finishing kept if it had one).
/// $1 job, $2 the revert.
pub const REVERT_JOB: &str = "\
UPDATE etc_batch.job
   SET status = 'reverted', reverted_by = $2, finished_at = COALESCE(finished_at, pg_catalog.now()),
       status_reason = pg_catalog.format('reverted by job %s', $2)
 WHERE job_id OPERATOR(pg_catalog.=) $1";

/// A revert records the job it reverts. $1 that job, $2 the revert.
pub const MARK_REVERT: &str = "\
UPDATE etc_batch.job SET reverts = $1 WHERE job_id OPERATOR(pg_catalog.=) $2";

/// For a revert of a job guarded by row digests: how many of its items were frozen at a
/// digest other than the one the job's change left. `{revert_items}` the revert's
/// items, `{items}` and `{audit}` the job's.
pub const DIGESTS_MOVED: &str = "\
SELECT pg_catalog.count(*)
  FROM {revert_items} r
  JOIN {items} i ON i.item_key OPERATOR(pg_catalog.=) r.item_key
  JOIN {audit} a ON a.position OPERATOR(pg_catalog.=) i.position
 WHERE r.revision OPERATOR(pg_catalog.<>) a.revision_after";

/// The items an approval made from a job's items left out, in their order in that job:
/// key, reason, and the job that approved a drifted one again later. $1 the approval.
pub const LEFT_OUT: &str = "\
SELECT o.item_key, o.state, o.approved_again_as FROM etc_batch.job_left_out o
 WHERE o.job_id OPERATOR(pg_catalog.=) $1 ORDER BY o.\"position\"";

/// The items an approval made from a job's items left out. $1 the approval, $2
/// positions, $3 keys, $4 reasons.
pub const LEAVE_OUT: &str = "\
INSERT INTO etc_batch.job_left_out (job_id, \"position\", item_key, state)
SELECT $1, u.p, u.k, u.s
  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.text[]),
                  pg_catalog.unnest($4::pg_catalog.text[])) AS u(p, k, s)";

/// The items of a job that its remainder $1 left out as drifted and that no later call
/// approved again, as REMAINING_ITEMS lists them. `{items}` the job's.
pub const LEFT_OUT_DRIFTED: &str = "\
SELECT i.position, i.item_key, i.revision, i.guards::pg_catalog.text AS guards
  FROM {items} i
  JOIN etc_batch.job_left_out o ON o.\"position\" OPERATOR(pg_catalog.=) i.position
 WHERE o.job_id OPERATOR(pg_catalog.=) $1 AND o.state OPERATOR(pg_catalog.=) 'drifted'
   AND o.approved_again_as IS NULL
 ORDER BY i.position";

/// Items a remainder $1 left out, at positions $3 of the job it continued, approved
/// again by job $2.
pub const APPROVED_AGAIN: &str = "\
UPDATE etc_batch.job_left_out SET approved_again_as = $2
 WHERE job_id OPERATOR(pg_catalog.=) $1 AND \"position\" OPERATOR(pg_catalog.=) ANY ($3)";

/// Items a remainder $1 left out, at positions $2, left out now for reasons $3.
pub const LEFT_OUT_NOW: &str = "\
UPDATE etc_batch.job_left_out o SET state = u.s
  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.text[])) AS u(p, s)
 WHERE o.job_id OPERATOR(pg_catalog.=) $1 AND o.\"position\" OPERATOR(pg_catalog.=) u.p";

/// A job ends, continued as another. $1 job, $2 the other.
pub const CONTINUE_JOB: &str = "\
UPDATE etc_batch.job
   SET status = 'continued', continued_as = $2, finished_at = pg_catalog.now(),
       status_reason = pg_catalog.format('continued as job %s', $2)
 WHERE job_id OPERATOR(pg_catalog.=) $1";

/// A job's status. $1 job.
pub const JOB_STATUS: &str = "\
SELECT j.status FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1";

/// Why a job stopped; for a job continued as another, that one's id. $1 job.
pub const JOB_STATUS_REASON: &str = "\
SELECT CASE WHEN j.status OPERATOR(pg_catalog.=) 'continued' THEN j.continued_as
            WHEN j.status OPERATOR(pg_catalog.=) 'reverted' THEN j.reverted_by
            ELSE j.status_reason END
  FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1";

/// A handler: its callable name, and whether it is a function (jsonb) RETURNS jsonb.
/// $1 the function.
pub const HANDLER: &str = "\
SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.'
         OPERATOR(pg_catalog.||) pg_catalog.quote_ident(p.proname) AS name,
       p.prokind OPERATOR(pg_catalog.=) 'f'
       AND p.pronargs OPERATOR(pg_catalog.=) 1
       AND p.proargtypes[0] OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype
       AND p.prorettype OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype
       AND NOT p.proretset AS takes_and_returns_jsonb
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
 WHERE p.oid OPERATOR(pg_catalog.=) $1";

/// What the registering role may do: SELECT the target; which of the columns a job
/// assigns it may not UPDATE; EXECUTE the handler (true when there is none). $1 the
/// target, $2 the handler or NULL, $3 the columns assigned.
pub const PRIVILEGES: &str = "\
SELECT pg_catalog.has_table_privilege($1, 'SELECT') AS may_select,
       ARRAY(SELECT c FROM pg_catalog.unnest($3::pg_catalog.text[]) AS c
              WHERE NOT pg_catalog.has_column_privilege($1, c, 'UPDATE')) AS not_updatable,
       ($2::pg_catalog.oid IS NULL
        OR pg_catalog.has_function_privilege($2::pg_catalog.oid, 'EXECUTE')) AS may_execute,
       pg_catalog.has_any_column_privilege($1, 'UPDATE') AS may_lock,
       pg_catalog.has_table_privilege($1, 'DELETE') AS may_delete,
       ($4::pg_catalog.oid IS NULL
        OR pg_catalog.has_table_privilege($4::pg_catalog.oid, 'INSERT')) AS may_archive,
       pg_catalog.has_table_privilege($1, 'INSERT') AS may_insert,
       ($4::pg_catalog.oid IS NULL
        OR pg_catalog.has_table_privilege($4::pg_catalog.oid, 'SELECT, DELETE')) AS may_take_back";

/// A job's target: its kind, its quoted name, and its name as regclass prints it.
pub const RELATION: &str = "\
SELECT c.relkind::pg_catalog.text AS kind,
       pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.'
         OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.relname) AS sql_name,
       c.oid::pg_catalog.regclass::pg_catalog.text AS display
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE c.oid OPERATOR(pg_catalog.=) $1";

/// The target's columns, one row each: its name; its type's name, a domain's base type's
/// (domains over domains followed to the end); its declared type, quoted and qualified;
/// that type's OID; whether it sorts by a collation, and whether that is the "C" or
/// "POSIX" one (byte order); whether it is a generated column. $1 the table.
pub const COLUMNS: &str = "\
WITH RECURSIVE base(attnum, typ, basetype) AS (
  SELECT a.attnum, t.oid, t.typbasetype
    FROM pg_catalog.pg_attribute a
    JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
   WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attnum OPERATOR(pg_catalog.>) 0
     AND NOT a.attisdropped
  UNION ALL
  SELECT b.attnum, t.oid, t.typbasetype
    FROM base b JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) b.basetype
   WHERE b.basetype OPERATOR(pg_catalog.<>) 0)
SELECT a.attname::pg_catalog.text AS name, bt.typname::pg_catalog.text AS type_name,
       pg_catalog.quote_ident(tn.nspname) OPERATOR(pg_catalog.||) '.'
         OPERATOR(pg_catalog.||) pg_catalog.quote_ident(t.typname) AS sql_type,
       a.atttypid AS type_oid,
       bt.typcollation OPERATOR(pg_catalog.<>) 0 AS collatable,
       a.attcollation OPERATOR(pg_catalog.=) ANY (ARRAY['pg_catalog.\"C\"'::pg_catalog.regcollation,
                                                   'pg_catalog.\"POSIX\"'::pg_catalog.regcollation]::pg_catalog.oid[])
         AS byte_ordered,
       a.attgenerated OPERATOR(pg_catalog.<>) '' AS generated,
       a.attnotnull AS not_null
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
  JOIN pg_catalog.pg_namespace tn ON tn.oid OPERATOR(pg_catalog.=) t.typnamespace
  JOIN base b ON b.attnum OPERATOR(pg_catalog.=) a.attnum AND b.basetype OPERATOR(pg_catalog.=) 0
  JOIN pg_catalog.pg_type bt ON bt.oid OPERATOR(pg_catalog.=) b.typ
 WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attnum OPERATOR(pg_catalog.>) 0
   AND NOT a.attisdropped
 ORDER BY a.attnum";

/// The CHECK constraints of table $1 on its column $2 alone: name, expression.
pub const COLUMN_CHECKS: &str = "\
SELECT c.conname::pg_catalog.text AS name, pg_catalog.pg_get_expr(c.conbin, c.conrelid) AS expression
  FROM pg_catalog.pg_constraint c
  JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.conrelid
                                AND a.attname OPERATOR(pg_catalog.=) $2::pg_catalog.name
 WHERE c.conrelid OPERATOR(pg_catalog.=) $1 AND c.contype OPERATOR(pg_catalog.=) 'c'
   AND c.conkey OPERATOR(pg_catalog.=) ARRAY[a.attnum]
 ORDER BY c.conname";

/// The columns of a table's primary key, in the key's order. $1 the table.
pub const PRIMARY_KEY: &str = "\
SELECT pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY k.ord)
  FROM pg_catalog.pg_index i
 CROSS JOIN LATERAL pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, ord)
  JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                                AND a.attnum OPERATOR(pg_catalog.=) k.attnum
 WHERE i.indrelid OPERATOR(pg_catalog.=) $1 AND i.indisprimary";

/// Whether some valid, plain unique index has no column but the ones named, so that
/// the key (and tenant) name at most one row. The names are compared one by one, never
/// as a joined list: a column name may contain any character, a comma included.
/// $1 the table, $2 the key's columns and the tenant column.
pub const UNIQUE_KEY: &str = "\
SELECT EXISTS (
  SELECT FROM pg_catalog.pg_index i
   WHERE i.indrelid OPERATOR(pg_catalog.=) $1 AND i.indisunique AND i.indisvalid
     AND i.indpred IS NULL AND i.indexprs IS NULL
     AND NOT EXISTS (
           SELECT FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) AS k(attnum)
             JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                                           AND a.attnum OPERATOR(pg_catalog.=) k.attnum
            WHERE a.attname::pg_catalog.text OPERATOR(pg_catalog.<>) ALL ($2::pg_catalog.text[])))";

/// What job_summary says of a job from its row (and a parallel job's committed chunks),
/// read as the owner. $1 job.
pub const JOB_SUMMARY: &str = "\
SELECT j.status, j.item_count AS approved,
       -- a parallel job's committed items are those of its committed chunks
       CASE WHEN j.parallel THEN (
            SELECT COALESCE(pg_catalog.sum(LEAST(j.chunk_size, j.item_count OPERATOR(pg_catalog.-)
                       ((c.chunk OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.*) j.chunk_size))), 0)::pg_catalog.int4
              FROM etc_batch.job_chunk c
             WHERE c.job_id OPERATOR(pg_catalog.=) $1 AND c.committed)
            ELSE j.next_index END AS committed,
       j.parallel, j.failed_at, j.failure_sqlstate, j.failure_message
  FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1";

/// Whether the caller, once it may read a job (access.rs), may read the parents of the
/// job's partitions (else it reads the partitions, granted to the registrant).
pub const MAY_READ_JOB_PARENTS: &str = "\
SELECT pg_catalog.has_table_privilege('etc_batch.job_item', 'SELECT')
       AND pg_catalog.has_table_privilege('etc_batch.job_audit', 'SELECT')";

/// A job's checkpoint and the counters of changes made outside etc_batch, for the full
/// check. $1 job.
pub const JOB_CHECKPOINT: &str = "\
SELECT j.status, j.next_index, j.audit_changes, j.item_changes
  FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1";

/// A job's status, its row locked against a drainer committing meanwhile. $1 job.
pub const LOCK_JOB_STATUS: &str = "\
SELECT j.status FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1 FOR UPDATE";

/// Aborts a job, recording who did it and what it was before.
/// $1 job, $2 reason, $3 the aborting role.
pub const ABORT_JOB: &str = "\
UPDATE etc_batch.job
   SET status = 'aborted', status_reason = $2, finished_at = pg_catalog.now(),
       problem = pg_catalog.jsonb_build_object(
                   'aborted_by', $3::pg_catalog.regrole::pg_catalog.text,
                   'previous_status', status, 'previous_problem', problem)
 WHERE job_id OPERATOR(pg_catalog.=) $1";
