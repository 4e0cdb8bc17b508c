//! The commit loop behind `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! One transaction per chunk, of one statement and a COMMIT (`next_chunk`):
//!   1. lock: the chunk opened, the next one after the job's checkpoint or one a
//!      parallel job's drainer claims (order.rs), its records locked as the extension's
//!      owner, without a statement;
//!   2. check the status after the lock: a job paused, stopped or done is not changed,
//!      and its checkpoint is verified (its position, seal and counters);
//!   3. verify and change: the chunk's one statement (its kind of change, job/change/),
//!      as the registering role, changes every item whose row still matches what was
//!      approved, and counts them;
//!   4. audit: the chunk's audit rows written as COPY writes them (audit.rs);
//!   5. checkpoint: moved past the chunk, or its chunk row marked, as the owner;
//!   6. COMMIT (`drain`), and only then is the caller told.
//!
//! The change, the audit rows and the mark commit together or not at all. No
//! subtransaction on that path: a chunk in which an item no longer matches is rolled
//! back with its whole transaction, and the conflict is recorded in the next one, after
//! the job's lock is taken again and the chunk is found where it was. Conflicts and
//! corrupt progress stop the job and are raised, never retried.
//!
//! The loop alone ends transactions. A drainer's methods do one round of work and say
//! what it came to (`Round`); the loop commits it, rolls it back, records a retry, waits,
//! or raises, whichever transactions it runs in (txn::Transactions).
//!
//! Beside the loop: the drainer, one job's statements and roles built once per call
//! (drainer.rs); the wait for the pace before a chunk (pace_wait.rs); a transient
//! failure tried again (retry.rs); a chunk that changed fewer rows than it has items,
//! explained after its rollback (mismatch.rs); what the caller is told (notices.rs).

use super::drainer::{caught, Change, Drainer};
pub use super::ending::{AtWindowClose, Drained, Ended};
use super::ending::{Committed, Round};
use super::group::Group;
use super::notices::chunks_named;
use super::pace_wait::BeforeChunk;
use crate::error::{BatchError, Result};
use crate::halt::Halt;
use crate::job::change::Ran;
use crate::job::rules::approval::OnDrift;
use crate::job::run::audit::{AuditWriter, ChunkAudit};
use crate::job::run::chunk::Opening;
use crate::job::run::crash::{self, Point};
use crate::lease::Fence;
use crate::progress_notices::Teller;
use crate::roles::as_role;
use crate::session_lock::{SessionLock, Space};
use crate::status::JobStatus;
use crate::txn::Transactions;
use pgrx::datum::clock_timestamp;
use pgrx::prelude::*;
use pgrx::spi::quote_literal;
use serde_json::Value;
use std::ops::Range;

/// How a drain runs, as its caller asks: everything that differs between a client's
/// CALL of drain_job and a launch's worker is here, and nowhere else.
pub struct Options<'a> {
    /// The most chunks to commit; None: to the end of the job.
    pub max_chunks: Option<i32>,
    /// The lease the drainer works under, checked again in every chunk's transaction.
    pub fence: Option<Fence>,
    pub at_window_close: AtWindowClose,
    /// What stops the drain besides the job's pause (halt::Never for a CALL; a worker's
    /// launch that no longer runs).
    pub halt: &'a dyn Halt,
}

