//! The commit loop behind `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! One transaction per chunk, of one statement and a COMMIT:
//!   1. the job's row locked and the progress it records checked (seal, counters, one
//!      index probe for an audit row beyond it), as the extension's owner, without a
//!      statement (checkpoint.rs);
//!   2. the chunk's change, the one statement, as the registering role: its items read
//!      from the job's own partition, every one that still matches changed, the changed
//!      rows counted;
//!   3. the chunk's audit rows written as COPY writes them (audit.rs) and the checkpoint
//!      moved past it in place (checkpoint.rs), as the owner; then COMMIT.
//! The change, the audit rows and the checkpoint commit together or not at all. No
//! subtransaction on that path: a chunk in which an item no longer matches is rolled
//! back with its whole transaction, and the conflict is recorded in the next one, after
//! the job's lock is taken again and the checkpoint is found where it was. Conflicts and
//! corrupt progress stop the job and are raised, never retried.

use super::approval::{self, parse_object};
use super::audit::{AuditWriter, ChunkAudit};
use super::checkpoint::{self, Locked};
use super::claim::{self, Claim};
use super::conflict::{self, Expected};
use super::crash::{self, Point};
use super::definition::Definition;
use super::pace::{self, Wait};
use super::progress::{chunk_count, Progress};
use super::sql;
use super::target::Constants;
use crate::activity::Activity;
use crate::error::{BatchError, Result};
use crate::installed;
use crate::lease::Fence;
use crate::pauses::Paused;
use crate::query;
use crate::roles::{as_author, as_role};

use crate::status::JobStatus;
use crate::txn::{Failure, FailureKind, TxnLoop};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::quote_literal;
use serde_json::Value;
use std::ops::Range;

/// What one CALL did, in numbers that do not grow with the job: the chunks and items it
/// committed, the first and last key of them, and the job's status after it. The keys
/// themselves are in the audit.
#[derive(Debug)]
pub struct Drained {
    pub chunks: i32,
    pub items: i64,
    pub first_key: Option<String>,
    pub last_key: Option<String>,
    pub status: JobStatus,
    /// The call stopped because the job is paused.
    pub paused: bool,
}

/// The statements of one job, built once per call.
struct Job {
    activity: Activity,
    def: Definition,
    /// The lease this drainer works under, checked again in every chunk's transaction.
    fence: Option<Fence>,
    change_sql: String,
    mismatch_sql: String,
    item_sql: String,
    items_in_range_sql: String,
    row_sql: String,
    /// The values the change sets and expects, as it binds them after $1-$3.
    constants: Vec<query::Opaque>,
    /// An integer key's type: the change binds the chunk's first and last key after the
    /// constants, as values of it.
    key_type: Option<pg_sys::Oid>,
    bookkeeper: pg_sys::Oid,
    /// Who called drain_job: the job's SQL runs restricted when it is not the registrant.
    caller: pg_sys::Oid,
}

enum Chunk {
    /// A chunk committed: its items, their first and last key, whether it was the last.
    Committed {
        items: i64,
        first_key: String,
        last_key: String,
        last: bool,
    },
    /// Another drainer committed the chunk this one rolled back: go on with the next.
    Again,
    /// Nothing left to do: the job is done.
    Finished,
    /// A parallel job's chunks not yet committed are all held by other drainers: this
    /// one is not needed, and does not wait.
    AllHeld,
    /// The job is paused: the call stops here.
    Paused(Paused),
    /// The chunk's change failed with a transient error (retries.rs); its transaction
    /// is broken and must be rolled back before anything else runs.
    Transient { number: i32, failure: Failure },
}

/// What the chunk's change did.
enum Change {
    /// Every item changed: each one's position and the revision its row has now.
    Done(Vec<(i32, i64)>),
    /// Fewer rows changed than the chunk has items: the first one that did not, where it
    /// is already known (a handler that returned NULL).
    Conflict(Option<i32>),
    /// The change failed with a transient error, caught: nothing may run in the
    /// transaction before it is rolled back.
    Transient(Failure),
}

