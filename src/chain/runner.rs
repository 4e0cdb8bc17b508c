//! The commit loop behind `CALL etc_batch.exec_batch_from_id(id, wait)`.
//!
//! One transaction per step, in id order, no recursion:
//!   lock the step's row -> re-read its status -> run / skip / stop ->
//!   record the outcome and the audit row -> find the next step -> COMMIT.
//! The lock is the step's row lock (SELECT ... FOR UPDATE), held until that COMMIT, so a
//! second runner waits on the same step and then reads the status the first committed.

use super::audit::{Attempt, StepAuditWriter};
use super::running;
use super::sql;
use super::step::{action_for, Action, StepKind, StepStatus};
use super::step_lock::StepLock;
use super::timer;
use crate::activity::Activity;
use crate::error::{retry_step_hint, BatchError, OrRaise, Result};
use crate::halt::Halt;
use crate::installed;
use crate::lease::Fence;
use crate::own_rows::{self, Compare, Key, Lock, Tid};
use crate::pauses::Paused;
use crate::progress_notices::{self, Teller};
use crate::query;
use crate::roles::{as_author, as_role, current_user};
use crate::status::AttemptOutcome;
use crate::txn::{subtransaction, Failure, FailureKind, Transactions};
use pgrx::datum::{clock_timestamp as now, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::IntoDatum;
use std::cell::RefCell;
use std::ffi::CStr;
use std::time::{Duration, Instant};

/// What the runner knows once it holds a step's lock.
struct LockedStep {
    status: StepStatus,
    command: String,
    added_by: pg_sys::Oid,
    attempts: i32,
    last_sqlstate: Option<String>,
    last_error: Option<String>,
    last_detail: Option<String>,
    search_path: String,
    /// Who paused the step's batch, if it is paused.
    paused: Option<Paused>,
    /// A plain step, or a single CALL of a procedure that may commit.
    kind: StepKind,
    /// Its statement_timeout, in milliseconds.
    timeout_ms: Option<i32>,
    /// Attempts in all after a transient error.
    max_attempts: i32,
}

query::row_reader! {
    /// A step found done, as STEP_SKIPPED reads it: what its audit row needs, and the
    /// next step of its batch.
    struct Skipped {
        batch: String = String::new(),
        attempts: i32 = 0,
        added_by: pg_sys::Oid = pg_sys::Oid::INVALID,
        next_step: Option<i64>,
    }
}

query::row_reader! {
    /// A failed attempt recorded, as MARK_RETRIED and MARK_FAILED return it: what its
    /// audit row needs.
    struct Marked {
        batch: String = String::new(),
        attempts: i32 = 0,
        added_by: pg_sys::Oid = pg_sys::Oid::INVALID,
    }
}

query::row_reader! {
    /// The backend holding a step's row lock, as STEP_HOLDER reads it.
    struct Holder {
        pid: Option<i32>,
    }
}

/// When a step's command started and finished.
type Span = (TimestampWithTimeZone, TimestampWithTimeZone);

/// What running a step's command came to.
struct Ran {
    /// Where the step's row, locked, lies now.
    at: Tid,
    outcome: std::result::Result<(), Failure>,
    span: Span,
    /// Its deadline had passed when it ended.
    timed_out: bool,
    /// A step that commits: its session lock, held until its outcome is recorded.
    held: Option<StepLock>,
}

/// A step's command that failed, and what the runner knows of it.
struct Failed {
    failure: crate::txn::Failure,
    /// Its deadline had passed: a 57014 is its timeout.
    timed_out: bool,
    ran: (TimestampWithTimeZone, TimestampWithTimeZone),
    /// The attempts of the step that failed before, in this call.
    failed_before: i32,
}

enum Flow {
    /// This runner ran the step; it commits with the step's transaction. The next step.
    Ran(Option<i64>),
    /// An earlier runner had done the step. The next step.
    Skipped(Option<i64>),
    /// Another runner holds the step and the caller asked not to wait.
    Yielded,
    /// The step's batch is paused: the run stops before it.
    Paused,
    /// Run the step again after this long: its attempt failed with a transient error,
    /// recorded as retried, of which the NOTICE tells once that is committed.
    Again(Duration, String),
    /// Another runner was inside the step, and is done with it: read it again.
    Recheck,
    /// The delegate ran the step for this runner (a step that commits, added by another
    /// role): read it again, and go on from its outcome as from this runner's own.
    Delegated,
    /// The step failed, which is recorded: commit that, then raise its error.
    Failed(Raise),
}

/// A step's error, raised again as the step raised it, once its failure is committed.
struct Raise {
    failure: Failure,
    detail: String,
    hint: String,
}

/// How a runner runs a chain, as its caller asks: everything that differs between a
/// client's CALL of exec_batch_from_id and a launch's worker is here, and nowhere else.
pub struct Options<'a> {
    /// Wait for a step another runner holds; false: end the call there.
    pub wait: bool,
    /// The lease the runner works under, checked again in every step's transaction.
    pub fence: Option<Fence>,
    /// What stops the run before a step besides its batch's pause (halt::Never for a
    /// CALL; a worker's launch that no longer runs).
    pub halt: &'a dyn Halt,
    /// Who runs a step that commits, added by another role than the runner's.
    pub delegate: &'a dyn StepDelegate,
}

