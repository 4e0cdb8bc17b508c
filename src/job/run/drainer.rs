//! A drainer: one job's statements, roles and records, built once per call of drain, and
//! the chunk's change run as its kind of change says (job/change/).

use super::ending::Round;
use crate::activity::Activity;
use crate::error::{BatchError, Result};
use crate::installed;
use crate::job::change::{self, ChunkSql, KindOfChange, Ran};
use crate::job::definition::Definition;
use crate::job::distributed::Distributed;
use crate::job::lifecycle;
use crate::job::run::chunk::OpenChunk;
use crate::job::run::order::Order;
use crate::job::sql;
use crate::job::target::Constants;
use crate::lease::Fence;
use crate::query;
use crate::roles::{as_author, as_role};
use crate::status::JobStatus;
use crate::txn::{Failure, FailureKind};
use pgrx::datum::{clock_timestamp, DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::spi::quote_literal;
use serde_json::Value;

/// Chunks of at least this many items have their change planned for their own items
/// and key range, each time (change/set_values.rs, chunk_sql): a few hundred microseconds that
/// buy, where the chunk's items are most of the rows between its first and last key, a
/// join of that range read once instead of one probe of the target's index per item.
/// Smaller chunks share one plan, made once, which probes (`changing`): planning each
/// would cost more than it saves. Measured in bench/run (docs/benchmark.md, "0.4.0: the compact layout").
const PLANNED_FOR_ITS_ITEMS_FROM: i32 = 200;

/// A chunk under PLANNED_FOR_ITS_ITEMS_FROM whose items are at least this share of the
/// keys between its first and last (a key of one integer column) reads that range once,
/// in a plan of its own also made once, joined with its items by a hash, instead of
/// probing the key's index once per item: most of the rows the range holds are the
/// chunk's own, and one descent of the index and a walk along it cost less than one
/// descent per item. Sparser chunks probe, which never reads a row it does not change.
const DENSE_CHUNK: (u128, u128) = (4, 5);

/// Whether a chunk of `items` items from key `first` to key `last` is dense enough to read
/// its key range once (DENSE_CHUNK): both keys integers, `items` at least four fifths of
/// the keys from one to the other.
fn dense(first: &str, last: &str, items: usize) -> bool {
    match (first.parse::<i64>(), last.parse::<i64>()) {
        (Ok(first), Ok(last)) if last >= first => {
            let keys = (last as i128 - first as i128) as u128 + 1;
            keys * DENSE_CHUNK.0 <= items as u128 * DENSE_CHUNK.1
        }
        _ => false,
    }
}

/// How the change of a job of `chunk_size` is planned. On a target Citus distributes
/// (`distributed`), always for the chunk's values: Citus picks the shards of a statement
/// when it plans it, and a plan shared by every chunk would send each to every shard.
fn planning(chunk_size: i32, distributed: bool) -> query::Planning {
    if chunk_size >= PLANNED_FOR_ITS_ITEMS_FROM || distributed {
        query::Planning::ForTheValues
    } else {
        query::Planning::Generic
    }
}

/// The statements of one job, built once per call.
pub(super) struct Drainer {
    pub(super) activity: Activity,
    pub(super) def: Definition,
    /// What the job does to each item's row.
    pub(super) kind: KindOfChange,
    /// How the job's chunks are taken: in order, or claimed.
    pub(super) order: Order,
    /// The lease this drainer works under, checked again in every chunk's transaction.
    pub(super) fence: Option<Fence>,
    pub(super) change_sql: ChunkSql,
    /// For a chunk planned once whose items are dense in their key range (`dense`): the
    /// change bounded by the chunk's first and last key, its plan made once too. None:
    /// every chunk runs change_sql.
    pub(super) dense_sql: Option<ChunkSql>,
    pub(super) mismatch_sql: String,
    pub(super) item_sql: String,
    pub(super) items_in_range_sql: String,
    pub(super) row_sql: String,
    /// The values the change sets and expects, as it binds them after $1-$3.
    pub(super) constants: Vec<query::Opaque>,
    /// The change binds the chunk's first and last key after the constants, to bound
    /// its scan of the target (JobKey::bounds_chunks).
    pub(super) bounds: bool,
    /// How the change is planned (see `planning`).
    pub(super) planning: query::Planning,
    /// How Citus distributes the target, when the change binds each chunk's values of
    /// its distribution column last (distributed.rs, `prunes`); and the key's columns.
    pub(super) distributed: Option<Distributed>,
    pub(super) key_columns: usize,
    /// The job's SQL prints rows as text (a digest), the same in every session.
    pub(super) stable_output: bool,
    /// Since when this drainer has been at work on the job, for its next chunk: the
    /// call's start, then each of its commits (job.seconds_at_work).
    pub(super) at_work_since: TimestampWithTimeZone,
    pub(super) bookkeeper: pg_sys::Oid,
    pub(super) signals: SignalsRead,
    /// How long the job's transactions may take, as its pace said before the
    /// transaction: as many chunks as fit go in one (group.rs). None: one chunk each.
    pub(super) transaction_time: Option<std::time::Duration>,
    /// Who called drain_job: the job's SQL runs restricted when it is not the registrant.
    pub(super) caller: pg_sys::Oid,
}

/// What the chunk's change came to.
pub(super) enum Change {
    Ran(Ran),
    /// The change failed with a transient error, caught: nothing may run in the
    /// transaction before it is rolled back.
    Transient(Failure),
    /// The change failed for another reason, caught: likewise.
    Failed(Failure),
}

impl Drainer {
    pub(super) fn new(job_id: &str, fence: Option<Fence>) -> Result<Drainer> {
        let bookkeeper = installed::owner()?;
        let def = lifecycle::acted_on(job_id, "drain")?;
        if def.handler_dropped {
            return Err(BatchError::HandlerMissing {
                job: job_id.to_string(),
            });
        }
        def.require_tables()?;
        let target = def.target()?;
        let constants = Constants::new(def.set_values.as_ref(), &def.expect)
            .with_item_values(&def.set_from_items);
        // a plan shared by every chunk probes the key's index once per item; the key
        // range bounds only a chunk planned for its own items, which may read it whole
        let planned = planning(def.chunk_size, target.distributed.is_some());
        let bounds = target.bounds_chunks() && planned == query::Planning::ForTheValues;
        let kind = KindOfChange::of(&def);
        // a foreign key made since registration would take rows nothing keeps
        if kind.deletes_rows() {
            change::cascade::refuse(def.target, &target.display)?;
        }
        let change_sql = kind.chunk_sql(&def, &target, &constants, bounds);
        let dense_sql = (planned == query::Planning::Generic
            && kind.reads_the_target_by_key()
            && target.bounds_chunks()
            && target.shape.key.is_one_integer(&target.shape.columns))
        .then(|| kind.chunk_sql(&def, &target, &constants, true));
        Ok(Drainer {
            activity: Activity::begin(),
            kind,
            change_sql,
            dense_sql,
            mismatch_sql: kind.mismatches_sql(&def, &target, &constants),
            item_sql: def.tables.sql(sql::ITEM),
            items_in_range_sql: def.tables.sql(sql::ITEMS_IN_RANGE),
            row_sql: target.current_row_sql(),
            constants: constants.args(&target)?,
            bounds,
            planning: planned,
            distributed: target
                .distributed
                .clone()
                .filter(|d| d.spans_shards() && kind.reads_the_target_by_key()),
            key_columns: target.shape.key.columns().len(),
            stable_output: target.shape.reads_rows_as_text() || kind.keeps_rows(&def),
            at_work_since: clock_timestamp(),
            order: Order::of(&def),
            def,
            fence,
            bookkeeper,
            signals: SignalsRead::default(),
            transaction_time: None,
            caller: crate::roles::current_user(),
        })
    }

    /// Runs SQL of the job's author (the rows it reads), in the author's context
    /// (roles::as_author).
    pub(super) fn as_author<R>(&self, work: impl FnOnce() -> R) -> R {
        let extra = if self.stable_output {
            crate::settings::STABLE_OUTPUT
        } else {
            &[]
        };
        as_author(
            self.def.registered_by,
            &change::search_path(&self.def),
            self.caller,
            extra,
            work,
        )
    }

    /// As `as_author`, for the chunk's change: a guarded UPDATE planned as a chunk is
    /// best run, one probe of the target's key per item (or one range of it), whatever
    /// the target's statistics say: a table never analyzed can look small enough to scan
    /// whole, once per item. A handler's own statements are planned as it plans them.
    /// `dense`: the change is dense_sql, which reads the chunk's key range once.
    pub(super) fn changing<R>(&self, dense: bool, work: impl FnOnce() -> R) -> R {
        let mut extra = Vec::with_capacity(3 + crate::settings::STABLE_OUTPUT.len());
        if self.kind.reads_the_target_by_key() {
            // the change reads the target by its key's index, whatever its statistics
            // say; and a plan shared by every chunk, which cannot know how a chunk's
            // items lie in their key range, probes the index once per item, which costs
            // the same however scattered they are (see PLANNED_FOR_ITS_ITEMS_FROM),
            // unless it is the plan for dense chunks, which reads the range (DENSE_CHUNK)
            extra.push((c"enable_seqscan", "off"));
            if dense {
                extra.push((c"enable_nestloop", "off"));
            } else if self.planning == query::Planning::Generic {
                extra.push((c"enable_hashjoin", "off"));
                extra.push((c"enable_mergejoin", "off"));
            }
        }
        if self.stable_output {
            extra.extend_from_slice(crate::settings::STABLE_OUTPUT);
        }
        as_author(
            self.def.registered_by,
            &change::search_path(&self.def),
            self.caller,
            &extra,
            work,
        )
    }

    pub(super) fn owner<R>(&self, work: impl FnOnce() -> Result<R>) -> Result<R> {
        as_role(self.bookkeeper, work)
    }

    pub(super) fn id(&self) -> &str {
        &self.def.job_id
    }

    /// The job's status as its row says now.
    pub(super) fn status(&self) -> Result<JobStatus> {
        let status = self
            .owner(|| query::one::<String>(sql::JOB_STATUS, &[self.id().into()]))?
            .ok_or_else(|| BatchError::UnknownJob {
                job: self.id().to_string(),
            })?;
        JobStatus::parse(&status)
    }

    /// The business change of one chunk, as the registering role. Its error is caught:
    /// the transaction is broken then, and the loop rolls it back.
    pub(super) fn change(&self, chunk: &OpenChunk) -> Result<Change> {
        let range = &chunk.range;
        let mut args: Vec<DatumWithOid> = vec![
            range.start.into(),
            range.end.into(),
            self.def.tenant_value().into(),
        ];
        args.extend(self.constants.iter().map(query::Opaque::arg));
        let dense_sql = self
            .dense_sql
            .as_ref()
            .filter(|_| dense(&chunk.first_key, &chunk.last_key, range.len()));
        let sql = dense_sql.unwrap_or(&self.change_sql);
        if self.kind.is_guarded_update() {
            if self.bounds || dense_sql.is_some() {
                args.push(chunk.first_key.as_str().into());
                args.push(chunk.last_key.as_str().into());
            }
            args.extend(chunk.items.args());
            if let Some(d) = &self.distributed {
                args.push(chunk.items.distribution_values(d, self.key_columns));
            }
        }
        match caught(|| {
            self.changing(dense_sql.is_some(), || {
                self.kind.run(sql, &args, self.planning, range.len())
            })
        }) {
            Ok(ran) => Ok(Change::Ran(ran)),
            Err(mut failure) => {
                failure.raised = failure.raised.map(|r| r.without_statement(&sql.change));
                Ok(if crate::retries::is_transient(failure.packed_code()) {
                    Change::Transient(failure)
                } else {
                    Change::Failed(failure)
                })
            }
        }
    }

    /// Records that chunk `number` failed with `failure`, in the transaction after it was
    /// rolled back: job_progress, job_summary and the doctor show it.
    pub(super) fn record_failure(&self, number: i32, failure: &Failure) -> Result<()> {
        self.owner(|| {
            query::run(
                sql::RECORD_FAILURE,
                &[
                    self.id().into(),
                    failure.sqlstate().as_str().into(),
                    failure.message.as_str().into(),
                    number.into(),
                ],
            )
        })?;
        crate::events::job(
            self.def.tables.number,
            self.id(),
            "failed",
            serde_json::json!({"chunk": number, "sqlstate": failure.sqlstate(),
                               "message": failure.message}),
        );
        Ok(())
    }

    /// The job is done, in the transaction that made it so.
    pub(super) fn tell_done(&self) {
        crate::events::job(
            self.def.tables.number,
            self.id(),
            "done",
            serde_json::json!({"items": self.def.item_count}),
        );
    }

    /// An error of the chunk's change, raised again with what it means for the job: the
    /// chunk was rolled back with its transaction, and the job is still pending.
    pub(super) fn raise_rolled_back(&self, failure: Failure, number: i32) -> ! {
        let interrupted = failure.kind() == FailureKind::Interrupted;
        let detail = format!(
            "Chunk {number} of job \"{}\" was rolled back{}; the job is still pending.",
            self.id(),
            if interrupted {
                " when the call was interrupted"
            } else {
                ""
            }
        );
        // A literal a person can paste, whatever characters the job id holds.
        let hint = format!(
            "Fix the cause and call etc_batch.drain_job({}) again.",
            quote_literal(self.id())
        );
        failure.raise(detail, hint)
    }

    /// Puts the job into `status` with `reason`, for the loop to commit, with the error to
    /// raise then. If another drainer already stopped the job, its record stands.
    pub(super) fn stop(&self, status: JobStatus, reason: &str, problem: Value) -> Result<Round> {
        let problem = if problem.is_null() {
            serde_json::json!({"reason": reason})
        } else {
            problem
        };
        self.owner(|| {
            self.order.before_stop(&self.def)?;
            let stopped = query::one::<bool>(
                sql::SET_PROBLEM,
                &[
                    self.id().into(),
                    status.as_str().into(),
                    problem.to_string().into(),
                    reason.into(),
                ],
            )?;
            if stopped == Some(true) {
                crate::events::job(
                    self.def.tables.number,
                    self.id(),
                    status.as_str(),
                    serde_json::json!({"reason": reason}),
                );
            }
            Ok(())
        })?;
        Ok(Round::Stopped(lifecycle::stopped(
            self.id(),
            status,
            Some(reason.to_string()),
        )))
    }

    /// The error for a job that is stopped for good.
    pub(super) fn stopped(&self, status: JobStatus) -> Result<BatchError> {
        lifecycle::refusal(self.id(), status)
    }
}

/// Runs `work`, catching the error it raises, PostgreSQL's or etc_batch's own, as the
/// Failure of the chunk: the transaction is broken then, and the loop rolls it back.
pub(super) fn caught<T>(work: impl FnOnce() -> Result<T>) -> std::result::Result<T, Failure> {
    pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        crate::raised::capturing(|| work().map_err(Failure::from))
    }))
    .catch_others(|caught| Err(Failure::from(caught)))
    .execute()
}