pub fn drain(
    tx: &mut TxnLoop,
    job_id: &str,
    max_chunks: Option<i32>,
    fence: Option<Fence>,
) -> Result<Drained> {
    if let Some(max) = max_chunks.filter(|m| *m < 0) {
        return Err(BatchError::invalid_because(
            format!("max_chunks {max} is out of range"),
            "Give the number of chunks to attempt, or NULL for all of them.",
        ));
    }
    let bookkeeper = installed::owner()?;
    let def = as_role(bookkeeper, || Definition::require(job_id))?;
    if def.handler_dropped {
        return Err(BatchError::HandlerMissing {
            job: job_id.to_string(),
        });
    }
    def.require_tables()?;
    let target = def.target()?;
    let items = def.tables.items();
    let constants = Constants::new(def.set_values.as_ref(), &def.expect);
    let key_type = target
        .key_is_integer()
        .then(|| target.type_oids[&def.key_column]);
    let change_sql = match &def.handler {
        Some(handler) => target.handler_sql(items, def.chunk_size, handler),
        None => target.change_sql(
            items,
            def.chunk_size,
            &def.guard_columns,
            &constants,
            key_type.is_some(),
        ),
    };
    let job = Job {
        activity: Activity::begin(),
        change_sql,
        mismatch_sql: target.first_mismatch_sql(
            items,
            def.chunk_size,
            &def.guard_columns,
            &constants,
        ),
        item_sql: def.tables.sql(sql::ITEM),
        items_in_range_sql: def.tables.sql(sql::ITEMS_IN_RANGE),
        row_sql: target.current_row_sql(),
        constants: constants.args(&target)?,
        key_type,
        def,
        fence,
        bookkeeper,
        caller: crate::roles::current_user(),
    };

    let mut drained = Drained {
        chunks: 0,
        items: 0,
        first_key: None,
        last_key: None,
        status: JobStatus::Pending,
        paused: false,
    };
    let mut audit = AuditWriter::new(&job.def.tables.audit_relname())?;
    let mut finished = false;
    let mut all_held = false;
    // the failed attempts of the chunk being tried, for transient errors
    let mut failed_attempts = 0;
    // where this drainer looks for a parallel job's next chunk
    let mut cursor = claim::Cursor::new();
    while !finished
        && !all_held
        && !drained.paused
        && max_chunks.is_none_or(|max| drained.chunks < max)
    {
        // the pace: wait, holding nothing, until the next chunk may go
        job.wait_for_pace(tx)?;
        let chunk = if job.def.parallel {
            tx.item(|tx| job.next_parallel_chunk(tx, &mut audit, &mut cursor))?
        } else {
            tx.item(|tx| job.next_chunk(tx, &mut audit))?
        };
        if !matches!(chunk, Chunk::Transient { .. }) {
            failed_attempts = 0;
        }
        match chunk {
            Chunk::Transient { number, failure } => {
                tx.rollback_after_error();
                failed_attempts += 1;
                job.retry(tx, number, failure, failed_attempts)?;
            }
            Chunk::Committed {
                items,
                first_key,
                last_key,
                last,
            } => {
                drained.chunks += 1;
                drained.items += items;
                drained.first_key.get_or_insert(first_key);
                drained.last_key = Some(last_key);
                finished = last;
            }
            Chunk::Again => {}
            Chunk::Finished => finished = true,
            Chunk::AllHeld => all_held = true,
            Chunk::Paused(paused) => {
                paused.notice(
                    &format!("job \"{job_id}\""),
                    &format!("etc_batch.resume_job({})", quote_literal(job_id)),
                );
                drained.paused = true;
            }
        }
    }
    // A parallel drain that stopped at max_chunks may have committed the job's last
    // chunk: it looks once more, so that a job with every chunk committed is done.
    if job.def.parallel && !finished && !all_held && !drained.paused && drained.chunks > 0 {
        finished = tx.item(|tx| job.finish_if_complete(tx, &mut cursor))?;
    }
    drained.status = if finished {
        JobStatus::Done
    } else if drained.chunks > 0 || all_held || drained.paused {
        // the loop stopped at max_chunks, after a chunk that was not the last, or found
        // every open chunk of a parallel job held by other drainers
        JobStatus::Pending
    } else {
        // max_chunks 0: the job was not even looked at
        let status = as_role(bookkeeper, || {
            query::one::<String>(sql::JOB_STATUS, &[job_id.into()])
        })?
        .ok_or_else(|| BatchError::UnknownJob {
            job: job_id.to_string(),
        })?;
        JobStatus::parse(&status)?
    };
    Ok(drained)
}