/// Runs a step that commits, added by another role, for a runner that may not run it
/// itself: a role switch cannot outlast the step's COMMIT (see roles.rs), and a step
/// that switched without the restrictions as_author puts on it could SET ROLE to the
/// runner's role.
pub trait StepDelegate {
    /// Runs step `id` of `batch` as its `author` would, alone (`run_step_alone`), and
    /// returns once it ended; the runner then reads the step again. `tx` is the runner's,
    /// committed once the step's own runner is at work, so that the runner holds nothing
    /// of the step's while it runs.
    fn run_as_author(
        &self,
        tx: &mut dyn Transactions,
        id: i64,
        author: pg_sys::Oid,
        batch: &str,
    ) -> Result<()>;
}

/// Who is running the chain, fixed once at the start of the CALL.
struct Runner<'a> {
    /// Whether the database has any deferrable constraint or trigger, read once per CALL.
    deferrable: bool,
    activity: Activity,
    /// The lease this runner works under, checked again in every step's transaction.
    fence: Option<Fence>,
    batch: String,
    caller: pg_sys::Oid,
    bookkeeper: pg_sys::Oid,
    wait: bool,
    halt: &'a dyn Halt,
    delegate: &'a dyn StepDelegate,
    audit: RefCell<StepAuditWriter>,
}

/// When the runner asked for a step's lock and got it: what every audit row of the step
/// says.
struct Locked {
    run_by: pg_sys::Oid,
    lock_requested: TimestampWithTimeZone,
    lock_acquired: TimestampWithTimeZone,
}

impl Locked {
    /// The audit row of an attempt on a step read as pending, its outcome and times to
    /// be filled in.
    fn attempt<'a>(
        &self,
        id: i64,
        batch: &'a str,
        attempt: i32,
        added_by: pg_sys::Oid,
    ) -> Attempt<'a> {
        Attempt {
            step_id: id,
            batch,
            attempt,
            run_by: self.run_by,
            ran_as: added_by,
            lock_requested: self.lock_requested,
            lock_acquired: self.lock_acquired,
            status_seen: StepStatus::Pending,
            outcome: AttemptOutcome::Done,
            ran: None,
            error: None,
        }
    }
}

/// Runs the chain from step `first` to its end, one transaction per step.
pub fn exec_batch_from_id<T: Transactions>(tx: &mut T, first: i64, options: Options) -> Result<()> {
    run(tx, first, options, false)
}