/// When a drainer last read its job's signals, and the pace they were read for: read
/// again after etc_batch.signal_interval, or at once when the pace changed.
#[derive(Default)]
pub(super) struct SignalsRead {
    pub(super) read_at: Option<std::time::Instant>,
    pub(super) pace: crate::job::pace::Pace,
}

#[cfg(test)]
mod tests {
    use super::dense;

    #[test]
    fn a_chunk_is_dense_when_its_items_are_four_fifths_of_its_keys() {
        // every key from 1 to 100
        assert!(dense("1", "100", 100));
        // 80 items over 100 keys: dense; 79: not
        assert!(dense("1", "100", 80));
        assert!(!dense("1", "100", 79));
        assert!(dense("-50", "49", 100));
        assert!(dense("7", "7", 1));
        // one in four keys
        assert!(!dense("301", "697", 100));
    }

    #[test]
    fn keys_that_are_not_integers_or_not_in_order_are_never_dense() {
        assert!(!dense("a", "z", 26));
        assert!(!dense("1.5", "2", 1));
        assert!(!dense("100", "1", 100));
        assert!(!dense("", "", 0));
        // the widest range of bigint keys does not overflow
        assert!(!dense(&i64::MIN.to_string(), &i64::MAX.to_string(), 100));
    }
}