impl Job {
    fn owner<R>(&self, work: impl FnOnce() -> Result<R>) -> Result<R> {
        as_role(self.bookkeeper, work)
    }

    fn id(&self) -> &str {
        &self.def.job_id
    }

    /// Waits until the job's pace (pace.rs) lets its next chunk go: for its slot of the
    /// rate, and while the replicas are too far behind, saying so once. Every wait begins
    /// with a COMMIT, so that it holds nothing.
    fn wait_for_pace(&self, tx: &mut TxnLoop) -> Result<()> {
        let mut told = false;
        loop {
            let wait = tx.item(|tx| -> Result<Option<Wait>> {
                let (pace, wait) = self.owner(|| {
                    let pace = pace::of(self.id())?;
                    Ok((
                        pace,
                        pace::wait_before(self.id(), pace, self.def.chunk_size)?,
                    ))
                })?;
                // a slot taken locks the pace's row: let it go before the chunk, so that
                // other drainers take theirs meanwhile
                if wait.is_some() || pace.rows_per_second.is_some() {
                    tx.commit();
                }
                Ok(wait)
            })?;
            match wait {
                None => return Ok(()),
                Some(Wait::Slot(delay)) => {
                    self.activity.report(&format!(
                        "job \"{}\": paced, the next chunk in {} ms",
                        self.id(),
                        delay.as_millis()
                    ));
                    crate::txn::sleep(delay);
                    return Ok(());
                }
                Some(Wait::Replicas { behind, limit }) => {
                    if !told {
                        notice!(
                            "job \"{}\" waits: the replicas are {behind} bytes of WAL behind, more than max_replica_lag_bytes {limit}",
                            self.id()
                        );
                        told = true;
                    }
                    self.activity.report(&format!(
                        "job \"{}\": waiting for the replicas, {behind} bytes behind, more than {limit}",
                        self.id()
                    ));
                    crate::txn::sleep(pace::REPLICA_RECHECK);
                }
            }
        }
    }

    /// After attempt `attempt` of chunk `number` failed with a transient error and was
    /// rolled back: the retry recorded (job_retry, and a NOTICE) and committed, then the
    /// backoff slept, holding nothing; or, when the attempts are used up, the error
    /// raised, the job still pending.
    fn retry(&self, tx: &mut TxnLoop, number: i32, failure: Failure, attempt: i32) -> Result<()> {
        let attempts = crate::retries::attempts();
        let sqlstate = failure.sqlstate();
        if attempt >= attempts {
            let detail = format!(
                "Chunk {number} of job \"{}\" was rolled back after {attempt} attempt{} (etc_batch.transient_attempts); the job is still pending.",
                self.id(),
                if attempt == 1 { "" } else { "s" }
            );
            let hint = format!(
                "Call etc_batch.drain_job({}) again when the contention is over, or raise etc_batch.transient_attempts or etc_batch.chunk_lock_timeout.",
                quote_literal(self.id())
            );
            failure.raise(detail, hint);
        }
        let backoff = crate::retries::backoff(attempt);
        self.owner(|| {
            query::run(
                sql::RECORD_RETRY,
                &[
                    self.id().into(),
                    number.into(),
                    attempt.into(),
                    sqlstate.as_str().into(),
                    failure.message.as_str().into(),
                ],
            )
        })?;
        tx.commit();
        notice!(
            "chunk {number} of job \"{}\" was rolled back: {sqlstate} {}; attempt {attempt} of {attempts}, trying again in {} ms",
            self.id(),
            failure.message,
            backoff.as_millis()
        );
        self.activity.report(&format!(
            "job \"{}\": chunk {number} rolled back ({sqlstate}), trying again in {} ms",
            self.id(),
            backoff.as_millis()
        ));
        crate::txn::sleep(backoff);
        Ok(())
    }