/// Runs step `id` alone, as a runner of its chain would run it, and no step after it:
/// what a background worker connected as a step's author does for a runner that may
/// not run it itself (a step that commits, added by another role).
pub fn run_step_alone<T: Transactions>(tx: &mut T, id: i64, options: Options) -> Result<()> {
    run(tx, id, options, true)
}

fn run<T: Transactions>(tx: &mut T, first: i64, options: Options, alone: bool) -> Result<()> {
    let Options {
        wait,
        fence,
        halt,
        delegate,
    } = options;
    let bookkeeper = installed::owner()?;
    let batch = as_role(bookkeeper, || {
        query::one::<String>(sql::STEP_BATCH, &[first.into()])
    })?
    .ok_or(BatchError::UnknownStep { id: first })?;
    // a chain's definition and an abandoned run never run; a run's steps know its key
    let run_key = as_role(bookkeeper, || super::runs::runnable(&batch, first))?;
    let _run = super::runs::enter(run_key);
    // a chain that would run itself again is refused before anything runs
    let _running = running::enter(&batch)?;
    as_role(bookkeeper, || running::check_no_cycle(&batch))?;
    let deferrable = query::one::<bool>(sql::ANY_DEFERRABLE, &[])?.unwrap_or(true);
    let runner = Runner {
        deferrable,
        activity: Activity::begin(),
        fence,
        batch,
        caller: current_user(),
        bookkeeper,
        wait,
        halt,
        delegate,
        audit: RefCell::new(as_role(bookkeeper, StepAuditWriter::new)?),
    };

    let mut next = Some(first);
    // the attempts of the step at hand that failed with a transient error
    let mut failed_before = 0;
    let mut teller = Teller::begin();
    let mut told = Told::default();
    // the delegate just ran the step at hand for this runner
    let mut delegated = false;
    while let Some(id) = next {
        let handed = std::mem::take(&mut delegated);
        let flow = tx.item(|tx| runner.run_step(tx, id, failed_before, handed))?;
        next = match flow {
            // the call ends here; so does its transaction, with nothing written
            Flow::Yielded => {
                told.ended = Ended::Yielded(id);
                None
            }
            Flow::Paused => {
                // nothing done: the step's lock goes with this transaction
                tx.commit();
                told.ended = Ended::Paused(id);
                None
            }
            Flow::Ran(next) => {
                tx.commit();
                if crate::txn::last_commit_unconfirmed() {
                    return Err(BatchError::SyncWaitCanceled {
                        what: format!("step {id} of batch \"{}\"", runner.batch),
                        again: format!("etc_batch.exec_batch_from_id({id})"),
                    });
                }
                told.ran += 1;
                if teller.tells_each() {
                    notice!("step {id} of batch \"{}\" committed", runner.batch);
                } else if teller.due(Instant::now()) {
                    told.progress_notice(&runner.batch, id, &teller);
                }
                failed_before = 0;
                next.filter(|_| !alone)
            }
            Flow::Skipped(next) => {
                tx.commit();
                told.skipped += 1;
                if teller.tells_each() {
                    notice!(
                        "step {id} of batch \"{}\" is already done, skipping",
                        runner.batch
                    );
                }
                failed_before = 0;
                next.filter(|_| !alone)
            }
            Flow::Again(backoff, retried) => {
                tx.commit();
                notice!("{retried}");
                failed_before += 1;
                // holding nothing: the retry was committed
                crate::txn::sleep(backoff);
                Some(id)
            }
            Flow::Recheck => Some(id),
            Flow::Delegated => {
                delegated = true;
                Some(id)
            }
            Flow::Failed(Raise {
                failure,
                detail,
                hint,
            }) => {
                tx.commit();
                failure.raise(detail, hint)
            }
        };
    }
    // a step run alone, for a runner that goes on itself, is that runner's to tell of
    if teller.tells_the_end() && !alone {
        told.end_notice(&runner.batch);
    }
    Ok(())
}