pub fn drain<T: Transactions>(tx: &mut T, job_id: &str, options: Options) -> Result<Drained> {
    let Options {
        max_chunks,
        fence,
        at_window_close,
        halt,
    } = options;
    if let Some(max) = max_chunks.filter(|m| *m < 0) {
        return Err(BatchError::invalid_because(
            format!("max_chunks {max} is out of range"),
            "Give the number of chunks to attempt, or NULL for all of them.",
        ));
    }
    let mut job = Drainer::new(job_id, fence)?;
    let mut teller = Teller::begin();
    // what job_progress counts as a drainer at work, also while it waits between chunks
    let _drainer = SessionLock::shared(Space::Drainer, job.def.tables.number);
    let mut drained = Drained {
        chunks: 0,
        items: 0,
        skipped: 0,
        first_key: None,
        last_key: None,
        ended: Ended::Job(JobStatus::Pending),
    };
    let mut audit = AuditWriter::new(&job.def.tables.audit_relname())?;
    let mut finished = false;
    let mut all_held = false;
    // the failed attempts of the chunk being tried, for transient errors
    let mut failed_attempts = 0;
    // the chunks done in the open transaction, when the job's transactions are sized by
    // time (group.rs): told once they commit
    let mut group: Group<Committed> = Group::default();
    while !finished
        && !all_held
        && matches!(drained.ended, Ended::Job(_))
        && max_chunks.is_none_or(|max| drained.chunks < max)
    {
        // the pace: wait, holding nothing, until the next transaction may go
        if !group.is_open() {
            match job.wait_for_pace(tx, at_window_close, halt)? {
                BeforeChunk::Go => {}
                BeforeChunk::Paused(paused) => {
                    if let Some(paused) = paused {
                        paused.notice(
                            &format!("job \"{job_id}\""),
                            &format!("etc_batch.resume_job({})", quote_literal(job_id)),
                        );
                    }
                    drained.ended = Ended::Paused;
                    continue;
                }
                BeforeChunk::OutsideWindows { opens_in } => {
                    ereport!(
                        NOTICE,
                        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
                        format!("job \"{job_id}\" is outside its windows; this call stops here"),
                        format!(
                            "Its next window opens in {}. pace_job sets the windows.",
                            crate::job::rules::window::human_minutes(opens_in)
                        )
                    );
                    drained.ended = Ended::OutsideWindows(JobStatus::Pending);
                    continue;
                }
            }
        }
        let began = std::time::Instant::now();
        group.chunk_begins(began, job.transaction_time);
        let shared = group.shared();
        let round = tx.item(|_| job.next_chunk(&mut audit, halt, shared))?;
        if !matches!(round, Round::Transient { .. }) {
            failed_attempts = 0;
        }
        if group.is_open() && !round.keeps_the_transaction() {
            // the group rolls back whole; its chunks and this one run one per
            // transaction next, so that whatever this was meets its chunk alone
            if round.broke_the_transaction() {
                tx.rollback_after_error();
            } else {
                tx.rollback();
            }
            let undone = group.rolled_back();
            job.order.rolled_back();
            debug1!(
                "etc_batch: job \"{job_id}\": a transaction of {undone} chunk(s) and one more rolled back; they run one per transaction"
            );
            continue;
        }
        match round {
            Round::Committed(chunk) => {
                let now = std::time::Instant::now();
                let last = chunk.last;
                group.chunk_done(chunk, began, now);
                let room = !last
                    && group.has_room(now)
                    && max_chunks.is_none_or(|max| drained.chunks + (group.len() as i32) < max);
                if room {
                    // what the next chunk's work counts from (job.seconds_at_work)
                    job.at_work_since = clock_timestamp();
                    crash::reached(Point::BetweenChunks);
                    continue;
                }
                let Some(chunks) = commit(tx, &mut job, &mut group) else {
                    continue;
                };
                if crate::txn::last_commit_unconfirmed() {
                    return Err(BatchError::SyncWaitCanceled {
                        what: chunks_named(&chunks, job_id),
                        again: format!("etc_batch.drain_job({})", quote_literal(job_id)),
                    });
                }
                crash::reached(Point::AfterCommit);
                job.at_work_since = clock_timestamp();
                if let Some((number, total, last)) = drained.tell(chunks, &teller) {
                    finished = last;
                    if !finished && teller.due(std::time::Instant::now()) {
                        drained.progress_notice(job_id, number, total, &teller);
                    }
                }
            }
            // nothing more to do in the transaction (a chunk held only to look is let go,
            // a paused job's lock goes with it): the chunks done before it commit
            Round::Finished | Round::AllHeld | Round::Paused(_) => {
                let Some(chunks) = commit(tx, &mut job, &mut group) else {
                    continue;
                };
                // the chunks a parallel drainer found held may have been its own, in the
                // transaction just committed: it looks again, and finds the job's last
                // chunks committed (the job is done) or other drainers' (it ends then)
                let own_were_held = matches!(round, Round::AllHeld) && !chunks.is_empty();
                drained.tell(chunks, &teller);
                if own_were_held {
                    continue;
                }
                match round {
                    Round::Finished => finished = true,
                    Round::AllHeld => all_held = true,
                    Round::Paused(paused) => {
                        paused.notice(
                            &format!("job \"{job_id}\""),
                            &format!("etc_batch.resume_job({})", quote_literal(job_id)),
                        );
                        drained.ended = Ended::Paused;
                    }
                    _ => unreachable!("the rounds of this arm"),
                }
            }
            Round::Mismatch { range, known } => {
                tx.rollback();
                group.transaction_ended();
                let stopped = tx.item(|_| job.after_mismatch(&range, known))?;
                tx.commit();
                if let Some(error) = stopped {
                    return Err(error);
                }
            }
            Round::Transient { number, failure } => {
                tx.rollback_after_error();
                group.transaction_ended();
                failed_attempts += 1;
                job.retry(tx, number, failure, failed_attempts)?;
            }
            Round::Stopped(error) => {
                tx.commit();
                return Err(error);
            }
            Round::Failed { number, failure } => {
                tx.rollback_after_error();
                group.transaction_ended();
                tx.item(|_| job.record_failure(number, &failure))?;
                tx.commit();
                job.raise_rolled_back(failure, number);
            }
        }
    }
    // A parallel drain that stopped at max_chunks may have committed the job's last
    // chunk: it looks once more, so that a job with every chunk committed is done.
    if job.order.looks_again_at_the_end()
        && !finished
        && !all_held
        && drained.ended != Ended::Paused
        && drained.chunks > 0
    {
        let round = tx.item(|_| job.finish_if_complete(halt))?;
        tx.commit();
        match round {
            Round::Finished => finished = true,
            Round::Stopped(error) => return Err(error),
            _ => {}
        }
    }
    let status = if finished {
        JobStatus::Done
    } else if drained.chunks > 0 || all_held || !matches!(drained.ended, Ended::Job(_)) {
        // the loop stopped at max_chunks, after a chunk that was not the last, or found
        // every open chunk of a parallel job held by other drainers
        JobStatus::Pending
    } else {
        // max_chunks 0: the job was not even looked at
        job.status()?
    };
    drained.ended = match drained.ended {
        Ended::Job(_) => Ended::Job(status),
        Ended::Paused => Ended::Paused,
        Ended::OutsideWindows(_) => Ended::OutsideWindows(status),
    };
    if teller.tells_the_end() {
        drained.end_notice(job_id);
    }
    Ok(drained)
}

