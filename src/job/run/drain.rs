//! The commit loop behind `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! One transaction per chunk, of one statement and a COMMIT:
//!   1. the chunk opened: the next one after the job's checkpoint, or one a parallel
//!      job's drainer claims (order.rs), its records locked and checked as the
//!      extension's owner, without a statement;
//!   2. the chunk's change, the one statement, as the registering role: its items read
//!      from the job's own partition, every one that still matches changed, the changed
//!      rows counted;
//!   3. the chunk's audit rows written as COPY writes them (audit.rs) and the chunk
//!      closed (the checkpoint moved past it, or its chunk row marked), as the owner;
//!      then COMMIT.
//!
//! The change, the audit rows and the mark commit together or not at all. No
//! subtransaction on that path: a chunk in which an item no longer matches is rolled
//! back with its whole transaction, and the conflict is recorded in the next one, after
//! the job's lock is taken again and the chunk is found where it was. Conflicts and
//! corrupt progress stop the job and are raised, never retried.
//!
//! The loop alone ends transactions. A job's methods do one round of work and say what
//! it came to (`Round`); the loop commits it, rolls it back, records a retry, waits, or
//! raises, whichever transactions it runs in (txn::Transactions).

use crate::access::{self, Of, Right};
use crate::activity::Activity;
use crate::error::{BatchError, Result};
use crate::halt::Halt;
use crate::installed;
use crate::job::change::{KindOfChange, Ran};
use crate::job::definition::Definition;
use crate::job::lifecycle;
use crate::job::pace::signals;
use crate::job::pace::{self, Signal, Wait};
use crate::job::rules::approval::{parse_object, OnDrift};
use crate::job::rules::conflict::{self, Expected};
use crate::job::run::audit::{AuditWriter, ChunkAudit};
use crate::job::run::checkpoint;
use crate::job::run::chunk::{OpenChunk, Opening, Recheck};
use crate::job::run::crash::{self, Point};
use crate::job::run::order::Order;
use crate::job::sql;
use crate::job::target::Constants;
use crate::lease::Fence;
use crate::pauses::Paused;
use crate::progress_notices::{self as told, Teller};
use crate::query;
use crate::roles::{as_author, as_role};
use crate::session_lock::{SessionLock, Space};
use crate::status::JobStatus;
use crate::txn::{Failure, FailureKind, Transactions};
use pgrx::datum::{clock_timestamp, DatumWithOid, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::quote_literal;
use serde_json::Value;
use std::ops::Range;

/// What one CALL did, in numbers that do not grow with the job: the chunks and items it
/// committed, the first and last key of them, and how it ended. The keys themselves are
/// in the audit.
#[derive(Debug)]
pub struct Drained {
    pub chunks: i32,
    pub items: i64,
    /// Of them, the items skipped because their rows had drifted (on_drift 'skip').
    pub skipped: i64,
    pub first_key: Option<String>,
    pub last_key: Option<String>,
    pub ended: Ended,
}

/// How a drain ended, as drain_job's status says it (`as_str`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// With the job's status after it: done; pending when it stopped at max_chunks, or
    /// found every chunk left held by other drainers; as the job's row says when
    /// max_chunks 0 kept it from looking.
    Job(JobStatus),
    /// The job is paused (pause_job, a critical signal of its pace), or the drain's halt
    /// stopped it. The job is pending.
    Paused,
    /// The job's windows closed, and the call returned (AtWindowClose::Return), with
    /// the job's status then: pending, or done when other drainers of a parallel job
    /// committed its last chunks meanwhile.
    OutsideWindows(JobStatus),
}

impl Ended {
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Job(status) => status.as_str(),
            Ended::Paused => "paused",
            Ended::OutsideWindows(_) => "outside_windows",
        }
    }

    /// The job's status after the drain.
    pub fn job_status(self) -> JobStatus {
        match self {
            Ended::Job(status) | Ended::OutsideWindows(status) => status,
            Ended::Paused => JobStatus::Pending,
        }
    }
}