/// What one call did, for its progress notices.
#[derive(Default)]
struct Told {
    ran: i64,
    skipped: i64,
    ended: Ended,
}

/// Why a call stopped running steps.
#[derive(Default)]
enum Ended {
    /// Its batch has no step after the last one it ran or skipped. (Steps before the
    /// one it began with may still be pending: the call does not say the batch is done.)
    #[default]
    AtTheEnd,
    /// Another caller holds the step.
    Yielded(i64),
    Paused(i64),
}

impl Told {
    /// Where a call stands, at most once per etc_batch.progress_interval.
    fn progress_notice(&self, batch: &str, id: i64, teller: &Teller) {
        let elapsed = teller.elapsed(Instant::now());
        notice!(
            "batch \"{batch}\": step {id} committed; this call: {} committed, {} skipped as done, {} steps/s",
            progress_notices::counted(self.ran, "step", "steps"),
            self.skipped,
            progress_notices::per_second(self.ran + self.skipped, elapsed),
        );
    }

    /// How the call ended, once, when its steps are not told one by one.
    fn end_notice(&self, batch: &str) {
        let ended = match self.ended {
            Ended::AtTheEnd => "it ran to the batch's last step".to_string(),
            Ended::Yielded(id) => format!("step {id} is another caller's"),
            Ended::Paused(id) => format!("the batch is paused at step {id}"),
        };
        let committed = match self.ran {
            0 => "nothing".to_string(),
            ran => progress_notices::counted(ran, "step", "steps"),
        };
        let skipped = match self.skipped {
            0 => String::new(),
            skipped => format!(
                ", skipped {} already done",
                progress_notices::counted(skipped, "step", "steps")
            ),
        };
        notice!("batch \"{batch}\": this call committed {committed}{skipped}; {ended}");
    }
}