/// Commits the open transaction, with what its chunks left to be written once (a
/// sequential job's checkpoint, group.rs) written first; returns the chunks it committed,
/// to be told. None when that write failed (a full disk under etc_batch's own tables):
/// the transaction is rolled back then, and its chunks run again one per transaction,
/// where the failure meets a chunk alone.
fn commit<T: Transactions>(
    tx: &mut T,
    job: &mut Drainer,
    group: &mut Group<Committed>,
) -> Option<Vec<Committed>> {
    if group.is_open() && !write_shared(tx, job, group) {
        return None;
    }
    tx.commit();
    Some(group.committed())
}

/// What the open transaction's chunks left to be written once, written; false (and the
/// transaction rolled back) when that failed.
fn write_shared<T: Transactions>(
    tx: &mut T,
    job: &mut Drainer,
    group: &mut Group<Committed>,
) -> bool {
    let written = tx.item(|_| {
        caught(|| {
            let Drainer {
                order,
                def,
                bookkeeper,
                ..
            } = job;
            as_role(*bookkeeper, || order.write(def))
        })
    });
    match written {
        Ok(()) => true,
        Err(failure) => {
            tx.rollback_after_error();
            let undone = group.rolled_back();
            job.order.rolled_back();
            debug1!(
                "etc_batch: job \"{}\": the checkpoint of {undone} chunk(s) could not be written ({}); they run one per transaction",
                job.id(),
                failure.message
            );
            false
        }
    }
}