    /// The fence, then the job's row locked and its progress read.
    fn lock(&self) -> Result<Locked> {
        if let Some(fence) = &self.fence {
            self.owner(|| fence.check())?;
        }
        self.owner(|| checkpoint::lock(self.id(), &self.def.tables))?
            .ok_or_else(|| BatchError::UnknownJob {
                job: self.id().to_string(),
            })
    }

    fn next_chunk(&self, tx: &mut TxnLoop, audit: &mut AuditWriter) -> Result<Chunk> {
        let locked = self.lock()?;
        match locked.status {
            JobStatus::Pending => {}
            JobStatus::Done => return Ok(Chunk::Finished),
            stopped => return Err(self.stopped(stopped)?),
        }
        if let Some(paused) = locked.paused {
            // nothing done: the job's lock goes with this transaction
            tx.commit();
            return Ok(Chunk::Paused(paused));
        }
        if let Some(reason) = locked.untrusted() {
            return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?);
        }
        let progress = locked.progress;
        let Some(range) = progress.next_chunk() else {
            let reason = format!(
                "The checkpoint is at the end of the {} approved items, but the job is not done.",
                progress.item_count
            );
            return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?);
        };
        let (number, total) = progress.chunk_number();
        self.activity.report(&format!(
            "job \"{}\": chunk {number} of {total}, keys {} to {}",
            self.id(),
            locked.first_key,
            locked.last_key
        ));

        // The change. Its error, a permission, a constraint, a cancel, rolls the chunk
        // back with the transaction; it is raised again, saying so.
        let changed = match self.change(&range, number, (&locked.first_key, &locked.last_key))? {
            Change::Done(changed) => changed,
            Change::Conflict(known) => {
                tx.rollback();
                return self
                    .after_rollback(tx, &range, |job, tx| job.record_mismatch(tx, &range, known));
            }
            Change::Transient(failure) => return Ok(Chunk::Transient { number, failure }),
        };
        let status = self.commit_chunk(tx, audit, number, &changed, || {
            checkpoint::advance(self.id(), &self.def.tables, locked.at, &range)
        })?;
        self.committed_notice(
            number,
            total,
            range.len(),
            &locked.first_key,
            &locked.last_key,
        );
        Ok(Chunk::Committed {
            items: range.len() as i64,
            first_key: locked.first_key,
            last_key: locked.last_key,
            last: status == JobStatus::Done,
        })
    }

    /// A chunk whose change is made: its audit rows written and the checkpoint moved
    /// (`checkpoint`, which returns what the caller wants of it), as the owner, with
    /// nothing between them, then COMMIT; with the crash points between the steps.
    fn commit_chunk<R>(
        &self,
        tx: &mut TxnLoop,
        audit: &mut AuditWriter,
        number: i32,
        changed: &[(i32, i64)],
        checkpoint: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        crash::reached(Point::AfterChange);
        let moved = self.owner(|| {
            audit.write(&ChunkAudit {
                job_id: self.id(),
                chunk: number,
                changed,
            })?;
            checkpoint()
        })?;
        // nothing runs between the audit rows and the checkpoint: one point after both
        crash::reached(Point::AfterCheckpoint);
        tx.commit();
        crash::reached(Point::AfterCommit);
        Ok(moved)
    }

    /// The NOTICE of a committed chunk, when anyone would receive it.
    fn committed_notice(
        &self,
        number: i32,
        total: i32,
        len: usize,
        first_key: &str,
        last_key: &str,
    ) {
        if crate::activity::notices_are_sent() {
            notice!(
                "chunk {number} of {total} committed: {len} item{}, keys {first_key} to {last_key}",
                if len == 1 { "" } else { "s" },
            );
        }
    }

    /// One chunk of a parallel job (see claim.rs): claimed, checked, changed, audited and
    /// marked committed in one transaction, which the claim lives in.
    fn next_parallel_chunk(
        &self,
        tx: &mut TxnLoop,
        audit: &mut AuditWriter,
        cursor: &mut claim::Cursor,
    ) -> Result<Chunk> {
        if let Some(fence) = &self.fence {
            self.owner(|| fence.check())?;
        }
        let tables = &self.def.tables;
        let chunks = chunk_count(self.def.item_count, self.def.chunk_size);
        let claimed = match self.owner(|| claim::claim(self.id(), tables, chunks, cursor))? {
            Claim::Claimed(claimed) => claimed,
            Claim::AllHeld => return Ok(Chunk::AllHeld),
            Claim::NoneOpen => return self.finish(tx),
            Claim::Stopped(JobStatus::Done) => return Ok(Chunk::Finished),
            Claim::Stopped(status) => return Err(self.stopped(status)?),
            Claim::Paused(paused) => {
                tx.commit();
                return Ok(Chunk::Paused(paused));
            }
            Claim::Untrusted(reason) => {
                return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?)
            }
        };
        let progress = Progress {
            next_index: (claimed.chunk - 1).saturating_mul(self.def.chunk_size),
            item_count: self.def.item_count,
            chunk_size: self.def.chunk_size,
        };
        let (number, total) = progress.chunk_number();
        let range = match progress.next_chunk() {
            Some(range) if number == claimed.chunk => range,
            _ => {
                let reason = format!(
                    "The job has a row for chunk {}, but its {} approved items make {total} chunks.",
                    claimed.chunk, progress.item_count
                );
                return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?);
            }
        };
        // no audit row may exist inside a chunk that is not committed
        let (audit_inside, keys) = self.owner(|| {
            let inside = checkpoint::first_audit_from(tables, range.start)?;
            let keys = checkpoint::chunk_keys(tables, &range)?;
            Ok((inside.filter(|p| *p < range.end), keys))
        })?;
        if let Some(position) = audit_inside {
            let reason = format!(
                "An audit row exists at position {position}, inside chunk {number}, which is not committed."
            );
            return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?);
        }
        let (first_key, last_key) = keys;
        self.activity.report(&format!(
            "job \"{}\": chunk {number} of {total}, keys {first_key} to {last_key}",
            self.id()
        ));

        let changed = match self.change(&range, number, (&first_key, &last_key))? {
            Change::Done(changed) => changed,
            Change::Conflict(known) => {
                tx.rollback();
                return self.after_parallel_rollback(tx, &range, known);
            }
            Change::Transient(failure) => return Ok(Chunk::Transient { number, failure }),
        };
        self.commit_chunk(tx, audit, number, &changed, || {
            claim::mark_committed(self.id(), tables, &claimed)
        })?;
        self.committed_notice(number, total, range.len(), &first_key, &last_key);
        Ok(Chunk::Committed {
            items: range.len() as i64,
            first_key,
            last_key,
            last: false,
        })
    }

    /// Every chunk of a parallel job is committed: the job is done, once its chunk rows
    /// and its audit agree; otherwise its progress is corrupt.
    fn finish(&self, tx: &mut TxnLoop) -> Result<Chunk> {
        let chunks = chunk_count(self.def.item_count, self.def.chunk_size);
        let untrusted =
            self.owner(|| claim::finish(self.id(), &self.def.tables, chunks, self.def.item_count))?;
        match untrusted {
            None => {
                tx.commit();
                Ok(Chunk::Finished)
            }
            Some(reason) => {
                Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?)
            }
        }
    }

    /// After a parallel drain stopped at max_chunks: whether the job is done now (its
    /// chunks all committed, by this drainer or others).
    fn finish_if_complete(&self, tx: &mut TxnLoop, cursor: &mut claim::Cursor) -> Result<bool> {
        let chunks = chunk_count(self.def.item_count, self.def.chunk_size);
        let done = match self.owner(|| claim::claim(self.id(), &self.def.tables, chunks, cursor))? {
            Claim::NoneOpen => matches!(self.finish(tx)?, Chunk::Finished),
            Claim::Stopped(JobStatus::Done) => true,
            _ => false,
        };
        // a chunk claimed only to look is let go
        tx.commit();
        Ok(done)
    }

    /// After a parallel job's chunk was rolled back for a conflict: the job stopped
    /// (claim::stop, so that the chunks in flight commit first), then, if no other
    /// drainer stopped it meanwhile, what stopped this chunk recorded.
    fn after_parallel_rollback(
        &self,
        tx: &mut TxnLoop,
        range: &Range<i32>,
        known: Option<i32>,
    ) -> Result<Chunk> {
        self.owner(|| claim::stop(&self.def.tables))?;
        let status = self
            .owner(|| query::one::<String>(sql::JOB_STATUS, &[self.id().into()]))?
            .ok_or_else(|| BatchError::UnknownJob {
                job: self.id().to_string(),
            })?;
        match JobStatus::parse(&status)? {
            JobStatus::Pending => self.record_mismatch(tx, range, known),
            JobStatus::Done => {
                tx.commit();
                Ok(Chunk::Finished)
            }
            stopped => Err(self.stopped(stopped)?),
        }
    }

    /// The business change of one chunk, as the registering role.
    fn change(&self, range: &Range<i32>, number: i32, keys: (&str, &str)) -> Result<Change> {
        let bounds = match self.key_type {
            Some(key_type) => vec![
                query::typed(key_type, keys.0)?,
                query::typed(key_type, keys.1)?,
            ],
            None => Vec::new(),
        };
        let mut args: Vec<DatumWithOid> = vec![
            range.start.into(),
            range.end.into(),
            self.def.tenant.as_str().into(),
        ];
        if self.def.handler.is_none() {
            args.extend(self.constants.iter().chain(&bounds).map(query::Opaque::arg));
        }
        let outcome = pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
            crate::raised::capturing(|| {
                as_author(
                    self.def.registered_by,
                    &self.def.search_path,
                    self.caller,
                    || match &self.def.handler {
                        None => self.guarded_update(&args, range),
                        Some(_) => self.handler_change(&args, range),
                    },
                )
            })
        }))
        .catch_others(|caught| {
            let mut failure = Failure::from(caught);
            failure.raised = failure
                .raised
                .map(|r| r.without_statement(&self.change_sql));
            if crate::retries::is_transient(failure.packed_code()) {
                Ok(Change::Transient(failure))
            } else {
                self.raise_rolled_back(failure, number)
            }
        })
        .execute();
        // etc_batch's own errors in the change (a handler's result it cannot read) say
        // the same: the chunk is rolled back
        outcome.or_else(|e| self.raise_rolled_back(e.into(), number))
    }

    fn guarded_update(&self, args: &[DatumWithOid], range: &Range<i32>) -> Result<Change> {
        let mut changed = Vec::with_capacity(range.len());
        query::rows(&self.change_sql, args, 0, |r| {
            changed.push((
                r.get::<i32>(1)?.unwrap_or(-1),
                r.get::<i64>(2)?.unwrap_or_default(),
            ));
            Ok(())
        })?;
        Ok(if changed.len() == range.len() {
            Change::Done(changed)
        } else {
            Change::Conflict(None)
        })
    }

    /// A handler job's chunk: each item's result, read as text (jsonb that serde_json
    /// cannot hold is a clear error here, not an internal one); NULL is a conflict.
    fn handler_change(&self, args: &[DatumWithOid], range: &Range<i32>) -> Result<Change> {
        let rows: Vec<(i32, Option<String>, String)> =
            query::rows(&self.change_sql, args, 0, |row| {
                Ok((
                    row.get::<i32>(1)?.unwrap_or(-1),
                    row.get::<String>(2)?,
                    row.get::<String>(3)?.unwrap_or_default(),
                ))
            })?;
        // Fewer items than the chunk's positions: the frozen list is short, which the
        // check after the rollback finds and reports as corrupt progress.
        if rows.len() != range.len() {
            return Ok(Change::Conflict(None));
        }
        let mut changed = Vec::with_capacity(rows.len());
        for (position, result, key) in rows {
            let Some(text) = result else {
                return Ok(Change::Conflict(Some(position)));
            };
            let result =
                approval::read_json(&format!("the handler's result for item {key}"), &text)?;
            let Some(revision) = result
                .get(&self.def.revision_column)
                .and_then(Value::as_i64)
            else {
                return Err(BatchError::invalid_because(
                    format!(
                        "handler result for item {key} has no integer \"{}\"",
                        self.def.revision_column
                    ),
                    "A handler returns the new state of the row, revision included, or NULL for a conflict.",
                ));
            };
            changed.push((position, revision));
        }
        Ok(Change::Done(changed))
    }

    /// An error of the chunk's change, raised again with what it means for the job: the
    /// chunk was rolled back with its transaction, and the job is still pending.
    fn raise_rolled_back(&self, failure: Failure, number: i32) -> ! {
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

    /// After a chunk was rolled back: takes the job's lock again and, if the checkpoint
    /// is still where the chunk began, records what stopped it (`record`). If another
    /// drainer committed the chunk meanwhile, this one goes on with the next; if another
    /// stopped the job, its record stands.
    fn after_rollback(
        &self,
        tx: &mut TxnLoop,
        range: &Range<i32>,
        record: impl FnOnce(&Job, &mut TxnLoop) -> Result<Chunk>,
    ) -> Result<Chunk> {
        let locked = self.lock()?;
        match locked.status {
            JobStatus::Pending if locked.progress.next_index == range.start => record(self, tx),
            JobStatus::Pending | JobStatus::Done => {
                tx.commit();
                Ok(Chunk::Again)
            }
            stopped => Err(self.stopped(stopped)?),
        }
    }

    /// Records why a chunk changed fewer rows than it has items, in the transaction after
    /// it was rolled back: the frozen list is short (corrupt), or the first item that no
    /// longer matches its row (`known`, or found now) is a conflict.
    fn record_mismatch(
        &self,
        tx: &mut TxnLoop,
        range: &Range<i32>,
        known: Option<i32>,
    ) -> Result<Chunk> {
        let found = self.owner(|| {
            query::by_index(|| {
                query::one::<i32>(
                    &self.items_in_range_sql,
                    &[range.start.into(), range.end.into()],
                )
            })
        })?;
        if found != Some(range.len() as i32) {
            let reason = format!(
                "Positions {} to {} should hold {} approved items, but {} were found.",
                range.start,
                range.end - 1,
                range.len(),
                found.unwrap_or(0)
            );
            return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?);
        }
        let position = match known {
            Some(position) => Some(position),
            None => self.first_mismatch(range)?,
        };
        Err(self.conflict(tx, position, range, self.def.item_count)?)
    }

    /// The first item of the chunk whose row no longer matches it.
    fn first_mismatch(&self, range: &Range<i32>) -> Result<Option<i32>> {
        let mut args: Vec<DatumWithOid> = vec![
            range.start.into(),
            range.end.into(),
            self.def.tenant.as_str().into(),
        ];
        args.extend(self.constants.iter().map(query::Opaque::arg));
        as_author(
            self.def.registered_by,
            &self.def.search_path,
            self.caller,
            || query::one::<i32>(&self.mismatch_sql, &args),
        )
    }

    /// Records and returns the conflict of the item at `position`, or of the chunk when
    /// every item matches again by now.
    fn conflict(
        &self,
        tx: &mut TxnLoop,
        position: Option<i32>,
        range: &Range<i32>,
        item_count: i32,
    ) -> Result<BatchError> {
        let Some(position) = position else {
            let detail = format!(
                "Positions {} to {} did not all match while their chunk ran, and match again now: they changed concurrently.",
                range.start,
                range.end - 1
            );
            return self.record_problem(tx, JobStatus::Conflict, &detail, Value::Null);
        };
        let (key, revision, guards) = self
            .owner(|| {
                query::row(&self.item_sql, &[position.into()], |r| {
                    Ok((
                        r.get::<String>(1)?.unwrap_or_default(),
                        r.get::<i64>(2)?.unwrap_or_default(),
                        r.get::<String>(3)?.unwrap_or_default(),
                    ))
                })
            })?
            .ok_or_else(|| {
                BatchError::Internal(format!("no approved item at position {position}"))
            })?;
        let row = as_author(
            self.def.registered_by,
            &self.def.search_path,
            self.caller,
            || {
                query::one::<String>(
                    &self.row_sql,
                    &[self.def.tenant.clone().into(), key.clone().into()],
                )
            },
        )?;
        let guards = parse_object(&guards);
        let expected = Expected {
            key: &key,
            position,
            item_count,
            tenant: &self.def.tenant,
            revision_column: &self.def.revision_column,
            revision,
            guards: &guards,
            expect: &self.def.expect,
        };
        // A row serde_json cannot read (a jsonb column nested deeper than it reads) is
        // reported as its text, so that the conflict is still recorded.
        let row = row.map(|text| serde_json::from_str(&text).unwrap_or(Value::String(text)));
        let (detail, problem) = conflict::describe(&expected, row.as_ref());
        self.record_problem(tx, JobStatus::Conflict, &detail, problem)
    }

    /// Puts the job into `status` with `reason`, commits that, and returns the error to
    /// raise. If another drainer already stopped the job, its record stands.
    fn record_problem(
        &self,
        tx: &mut TxnLoop,
        status: JobStatus,
        reason: &str,
        problem: Value,
    ) -> Result<BatchError> {
        let problem = if problem.is_null() {
            serde_json::json!({"reason": reason})
        } else {
            problem
        };
        self.owner(|| {
            if self.def.parallel {
                claim::stop(&self.def.tables)?;
            }
            query::run(
                sql::SET_PROBLEM,
                &[
                    self.id().into(),
                    status.as_str().into(),
                    problem.to_string().into(),
                    reason.into(),
                ],
            )
        })?;
        tx.commit();
        Ok(stopped_error(self.id(), status, Some(reason.to_string())))
    }

    /// The error for a job that is stopped for good.
    fn stopped(&self, status: JobStatus) -> Result<BatchError> {
        let reason =
            self.owner(|| query::one::<String>(sql::JOB_STATUS_REASON, &[self.id().into()]))?;
        Ok(stopped_error(self.id(), status, reason))
    }
}

/// The error a call raises for a job stopped in `status`, with the reason recorded.
fn stopped_error(job: &str, status: JobStatus, reason: Option<String>) -> BatchError {
    let job = job.to_string();
    match status {
        JobStatus::Conflict => BatchError::JobConflict {
            job,
            detail: reason.unwrap_or_default(),
        },
        JobStatus::Corrupt => BatchError::JobCorrupt {
            job,
            detail: reason.unwrap_or_default(),
        },
        _ => BatchError::JobAborted { job, reason },
    }
}