impl Runner<'_> {
    /// Runs one step in the current transaction, and says what the loop is to do with it.
    /// `failed_before`: the attempts of this step that failed with a transient error
    /// earlier in this call; `delegated`: the delegate just ran it for this runner.
    fn run_step(
        &self,
        tx: &mut impl Transactions,
        id: i64,
        failed_before: i32,
        delegated: bool,
    ) -> Result<Flow> {
        self.activity
            .report(&format!("chain \"{}\": step {id}", self.batch));
        if let Some(fence) = &self.fence {
            as_role(self.bookkeeper, || fence.check())?;
        }
        let lock_requested = now();
        let Some((step, at)) = self.lock(id)? else {
            self.report_holder(id)?;
            return Ok(Flow::Yielded);
        };
        // the halt (a worker's launch that no longer runs) stops it as a pause would
        let stopped = match step.paused.clone() {
            Some(paused) => Some(paused),
            None => self.halt.halted()?,
        };
        if let Some(paused) = &stopped {
            paused.notice(
                &format!("batch \"{}\" (at step {id})", self.batch),
                &format!(
                    "etc_batch.resume_batch({})",
                    pgrx::spi::quote_literal(&self.batch)
                ),
            );
            return Ok(Flow::Paused);
        }
        let locked = Locked {
            run_by: self.caller,
            lock_requested,
            lock_acquired: now(),
        };

        match action_for(step.status) {
            // done by the worker this runner handed the step to: the chain goes on from it
            Action::Skip if delegated => {
                let next = self
                    .owner(|| {
                        query::row(sql::STEP_SKIPPED, &[id.into()], |r| {
                            Skipped::read(r).map(|s| s.next_step)
                        })
                    })?
                    .flatten();
                Ok(Flow::Ran(next))
            }
            Action::Skip => {
                let next = self.owner(|| {
                    let Skipped {
                        batch,
                        attempts: attempt,
                        added_by,
                        next_step: next,
                    } = query::row(sql::STEP_SKIPPED, &[id.into()], Skipped::read)?
                        .ok_or(BatchError::UnknownStep { id })?;
                    self.audit.borrow_mut().write(&Attempt {
                        status_seen: StepStatus::Done,
                        outcome: AttemptOutcome::Skipped,
                        ran: None,
                        error: None,
                        ..locked.attempt(id, &batch, attempt, added_by)
                    })?;
                    Ok(next)
                })?;
                Ok(Flow::Skipped(next))
            }
            // failed in the worker this runner handed it to: its error, as it was raised
            // there, is this call's
            Action::Stop if delegated => Ok(Flow::Failed(Raise {
                failure: Failure::recorded(
                    step.last_sqlstate.as_deref().unwrap_or("XX000"),
                    step.last_error.unwrap_or_default(),
                    step.last_detail,
                ),
                detail: format!(
                    "Step {id} of batch \"{}\" failed on attempt {}, run by a worker connected as its author, role \"{}\".",
                    self.batch,
                    step.attempts,
                    crate::pauses::role_name(step.added_by)
                ),
                hint: retry_step_hint(id),
            })),
            Action::Stop => Err(BatchError::StepFailed {
                id,
                batch: self.batch.clone(),
                attempts: step.attempts,
                sqlstate: step.last_sqlstate,
                error: step.last_error,
            }),
            Action::Run => {
                if !crate::roles::exists(step.added_by) {
                    return Err(BatchError::StepOwnerMissing {
                        id,
                        batch: self.batch.clone(),
                    });
                }
                let ran = match step.kind {
                    StepKind::Plain => self.run_plain(&step, at),
                    StepKind::Commits => match self.run_committing(tx, id, &step)? {
                        Ok(ran) => ran,
                        Err(flow) => return Ok(flow),
                    },
                };
                self.record(id, &step, ran, failed_before, &locked)
            }
        }
    }

    /// A plain step: its command run in a subtransaction of the runner's transaction, as
    /// its author, with its timeout.
    fn run_plain(&self, step: &LockedStep, at: Tid) -> Ran {
        let started = now();
        let timeout = step.timeout_ms.map(|ms| format!("{ms}ms"));
        let (outcome, timed_out) = timer::within(step.timeout_ms, || {
            subtransaction(|| {
                crate::raised::capturing(|| {
                    let settings: Vec<(&CStr, &str)> = timeout
                        .as_deref()
                        .map(|t| (c"statement_timeout", t))
                        .into_iter()
                        .collect();
                    crate::settings::with(&settings, || {
                        as_author(step.added_by, &step.search_path, self.caller, &[], || {
                            run_command(&step.command, self.deferrable)
                        })
                    })
                })
            })
        });
        Ran {
            at,
            outcome,
            span: (started, now()),
            timed_out,
            held: None,
        }
    }

    /// A step that commits: its procedure CALLed in the runner's own non-atomic context
    /// (see txn::Transactions::call), not in a subtransaction, under the step's session
    /// lock (step_lock.rs) instead of its row lock, which the first COMMIT would let go.
    /// Its outcome is recorded once the procedure returns, under the row lock taken
    /// again. Err: the step was not run, and what the loop is to do instead.
    fn run_committing(
        &self,
        tx: &mut impl Transactions,
        id: i64,
        step: &LockedStep,
    ) -> Result<std::result::Result<Ran, Flow>> {
        // another role's step is the delegate's to run (see StepDelegate)
        if step.added_by != self.caller {
            tx.commit();
            self.delegate
                .run_as_author(tx, id, step.added_by, &self.batch)?;
            return Ok(Err(Flow::Delegated));
        }
        let Some(step_lock) = StepLock::try_take(id) else {
            // another runner is inside the step's procedure
            if !self.wait {
                self.report_holder(id)?;
                return Ok(Err(Flow::Yielded));
            }
            tx.commit();
            StepLock::wait_for(id);
            return Ok(Err(Flow::Recheck));
        };
        tx.commit();

        let started = now();
        // Settings for the span of the CALL, set for the session and put back after it:
        // a nesting level of settings::with would end at the procedure's first COMMIT.
        let timeout = step.timeout_ms.map(|ms| format!("{ms}ms"));
        let mut settings: Vec<(&CStr, String)> = vec![(c"search_path", step.search_path.clone())];
        if let Some(lock_timeout) = crate::retries::lock_timeout() {
            settings.push((c"lock_timeout", lock_timeout));
        }
        if let Some(timeout) = timeout {
            settings.push((c"statement_timeout", timeout));
        }
        let before: Vec<(&CStr, String)> = settings
            .iter()
            .map(|(name, value)| (*name, crate::settings::set_in_session(name, value)))
            .collect();
        let (outcome, timed_out) = timer::within(step.timeout_ms, || tx.call(&step.command));
        if outcome.is_err() {
            tx.rollback_after_error();
        }
        for (name, value) in &before {
            crate::settings::set_in_session(name, value);
        }
        let finished = now();

        // the step's row again, waiting for a runner that holds it only to find us here
        let (_, at) = self
            .lock_waiting(id)?
            .ok_or(BatchError::UnknownStep { id })?;
        Ok(Ok(Ran {
            at,
            outcome,
            span: (started, finished),
            timed_out,
            held: Some(step_lock),
        }))
    }

    /// What running a step's command came to, recorded: done, or what after_failure
    /// makes of its error; `failed_before`, the attempts that failed before in this call.
    fn record(
        &self,
        id: i64,
        step: &LockedStep,
        ran: Ran,
        failed_before: i32,
        locked: &Locked,
    ) -> Result<Flow> {
        let flow = match ran.outcome {
            Ok(()) => self.record_done(id, ran.at, ran.span, locked),
            Err(failure) => self.after_failure(
                id,
                step,
                Failed {
                    failure,
                    timed_out: ran.timed_out,
                    ran: ran.span,
                    failed_before,
                },
                locked,
            ),
        };
        // a step that commits is another runner's to run again only once this is recorded
        drop(ran.held);
        flow
    }

    /// Marks the step done, with its audit row, in the transaction that ran it.
    fn record_done(
        &self,
        id: i64,
        at: Tid,
        (started, finished): (TimestampWithTimeZone, TimestampWithTimeZone),
        locked: &Locked,
    ) -> Result<Flow> {
        let next = self.owner(|| {
            let (batch, attempt, added_by, next) = mark_done(id, at, started, finished)?;
            self.audit.borrow_mut().write(&Attempt {
                outcome: AttemptOutcome::Done,
                ran: Some((started, finished)),
                ..locked.attempt(id, &batch, attempt, added_by)
            })?;
            if next.is_none() {
                crate::events::chain(id, &batch, "done", serde_json::json!({"last_step": id}));
            }
            Ok(next)
        })?;
        Ok(Flow::Ran(next))
    }

    /// After the step's command failed and its work was rolled back: a cancel of the
    /// whole call leaves the step pending; a transient error with attempts left is
    /// recorded as retried and the step run again after a backoff; otherwise the step is
    /// failed (or timed out), which the loop commits before it raises the error as the
    /// step raised it.
    fn after_failure(
        &self,
        id: i64,
        step: &LockedStep,
        failed: Failed,
        locked: &Locked,
    ) -> Result<Flow> {
        let Failed {
            failure,
            timed_out,
            ran,
            failed_before,
        } = failed;
        let timed_out = timed_out && failure.kind() == FailureKind::Interrupted;
        if !timed_out && failure.kind() == FailureKind::Interrupted {
            // Nothing is recorded: the whole transaction rolls back and the step stays
            // pending for the next run.
            failure.raise(
                format!(
                    "Step {id} of batch \"{}\" was interrupted and is still pending.",
                    self.batch
                ),
                format!("Run \"CALL etc_batch.exec_batch_from_id({id})\" to continue the chain."),
            )
        }
        let attempt_here = failed_before + 1;
        let retry = !timed_out
            && crate::retries::is_transient(failure.packed_code())
            && attempt_here < step.max_attempts;
        let (statement, outcome) = match (retry, timed_out) {
            (true, _) => (sql::MARK_RETRIED, AttemptOutcome::Retried),
            (false, true) => (sql::MARK_FAILED, AttemptOutcome::TimedOut),
            (false, false) => (sql::MARK_FAILED, AttemptOutcome::Failed),
        };
        let sqlstate = failure.sqlstate();
        let attempt = self.owner(|| {
            let Marked {
                batch,
                attempts: attempt,
                added_by,
            } = query::row(
                statement,
                &[
                    id.into(),
                    ran.0.into(),
                    ran.1.into(),
                    failure.message.as_str().into(),
                    sqlstate.as_str().into(),
                    failure.detail.as_deref().into(),
                ],
                Marked::read,
            )?
            .ok_or(BatchError::UnknownStep { id })?;
            self.audit.borrow_mut().write(&Attempt {
                outcome,
                ran: Some(ran),
                error: Some((&failure.message, &sqlstate)),
                ..locked.attempt(id, &batch, attempt, added_by)
            })?;
            Ok(attempt)
        })?;
        if retry {
            let backoff = crate::retries::backoff(attempt_here);
            let retried = format!(
                "step {id} of batch \"{}\" was rolled back: {sqlstate} {}; attempt {attempt_here} of {}, trying again in {} ms",
                self.batch,
                failure.message,
                step.max_attempts,
                backoff.as_millis()
            );
            return Ok(Flow::Again(backoff, retried));
        }
        crate::events::chain(
            id,
            &self.batch,
            "step failed",
            serde_json::json!({"step": id, "attempt": attempt, "sqlstate": sqlstate,
                               "message": failure.message, "timed_out": timed_out}),
        );
        let detail = if timed_out {
            format!(
                "Step {id} of batch \"{}\" timed out after {} ms, its timeout, and failed on attempt {attempt}.",
                self.batch,
                step.timeout_ms.unwrap_or_default()
            )
        } else {
            format!(
                "Step {id} of batch \"{}\" failed on attempt {attempt}.",
                self.batch
            )
        };
        Ok(Flow::Failed(Raise {
            failure,
            detail,
            hint: retry_step_hint(id),
        }))
    }

    fn owner<R>(&self, work: impl FnOnce() -> Result<R>) -> Result<R> {
        as_role(self.bookkeeper, work)
    }

    /// Takes the step's row lock and reads the step as it is now, and where the locked
    /// version lies (for marking it done). `None`: another runner holds it and `wait` is
    /// false.
    fn lock(&self, id: i64) -> Result<Option<(LockedStep, Tid)>> {
        self.lock_step(id, self.wait)
    }

    /// As `lock`, waiting whatever the caller asked.
    fn lock_waiting(&self, id: i64) -> Result<Option<(LockedStep, Tid)>> {
        self.lock_step(id, true)
    }

    fn lock_step(&self, id: i64, wait: bool) -> Result<Option<(LockedStep, Tid)>> {
        let step = as_role(self.bookkeeper, || {
            own_rows::with_table("batch_log", |steps| {
                steps.lock_by_key("id", Key::Int8(id), wait, |row| {
                    Ok(LockedStep {
                        status: StepStatus::parse(
                            &row.get::<String>("status")?.unwrap_or_default(),
                        )?,
                        command: row.get::<String>("command")?.unwrap_or_default(),
                        added_by: row
                            .get::<pg_sys::Oid>("added_by")?
                            .unwrap_or(pg_sys::Oid::INVALID),
                        attempts: row.get::<i32>("attempts")?.unwrap_or_default(),
                        last_sqlstate: row.get::<String>("last_sqlstate")?,
                        last_error: row.get::<String>("last_error")?,
                        last_detail: row.get::<String>("last_detail")?,
                        search_path: row.get::<String>("search_path")?.unwrap_or_default(),
                        paused: Paused::from_row(row.get("paused_at")?, row.get("paused_by")?),
                        kind: StepKind::of(row.get::<bool>("commits")?.unwrap_or(false)),
                        timeout_ms: row
                            .get::<Interval>("timeout")?
                            .map(super::step::timeout_ms)
                            .transpose()?,
                        max_attempts: row.get::<i32>("max_attempts")?.unwrap_or(1),
                    })
                })
            })
        })?;
        match step {
            Lock::Row(step, at) => Ok(Some((step, at))),
            Lock::HeldByAnother => Ok(None),
            Lock::Missing => Err(BatchError::UnknownStep { id }),
        }
    }

    /// Tells the caller who holds a step it declined to wait for.
    fn report_holder(&self, id: i64) -> Result<()> {
        let holder = as_role(self.bookkeeper, || {
            query::row(sql::STEP_HOLDER, &[id.into()], |row| {
                Holder::read(row).map(|h| h.pid)
            })
        })?;
        match holder {
            None => Err(BatchError::UnknownStep { id }),
            Some(Some(pid)) => {
                notice!(
                    "step {id} of batch \"{}\" is being run by process {pid}, not waiting",
                    self.batch
                );
                Ok(())
            }
            Some(None) => {
                notice!(
                    "step {id} of batch \"{}\" is being run by another process, not waiting",
                    self.batch
                );
                Ok(())
            }
        }
    }
}