impl Drainer {
    /// One chunk, in the current transaction: opened (the fence checked, its records
    /// locked and checked), changed, its audit rows written and the chunk closed; unless
    /// the job's pause or `halt` holds it back.
    fn next_chunk(
        &mut self,
        audit: &mut AuditWriter,
        halt: &dyn Halt,
        shared: bool,
    ) -> Result<Round> {
        // the chunk's own duration, for job_chunk_seconds (the metrics)
        let opened = std::time::Instant::now();
        if let Some(fence) = &self.fence {
            self.owner(|| fence.check())?;
        }
        // 1-2. lock, and the status after the lock
        let opening = as_role(self.bookkeeper, || self.order.open(&self.def, halt))?;
        let chunk = match opening {
            Opening::Open(chunk) => chunk,
            Opening::Done => return Ok(Round::Finished),
            Opening::AllCommitted => return self.finish(),
            Opening::AllHeld => return Ok(Round::AllHeld),
            Opening::Paused(paused) => return Ok(Round::Paused(paused)),
            Opening::Stopped(status) => return Ok(Round::Stopped(self.stopped(status)?)),
            Opening::Untrusted(reason) => {
                return self.stop(JobStatus::Corrupt, &reason, Value::Null)
            }
        };
        self.activity.report(&format!(
            "job \"{}\": chunk {} of {}, keys {} to {}",
            self.id(),
            chunk.number,
            chunk.total,
            chunk.first_key,
            chunk.last_key
        ));

        // 3. verify and change. Its error, a permission, a constraint, a cancel, rolls the
        // chunk back with the transaction; it is recorded and raised again, saying so.
        let (changed, refused, kept) = match self.change(&chunk)? {
            Change::Ran(Ran {
                changed,
                refused,
                kept,
            }) => (changed, refused, kept),
            Change::Transient(failure) => {
                return Ok(Round::Transient {
                    number: chunk.number,
                    failure,
                })
            }
            Change::Failed(failure) => {
                return Ok(Round::Failed {
                    number: chunk.number,
                    failure,
                })
            }
        };
        let skipped = if changed.len() == chunk.range.len() {
            Vec::new()
        } else {
            match (self.def.on_drift, self.skipped(&chunk.range, &changed)?) {
                (OnDrift::Skip, Some(skipped)) => skipped,
                // a drift that stops the job, or a frozen list found short (which the
                // check after the rollback reports as corrupt)
                _ => {
                    let known = first_refused(&chunk.range, &changed, &refused);
                    return Ok(Round::Mismatch {
                        range: chunk.range,
                        known,
                    });
                }
            }
        };
        crash::reached(Point::AfterChange);
        // 4-5. audit and checkpoint. The chunk's audit rows and its mark may fail too (a
        // full disk under etc_batch's own tables): the change rolls back with them, and
        // the caller is told so, as for a change that failed.
        let Drainer {
            order,
            def,
            bookkeeper,
            at_work_since,
            ..
        } = self;
        let closed = caught(|| {
            as_role(*bookkeeper, || {
                audit.write(&ChunkAudit {
                    job_id: &def.job_id,
                    chunk: chunk.number,
                    range: chunk.range.clone(),
                    changed: &changed,
                    skipped: &skipped,
                    kept: &kept,
                })?;
                order.close(
                    def,
                    &chunk,
                    *at_work_since,
                    opened.elapsed().as_secs_f64(),
                    shared,
                )
            })
        });
        let last = match closed {
            Ok(last) => last,
            Err(failure) => {
                return Ok(Round::Failed {
                    number: chunk.number,
                    failure,
                })
            }
        };
        // nothing runs between the audit rows and the mark: one point after both
        crash::reached(Point::AfterCheckpoint);
        if chunk.number == 1 {
            crate::events::job(
                self.def.tables.number,
                self.id(),
                "started",
                serde_json::json!({"chunks": chunk.total}),
            );
        }
        if last {
            self.tell_done();
        }
        Ok(Round::Committed(Committed {
            number: chunk.number,
            total: chunk.total,
            items: chunk.range.len() as i64,
            skipped: skipped.len(),
            first_key: chunk.first_key,
            last_key: chunk.last_key,
            last,
        }))
    }

    /// Every chunk of a parallel job is committed: the job is done, once its chunk rows
    /// and its audit agree; otherwise its progress is corrupt.
    fn finish(&self) -> Result<Round> {
        match self.owner(|| self.order.finish(&self.def))? {
            None => {
                self.tell_done();
                Ok(Round::Finished)
            }
            Some(reason) => self.stop(JobStatus::Corrupt, &reason, Value::Null),
        }
    }

    /// After a parallel drain stopped at max_chunks: whether the job is done now (its
    /// chunks all committed, by this drainer or others). A chunk claimed only to look is
    /// let go with the transaction.
    fn finish_if_complete(&mut self, halt: &dyn Halt) -> Result<Round> {
        let opening = as_role(self.bookkeeper, || self.order.open(&self.def, halt))?;
        match opening {
            Opening::AllCommitted => self.finish(),
            Opening::Done => Ok(Round::Finished),
            _ => Ok(Round::AllHeld),
        }
    }
}

/// The item a chunk stops at, when it is one its handler refused: the first item of the
/// chunk left unchanged, if the handler returned NULL for it. An item whose row drifted
/// before it was never handed over; the check after the rollback finds it.
fn first_refused(
    range: &Range<i32>,
    changed: &[(i32, Option<i64>)],
    refused: &[i32],
) -> Option<i32> {
    let first_unchanged = range
        .clone()
        .find(|p| !changed.iter().any(|(c, _)| c == p))?;
    refused
        .contains(&first_unchanged)
        .then_some(first_unchanged)
}

#[cfg(test)]
mod tests {
    use super::first_refused;

    #[test]
    fn a_chunk_stops_at_a_refusal_only_when_nothing_unchanged_comes_before_it() {
        // items 10..15: 10 and 11 changed, 12 refused by the handler
        assert_eq!(
            first_refused(&(10..15), &[(10, None), (11, None)], &[12]),
            Some(12)
        );
        // 12 drifted (never handed over), 13 refused: the check after the rollback
        // names 12
        assert_eq!(
            first_refused(&(10..15), &[(10, None), (11, None)], &[13]),
            None
        );
        // nothing refused: a drift
        assert_eq!(first_refused(&(10..15), &[(10, Some(2))], &[]), None);
        // every item changed
        let all: Vec<(i32, Option<i64>)> = (10..15).map(|p| (p, None)).collect();
        assert_eq!(first_refused(&(10..15), &all, &[]), None);
    }
}