/// Chunks of at least this many items have their change planned for their own items
/// and key range, each time (target.rs, change_sql): a few hundred microseconds that
/// buy, where the chunk's items are most of the rows between its first and last key, a
/// join of that range read once instead of one probe of the target's index per item.
/// Smaller chunks share one plan, made once, which probes (`changing`): planning each
/// would cost more than it saves. Measured in bench/run (docs/benchmark.md, "0.4.0: the compact layout").
const PLANNED_FOR_ITS_ITEMS_FROM: i32 = 200;

/// How the change of a job of `chunk_size` is planned.
fn planning(chunk_size: i32) -> query::Planning {
    if chunk_size >= PLANNED_FOR_ITS_ITEMS_FROM {
        query::Planning::ForTheValues
    } else {
        query::Planning::Generic
    }
}

/// The statements of one job, built once per call.
struct Job {
    activity: Activity,
    def: Definition,
    /// What the job does to each item's row.
    kind: KindOfChange,
    /// How the job's chunks are taken: in order, or claimed.
    order: Order,
    /// The lease this drainer works under, checked again in every chunk's transaction.
    fence: Option<Fence>,
    change_sql: String,
    mismatch_sql: String,
    item_sql: String,
    items_in_range_sql: String,
    row_sql: String,
    /// The values the change sets and expects, as it binds them after $1-$3.
    constants: Vec<query::Opaque>,
    /// The change binds the chunk's first and last key after the constants, to bound
    /// its scan of the target (JobKey::bounds_chunks).
    bounds: bool,
    /// How the change is planned (see `planning`).
    planning: query::Planning,
    /// The job's SQL prints rows as text (a digest), the same in every session.
    stable_output: bool,
    /// Since when this drainer has been at work on the job, for its next chunk: the
    /// call's start, then each of its commits (job.seconds_at_work).
    at_work_since: TimestampWithTimeZone,
    bookkeeper: pg_sys::Oid,
    signals: SignalsRead,
    /// Who called drain_job: the job's SQL runs restricted when it is not the registrant.
    caller: pg_sys::Oid,
}

/// What a drain does when its job's windows close: a CALL returns, status
/// outside_windows; a launched worker waits, holding nothing, until one opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtWindowClose {
    Return,
    Wait,
}

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

/// What the pace let the next chunk do.
enum BeforeChunk {
    Go,
    /// A critical signal paused the job (who paused it, as its pause row says).
    Paused(Option<Paused>),
    OutsideWindows {
        opens_in: u32,
    },
}

/// When a drainer last read its job's signals, and the pace they were read for: read
/// again after etc_batch.signal_interval, or at once when the pace changed.
#[derive(Default)]
struct SignalsRead {
    read_at: Option<std::time::Instant>,
    pace: pace::Pace,
}

/// What one round of the loop came to, for the loop to end its transaction.
enum Round {
    /// A chunk's change, audit rows and mark are written: commit, then tell the caller.
    Committed {
        number: i32,
        total: i32,
        items: i64,
        /// Of those, the items left unchanged for their rows had drifted (on_drift skip).
        skipped: usize,
        first_key: String,
        last_key: String,
        /// The job is done with it.
        last: bool,
    },
    /// Nothing left to do: the job is done. Commit (what the round wrote says so).
    Finished,
    /// Every chunk of a parallel job not yet committed is held by other drainers: this
    /// one is not needed, and does not wait. Commit.
    AllHeld,
    /// The job is paused: commit, and the call stops here.
    Paused(Paused),
    /// Fewer rows matched than the chunk has items: roll back, then see why
    /// (`after_mismatch`) in the next transaction.
    Mismatch {
        range: Range<i32>,
        /// The first item that did not match, where it is already known (a handler that
        /// returned NULL).
        known: Option<i32>,
    },
    /// The chunk's change failed with a transient error (retries.rs); its transaction is
    /// broken: roll it back, record the retry, wait, and try again.
    Transient { number: i32, failure: Failure },
    /// The job is stopped: commit what the round recorded of it (conflict, corrupt), then
    /// raise the error.
    Stopped(BatchError),
    /// The chunk's change failed for another reason (a constraint, a trigger, a
    /// permission, a timeout); its transaction is broken: roll it back, record the
    /// failure where the job's views show it, and raise the error, the job still pending.
    Failed { number: i32, failure: Failure },
}