/// Runs a step's command, in its author's context (see as_author: settings the command
/// changes end with it).
fn run_command(command: &str, deferrable: bool) {
    query::run_text(command).or_raise();
    // Deferred constraints are checked now, inside the step's subtransaction, so that a
    // violation is the step's failure rather than an error of the COMMIT after it. In a
    // database without deferrable constraints or triggers there is nothing to check.
    if deferrable {
        query::run("SET CONSTRAINTS ALL IMMEDIATE", &[]).or_raise();
    }
}

/// Marks the step done: the step's row is locked, and no other transaction can have
/// changed it. Returns its batch, its attempts and who added it, and the next step of its
/// batch.
fn mark_done(
    id: i64,
    at: Tid,
    started: TimestampWithTimeZone,
    finished: TimestampWithTimeZone,
) -> Result<(String, i32, pg_sys::Oid, Option<i64>)> {
    let (batch, attempt, added_by, after) = own_rows::with_table("batch_log", |steps| {
        let (batch, attempt, added_by) = steps
            .update_locked(at, "id", Key::Int8(id), |row| {
                let attempt = row.get::<i32>("attempts")?.unwrap_or_default() + 1;
                let batch = row.get::<String>("batch")?.unwrap_or_default();
                let added_by = row
                    .get::<pg_sys::Oid>("added_by")?
                    .unwrap_or(pg_sys::Oid::INVALID);
                let set = vec![
                    ("status", StepStatus::Done.as_str().into_datum()),
                    ("attempts", attempt.into_datum()),
                    ("started_at", started.into_datum()),
                    ("finished_at", finished.into_datum()),
                ];
                Ok((set, (batch, attempt, added_by)))
            })?
            .ok_or(BatchError::UnknownStep { id })?;
        // The step after it by id belongs to the same batch unless batches interleave.
        let after = steps.first("id", Compare::Greater, Key::Int8(id), |row| {
            Ok((row.get::<i64>("id")?, row.get::<String>("batch")?))
        })?;
        Ok((batch, attempt, added_by, after))
    })?;
    let next = match after {
        None => None,
        Some((next, Some(b))) if b == batch => next,
        Some(_) => query::one::<i64>(sql::NEXT_IN_BATCH, &[batch.as_str().into(), id.into()])?,
    };
    Ok((batch, attempt, added_by, next))
}