/// What the chunk's change came to.
enum Change {
    Ran(Ran),
    /// The change failed with a transient error, caught: nothing may run in the
    /// transaction before it is rolled back.
    Transient(Failure),
    /// The change failed for another reason, caught: likewise.
    Failed(Failure),
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
    access::require(Of::Job(job_id), Right::Act("drain"))?;
    let mut job = Job::new(job_id, fence)?;
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
    while !finished
        && !all_held
        && matches!(drained.ended, Ended::Job(_))
        && max_chunks.is_none_or(|max| drained.chunks < max)
    {
        // the pace: wait, holding nothing, until the next chunk may go
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
        let round = tx.item(|_| job.next_chunk(&mut audit, halt))?;
        if !matches!(round, Round::Transient { .. }) {
            failed_attempts = 0;
        }
        match round {
            Round::Committed {
                number,
                total,
                items,
                skipped,
                first_key,
                last_key,
                last,
            } => {
                tx.commit();
                if crate::txn::last_commit_unconfirmed() {
                    return Err(BatchError::SyncWaitCanceled {
                        what: format!("chunk {number} of job \"{job_id}\""),
                        again: format!("etc_batch.drain_job({})", quote_literal(job_id)),
                    });
                }
                crash::reached(Point::AfterCommit);
                job.at_work_since = clock_timestamp();
                // only now: a client told of a chunk finds it committed, whatever happens
                // to the server next
                if teller.tells_each() {
                    committed_notice(number, total, items, skipped, &first_key, &last_key);
                }
                drained.chunks += 1;
                drained.items += items;
                drained.skipped += skipped as i64;
                drained.first_key.get_or_insert(first_key);
                drained.last_key = Some(last_key);
                finished = last;
                if !finished && teller.due(std::time::Instant::now()) {
                    drained.progress_notice(job_id, number, total, &teller);
                }
            }
            Round::Finished => {
                tx.commit();
                finished = true;
            }
            Round::AllHeld => {
                // a chunk held only to look is let go
                tx.commit();
                all_held = true;
            }
            Round::Paused(paused) => {
                // nothing done: the job's lock goes with this transaction
                tx.commit();
                paused.notice(
                    &format!("job \"{job_id}\""),
                    &format!("etc_batch.resume_job({})", quote_literal(job_id)),
                );
                drained.ended = Ended::Paused;
            }
            Round::Mismatch { range, known } => {
                tx.rollback();
                let stopped = tx.item(|_| job.after_mismatch(&range, known))?;
                tx.commit();
                if let Some(error) = stopped {
                    return Err(error);
                }
            }
            Round::Transient { number, failure } => {
                tx.rollback_after_error();
                failed_attempts += 1;
                job.retry(tx, number, failure, failed_attempts)?;
            }
            Round::Stopped(error) => {
                tx.commit();
                return Err(error);
            }
            Round::Failed { number, failure } => {
                tx.rollback_after_error();
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

impl Drained {
    /// Where a call stands, at most once per etc_batch.progress_interval.
    fn progress_notice(&self, job_id: &str, number: i32, total: i32, teller: &Teller) {
        let elapsed = teller.elapsed(std::time::Instant::now());
        let to_go = told::time_to_go(self.chunks.into(), (total - number).into(), elapsed)
            .map(|left| format!(", about {} to go", told::human(left)))
            .unwrap_or_default();
        notice!(
            "job \"{job_id}\": chunk {number} of {total} committed; this call: {}, {}, {} items/s{to_go}",
            told::counted(self.chunks.into(), "chunk", "chunks"),
            told::counted(self.items, "item", "items"),
            told::per_second(self.items, elapsed),
        );
    }

    /// How the call ended, once, when its chunks are not told one by one.
    fn end_notice(&self, job_id: &str) {
        let done = match (&self.first_key, &self.last_key) {
            (Some(first), Some(last)) if self.chunks > 0 => format!(
                "committed {}, {}, keys {first} to {last}{}",
                told::counted(self.chunks.into(), "chunk", "chunks"),
                told::counted(self.items, "item", "items"),
                if self.skipped == 0 {
                    String::new()
                } else {
                    format!(
                        ", {} of them skipped (their rows had drifted)",
                        self.skipped
                    )
                },
            ),
            _ => "committed nothing".to_string(),
        };
        // the job's status, but that a paused job is told as paused
        let status = match self.ended {
            paused @ Ended::Paused => paused.as_str(),
            ended => ended.job_status().as_str(),
        };
        notice!("job \"{job_id}\": this call {done}; the job is {status}");
    }
}

/// The NOTICE of a committed chunk, at etc_batch.progress_interval 0.
fn committed_notice(
    number: i32,
    total: i32,
    items: i64,
    skipped: usize,
    first_key: &str,
    last_key: &str,
) {
    notice!(
        "chunk {number} of {total} committed: {items} item{}, keys {first_key} to {last_key}{}",
        if items == 1 { "" } else { "s" },
        if skipped == 0 {
            String::new()
        } else {
            format!(", {skipped} of them skipped (their rows had drifted)")
        },
    );
}

impl Job {
    fn new(job_id: &str, fence: Option<Fence>) -> Result<Job> {
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
        let constants = Constants::new(def.set_values.as_ref(), &def.expect)
            .with_item_values(&def.set_from_items);
        let bounds = target.bounds_chunks();
        let kind = KindOfChange::of(&def);
        let change_sql = kind.chunk_sql(&def, &target, &constants, bounds);
        Ok(Job {
            activity: Activity::begin(),
            kind,
            change_sql,
            mismatch_sql: target.mismatches_sql(
                items,
                def.chunk_size,
                &def.guard_columns,
                &constants,
            ),
            item_sql: def.tables.sql(sql::ITEM),
            items_in_range_sql: def.tables.sql(sql::ITEMS_IN_RANGE),
            row_sql: target.current_row_sql(),
            constants: constants.args(&target)?,
            bounds,
            planning: planning(def.chunk_size),
            stable_output: target.shape.reads_rows_as_text(),
            at_work_since: clock_timestamp(),
            order: Order::of(&def),
            def,
            fence,
            bookkeeper,
            signals: SignalsRead::default(),
            caller: crate::roles::current_user(),
        })
    }

    /// Runs SQL of the job's author (the rows it reads), in the author's context
    /// (roles::as_author).
    fn as_author<R>(&self, work: impl FnOnce() -> R) -> R {
        let extra = if self.stable_output {
            crate::settings::STABLE_OUTPUT
        } else {
            &[]
        };
        as_author(
            self.def.registered_by,
            &self.def.search_path,
            self.caller,
            extra,
            work,
        )
    }

    /// As `as_author`, for the chunk's change: a guarded UPDATE planned as a chunk is
    /// best run, one probe of the target's key per item (or one range of it), whatever
    /// the target's statistics say: a table never analyzed can look small enough to scan
    /// whole, once per item. A handler's own statements are planned as it plans them.
    fn changing<R>(&self, work: impl FnOnce() -> R) -> R {
        let mut extra = Vec::with_capacity(3 + crate::settings::STABLE_OUTPUT.len());
        if self.kind.is_guarded_update() {
            // the change reads the target by its key's index, whatever its statistics
            // say; and a plan shared by every chunk, which cannot know how a chunk's
            // items lie in their key range, probes the index once per item, which costs
            // the same however scattered they are (see PLANNED_FOR_ITS_ITEMS_FROM)
            extra.push((c"enable_seqscan", "off"));
            if self.planning == query::Planning::Generic {
                extra.push((c"enable_hashjoin", "off"));
                extra.push((c"enable_mergejoin", "off"));
            }
        }
        if self.stable_output {
            extra.extend_from_slice(crate::settings::STABLE_OUTPUT);
        }
        as_author(
            self.def.registered_by,
            &self.def.search_path,
            self.caller,
            &extra,
            work,
        )
    }

    fn owner<R>(&self, work: impl FnOnce() -> Result<R>) -> Result<R> {
        as_role(self.bookkeeper, work)
    }

    fn id(&self) -> &str {
        &self.def.job_id
    }

    /// The job's status as its row says now.
    fn status(&self) -> Result<JobStatus> {
        let status = self
            .owner(|| query::one::<String>(sql::JOB_STATUS, &[self.id().into()]))?
            .ok_or_else(|| BatchError::UnknownJob {
                job: self.id().to_string(),
            })?;
        JobStatus::parse(&status)
    }

    /// Waits until the job's pace (pace.rs) lets its next chunk go: while a signal holds
    /// it back (saying so once per kind of wait), then for its slot of the rate. Every
    /// wait begins with a COMMIT, so that it holds nothing. A critical signal pauses the
    /// job instead; outside its windows, a call returns at once (`at_window_close`). The
    /// job's pause, or `halt`, ends a wait.
    fn wait_for_pace(
        &mut self,
        tx: &mut impl Transactions,
        at_window_close: AtWindowClose,
        halt: &dyn Halt,
    ) -> Result<BeforeChunk> {
        let mut told: Option<Wait> = None;
        let mut since_told = std::time::Instant::now();
        loop {
            let now = std::time::Instant::now();
            let waiting = told.is_some();
            let (pace, due, signal, slot) = tx.item(|_| {
                self.owner(|| {
                    let pace = pace::of(self.id())?;
                    let due = pace.has_signals()
                        && (waiting
                            || pace != self.signals.pace
                            || self
                                .signals
                                .read_at
                                .is_none_or(|at| now.duration_since(at) >= signals::interval()));
                    let signal = if due {
                        pace::read_signals(&pace, self.def.target, |text| {
                            self.as_author(|| signals::ask(text))
                        })?
                    } else {
                        Signal::Go
                    };
                    if let Signal::Pause(reason) = &signal {
                        if let Some(waited) = &told {
                            self.end_wait(waited, since_told.elapsed())?;
                        }
                        pace::pause_for(&self.def, self.bookkeeper, reason)?;
                        let paused = crate::pauses::of_job(self.id())?;
                        return Ok((pace, due, Signal::Go, Err(paused)));
                    }
                    let slot = match signal {
                        Signal::Go => pace::take_slot(self.id(), &pace, self.def.chunk_size)?,
                        _ => None,
                    };
                    Ok((pace, due, signal, Ok(slot)))
                })
            })?;
            if due {
                self.signals.read_at = Some(now);
                self.signals.pace = pace.clone();
            }
            let slot = match slot {
                Ok(slot) => slot,
                Err(paused) => {
                    tx.commit();
                    if let Some(paused) = &paused {
                        log!(
                            "etc_batch paused job \"{}\": {}",
                            self.id(),
                            paused.reason.as_deref().unwrap_or("paused")
                        );
                    }
                    return Ok(BeforeChunk::Paused(paused));
                }
            };
            // a slot taken locks the pace's row: let it go before the chunk, so that
            // other drainers take theirs meanwhile
            if !matches!(signal, Signal::Go) || pace.rows_per_second.is_some() {
                tx.commit();
            }
            match signal {
                Signal::Pause(_) => unreachable!("a pause is returned above"),
                Signal::Go => {
                    if let Some(waited) = told.take() {
                        // the wait is over: said in a transaction of its own
                        tx.item(|_| self.end_wait(&waited, since_told.elapsed()))?;
                        tx.commit();
                    }
                    if let Some(delay) = slot {
                        self.activity.report(&format!(
                            "job \"{}\": {}",
                            self.id(),
                            Wait::Slot(delay).reason()
                        ));
                        crate::txn::sleep(delay);
                    }
                    return Ok(BeforeChunk::Go);
                }
                Signal::Wait(Wait::OutsideWindows { opens_in })
                    if at_window_close == AtWindowClose::Return =>
                {
                    return Ok(BeforeChunk::OutsideWindows { opens_in });
                }
                Signal::Wait(wait) => {
                    if !told.as_ref().is_some_and(|t| t.same_kind(&wait)) {
                        notice!("job \"{}\" waits: {}", self.id(), wait.reason());
                        tx.item(|_| {
                            // a wait of another kind before it is over
                            if let Some(waited) = &told {
                                self.end_wait(waited, since_told.elapsed())?;
                            }
                            crate::events::job(
                                self.def.tables.number,
                                self.id(),
                                "waiting",
                                serde_json::json!({"for": wait.kind(), "reason": wait.reason()}),
                            );
                            Ok::<_, BatchError>(())
                        })?;
                        tx.commit();
                        told = Some(wait.clone());
                        since_told = std::time::Instant::now();
                    }
                    // a pause_job, or the halt (a stop_launch of a worker's launch), ends
                    // the wait as it would before a chunk: a window may be hours away
                    let held = tx.item(|_| {
                        let held =
                            self.owner(|| crate::job::run::chunk::held_back(self.id(), halt))?;
                        if held.is_some() {
                            self.end_wait(&wait, since_told.elapsed())?;
                        }
                        Ok::<_, BatchError>(held)
                    })?;
                    // the wait holds nothing, not even the snapshot of that look
                    tx.commit();
                    if let Some(paused) = held {
                        return Ok(BeforeChunk::Paused(Some(paused)));
                    }
                    self.activity
                        .report(&format!("job \"{}\": {}", self.id(), wait.activity()));
                    let pause = match wait {
                        // a worker outside its windows sleeps until they open, looking
                        // again each interval (the pace may change meanwhile)
                        Wait::OutsideWindows { opens_in } => signals::recheck().min(
                            std::time::Duration::from_secs(u64::from(opens_in.max(1)) * 60),
                        ),
                        _ => signals::recheck(),
                    };
                    crate::txn::sleep(pause);
                }
            }
        }
    }

    /// A wait that is over, after `lasted`: counted in job_wait (the metrics) and told to
    /// listeners, in the current transaction. Run as anyone: it switches to the owner.
    fn end_wait(&self, waited: &Wait, lasted: std::time::Duration) -> Result<()> {
        let seconds = lasted.as_secs_f64();
        self.owner(|| {
            query::run(
                sql::RECORD_WAIT,
                &[self.id().into(), waited.kind().into(), seconds.into()],
            )
        })?;
        crate::events::job(
            self.def.tables.number,
            self.id(),
            "waited",
            serde_json::json!({"for": waited.kind(), "seconds": seconds}),
        );
        Ok(())
    }

    /// After attempt `attempt` of chunk `number` failed with a transient error and was
    /// rolled back: the retry recorded (job_retry, and a NOTICE) and committed, then the
    /// backoff slept, holding nothing; or, when the attempts are used up, the error
    /// raised, the job still pending.
    fn retry(
        &self,
        tx: &mut impl Transactions,
        number: i32,
        failure: Failure,
        attempt: i32,
    ) -> Result<()> {
        let attempts = crate::retries::attempts();
        let sqlstate = failure.sqlstate();
        if attempt >= attempts {
            tx.item(|_| self.record_failure(number, &failure))?;
            tx.commit();
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
        tx.item(|_| {
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
            })
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

    /// One chunk, in the current transaction: opened (the fence checked, its records
    /// locked and checked), changed, its audit rows written and the chunk closed; unless
    /// the job's pause or `halt` holds it back.
    fn next_chunk(&mut self, audit: &mut AuditWriter, halt: &dyn Halt) -> Result<Round> {
        // the chunk's own duration, for job_chunk_seconds (the metrics)
        let opened = std::time::Instant::now();
        if let Some(fence) = &self.fence {
            self.owner(|| fence.check())?;
        }
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

        // The change. Its error, a permission, a constraint, a cancel, rolls the chunk
        // back with the transaction; it is recorded and raised again, saying so.
        let (changed, refused) = match self.change(&chunk)? {
            Change::Ran(Ran { changed, refused }) => (changed, refused),
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
                    return Ok(Round::Mismatch {
                        range: chunk.range,
                        known: refused.first().copied(),
                    })
                }
            }
        };
        crash::reached(Point::AfterChange);
        // The chunk's audit rows and its mark may fail too (a full disk under etc_batch's
        // own tables): the change rolls back with them, and the caller is told so, as for
        // a change that failed.
        let closed = caught(|| {
            self.owner(|| {
                audit.write(&ChunkAudit {
                    job_id: self.id(),
                    chunk: chunk.number,
                    range: chunk.range.clone(),
                    changed: &changed,
                    skipped: &skipped,
                })?;
                self.order.close(
                    &self.def,
                    &chunk,
                    self.at_work_since,
                    opened.elapsed().as_secs_f64(),
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
        Ok(Round::Committed {
            number: chunk.number,
            total: chunk.total,
            items: chunk.range.len() as i64,
            skipped: skipped.len(),
            first_key: chunk.first_key,
            last_key: chunk.last_key,
            last,
        })
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

    /// After a chunk was rolled back because fewer rows matched than it has items, in
    /// the next transaction: if nothing moved meanwhile, what stopped it is recorded and
    /// returned as the error to raise once that is committed; if another drainer
    /// committed the chunk, this one goes on; if another stopped the job, its record
    /// stands.
    fn after_mismatch(&self, range: &Range<i32>, known: Option<i32>) -> Result<Option<BatchError>> {
        if let Some(fence) = &self.fence {
            self.owner(|| fence.check())?;
        }
        let round = match self.owner(|| self.order.recheck(&self.def, range))? {
            Recheck::Record => self.record_mismatch(range, known)?,
            Recheck::Again => return Ok(None),
            Recheck::Stopped(status) => Round::Stopped(self.stopped(status)?),
        };
        match round {
            Round::Stopped(error) => Ok(Some(error)),
            _ => Ok(None),
        }
    }

    /// The business change of one chunk, as the registering role. Its error is caught:
    /// the transaction is broken then, and the loop rolls it back.
    fn change(&self, chunk: &OpenChunk) -> Result<Change> {
        let range = &chunk.range;
        let mut args: Vec<DatumWithOid> = vec![
            range.start.into(),
            range.end.into(),
            self.def.tenant_value().into(),
        ];
        if self.kind.is_guarded_update() {
            args.extend(self.constants.iter().map(query::Opaque::arg));
            if self.bounds {
                args.push(chunk.first_key.as_str().into());
                args.push(chunk.last_key.as_str().into());
            }
            args.extend(chunk.items.args());
        }
        match caught(|| {
            self.changing(|| {
                self.kind.run(
                    &self.def,
                    &self.change_sql,
                    &args,
                    self.planning,
                    range.len(),
                )
            })
        }) {
            Ok(ran) => Ok(Change::Ran(ran)),
            Err(mut failure) => {
                failure.raised = failure
                    .raised
                    .map(|r| r.without_statement(&self.change_sql));
                Ok(if crate::retries::is_transient(failure.packed_code()) {
                    Change::Transient(failure)
                } else {
                    Change::Failed(failure)
                })
            }
        }
    }

    /// The items of the chunk `range` that its change left unchanged, each with the row
    /// it names now (JSON null: gone), for a job that skips them; None when the frozen
    /// list does not hold every position of the chunk.
    fn skipped(
        &self,
        range: &Range<i32>,
        changed: &[(i32, Option<i64>)],
    ) -> Result<Option<Vec<(i32, String)>>> {
        if self.def.on_drift == OnDrift::Stop || !self.items_all_there(range)? {
            return Ok(None);
        }
        let mut done: Vec<i32> = changed.iter().map(|(p, _)| *p).collect();
        done.sort_unstable();
        let mut skipped = Vec::new();
        for position in range.clone().filter(|p| done.binary_search(p).is_err()) {
            let (key, ..) = self.item(position)?;
            let row = self.as_author(|| {
                query::one::<String>(&self.row_sql, &[self.def.tenant_value().into(), key.into()])
            })?;
            skipped.push((position, row.unwrap_or_else(|| "null".into())));
        }
        Ok(Some(skipped))
    }

    /// Whether the frozen list holds every position of the chunk `range`.
    fn items_all_there(&self, range: &Range<i32>) -> Result<bool> {
        Ok(self.items_found(range)? == range.len() as i32)
    }

    /// How many approved items the frozen list holds at the positions of `range`.
    fn items_found(&self, range: &Range<i32>) -> Result<i32> {
        let found = self.owner(|| {
            query::by_index(|| {
                query::one::<i32>(
                    &self.items_in_range_sql,
                    &[range.start.into(), range.end.into()],
                )
            })
        })?;
        Ok(found.unwrap_or(0))
    }

    /// The approved item at `position`: its key, revision and guards.
    fn item(&self, position: i32) -> Result<(String, i64, String)> {
        self.owner(|| {
            query::row(&self.item_sql, &[position.into()], |r| {
                Ok((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<i64>(2)?.unwrap_or_default(),
                    r.get::<String>(3)?.unwrap_or_default(),
                ))
            })
        })?
        .ok_or_else(|| BatchError::Internal(format!("no approved item at position {position}")))
    }

    /// Records that chunk `number` failed with `failure`, in the transaction after it was
    /// rolled back: job_progress, job_summary and the doctor show it.
    fn record_failure(&self, number: i32, failure: &Failure) -> Result<()> {
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
    fn tell_done(&self) {
        crate::events::job(
            self.def.tables.number,
            self.id(),
            "done",
            serde_json::json!({"items": self.def.item_count}),
        );
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

    /// Records why a chunk changed fewer rows than it has items, in the transaction after
    /// it was rolled back: the frozen list is short (corrupt), or the first item that no
    /// longer matches its row (`known`, or found now) is a conflict.
    fn record_mismatch(&self, range: &Range<i32>, known: Option<i32>) -> Result<Round> {
        let found = self.items_found(range)?;
        if found != range.len() as i32 {
            let reason = checkpoint::short_list(range, found as usize);
            return self.stop(JobStatus::Corrupt, &reason, Value::Null);
        }
        let position = match known {
            Some(position) => Some(position),
            None => self.first_mismatch(range)?,
        };
        self.conflict(position, range, known.is_some())
    }

    /// The first item of the chunk whose row no longer matches it.
    fn first_mismatch(&self, range: &Range<i32>) -> Result<Option<i32>> {
        let mut args: Vec<DatumWithOid> = vec![
            range.start.into(),
            range.end.into(),
            self.def.tenant_value().into(),
        ];
        args.extend(self.constants.iter().map(query::Opaque::arg));
        self.as_author(|| query::one::<i32>(&self.mismatch_sql, &args))
    }

    /// Records and returns the conflict of the item at `position` (`refused`: the one its
    /// handler returned NULL for), or of the chunk when every item matches again by now.
    fn conflict(&self, position: Option<i32>, range: &Range<i32>, refused: bool) -> Result<Round> {
        let Some(position) = position else {
            let detail = format!(
                "Positions {} to {} did not all match while their chunk ran, and match again now: they changed concurrently.",
                range.start,
                range.end - 1
            );
            return self.stop(JobStatus::Conflict, &detail, Value::Null);
        };
        let (key, revision, guards) = self.item(position)?;
        let row = self.as_author(|| {
            query::one::<String>(
                &self.row_sql,
                &[self.def.tenant_value().into(), key.as_str().into()],
            )
        })?;
        // what an item carries to set (a revert's set_from_items) is no guard
        let mut guards = parse_object(&guards);
        guards.retain(|column, _| !self.def.set_from_items.contains(column));
        let expected = Expected {
            key: &key,
            position,
            item_count: self.def.item_count,
            tenant: self.def.tenant_value(),
            guard: &self.def.guard,
            revision,
            guards: &guards,
            expect: &self.def.expect,
            refused_by: self.def.handler.as_deref().filter(|_| refused),
        };
        // A row serde_json cannot read (a jsonb column nested deeper than it reads) is
        // reported as its text, so that the conflict is still recorded.
        let row = row.map(|text| serde_json::from_str(&text).unwrap_or(Value::String(text)));
        let (detail, problem) = conflict::describe(&expected, row.as_ref());
        self.stop(JobStatus::Conflict, &detail, problem)
    }

    /// Puts the job into `status` with `reason`, for the loop to commit, with the error to
    /// raise then. If another drainer already stopped the job, its record stands.
    fn stop(&self, status: JobStatus, reason: &str, problem: Value) -> Result<Round> {
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
    fn stopped(&self, status: JobStatus) -> Result<BatchError> {
        lifecycle::refusal(self.id(), status)
    }
}

/// Runs `work`, catching the error it raises, PostgreSQL's or etc_batch's own, as the
/// Failure of the chunk: the transaction is broken then, and the loop rolls it back.
fn caught<T>(work: impl FnOnce() -> Result<T>) -> std::result::Result<T, Failure> {
    pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        crate::raised::capturing(|| work().map_err(Failure::from))
    }))
    .catch_others(|caught| Err(Failure::from(caught)))
    .execute()
}
