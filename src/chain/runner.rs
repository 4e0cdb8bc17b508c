//! The commit loop behind `CALL etc_batch.exec_batch_from_id(id, wait)`.
//!
//! One transaction per step, in id order, no recursion:
//!   lock the step's row -> re-read its status -> run / skip / stop ->
//!   record the outcome and the audit row -> find the next step -> COMMIT.
//! The lock is the step's row lock (SELECT ... FOR UPDATE), held until that COMMIT, so a
//! second runner waits on the same step and then reads the status the first committed.

use super::audit::{Attempt, StepAuditWriter};
use super::sql;
use super::step::{action_for, Action, StepStatus};
use crate::activity::Activity;
use crate::error::{retry_step_hint, BatchError, OrRaise, Result};
use crate::installed;
use crate::lease::Fence;
use crate::pauses::Paused;
use crate::query;
use crate::roles::{as_author, as_role, current_user};
use crate::rows::{self, Key, Lock, Tid};
use crate::txn::{subtransaction, FailureKind, TxnLoop};
use pgrx::datum::{clock_timestamp as now, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::IntoDatum;
use std::cell::RefCell;

/// What the runner knows once it holds a step's lock.
struct LockedStep {
    status: StepStatus,
    command: String,
    added_by: pg_sys::Oid,
    attempts: i32,
    last_sqlstate: Option<String>,
    last_error: Option<String>,
    search_path: String,
    /// Who paused the step's batch, if it is paused.
    paused: Option<Paused>,
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
}

/// Who is running the chain, fixed once at the start of the CALL.
struct Runner {
    /// Whether the database has any deferrable constraint or trigger, read once per CALL.
    deferrable: bool,
    activity: Activity,
    /// The lease this runner works under, checked again in every step's transaction.
    fence: Option<Fence>,
    batch: String,
    caller: pg_sys::Oid,
    bookkeeper: pg_sys::Oid,
    wait: bool,
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
            status_seen: StepStatus::Pending.as_str(),
            outcome: "done",
            ran: None,
            error: None,
        }
    }
}

pub fn exec_batch_from_id(
    tx: &mut TxnLoop,
    first: i64,
    wait: bool,
    fence: Option<Fence>,
) -> Result<()> {
    let bookkeeper = installed::owner()?;
    let batch = as_role(bookkeeper, || {
        query::one::<String>(sql::STEP_BATCH, &[first.into()])
    })?
    .ok_or(BatchError::UnknownStep { id: first })?;
    let deferrable = query::one::<bool>(sql::ANY_DEFERRABLE, &[])?.unwrap_or(true);
    let runner = Runner {
        deferrable,
        activity: Activity::begin(),
        fence,
        batch,
        caller: current_user(),
        bookkeeper,
        wait,
        audit: RefCell::new(as_role(bookkeeper, StepAuditWriter::new)?),
    };

    let mut next = Some(first);
    while let Some(id) = next {
        next = tx.item(|tx| -> Result<Option<i64>> {
            let (ran, next) = match runner.run_step(tx, id)? {
                Flow::Yielded => return Ok(None),
                Flow::Paused => {
                    // nothing done: the step's lock goes with this transaction
                    tx.commit();
                    return Ok(None);
                }
                Flow::Ran(next) => (true, next),
                Flow::Skipped(next) => (false, next),
            };
            tx.commit();
            // the message is not even put together when nobody would receive it
            if ran && crate::activity::notices_are_sent() {
                notice!("step {id} of batch \"{}\" committed", runner.batch);
            }
            Ok(next)
        })?;
    }
    Ok(())
}

impl Runner {
    /// Runs one step in the current transaction. Returns before the COMMIT, except for a
    /// failed step, whose failure is committed here and then raised.
    fn run_step(&self, tx: &mut TxnLoop, id: i64) -> Result<Flow> {
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
        if let Some(paused) = &step.paused {
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
            Action::Skip => {
                let next = self.owner(|| {
                    let (batch, attempt, added_by, next) =
                        query::row(sql::STEP_SKIPPED, &[id.into()], |r| {
                            Ok((
                                r.get::<String>(1)?.unwrap_or_default(),
                                r.get::<i32>(2)?.unwrap_or_default(),
                                r.get::<pg_sys::Oid>(3)?.unwrap_or(pg_sys::Oid::INVALID),
                                r.get::<i64>(4)?,
                            ))
                        })?
                        .ok_or(BatchError::UnknownStep { id })?;
                    self.audit.borrow_mut().write(&Attempt {
                        status_seen: StepStatus::Done.as_str(),
                        outcome: "skipped",
                        ran: None,
                        error: None,
                        ..locked.attempt(id, &batch, attempt, added_by)
                    })?;
                    Ok(next)
                })?;
                notice!(
                    "step {id} of batch \"{}\" is already done, skipping",
                    self.batch
                );
                Ok(Flow::Skipped(next))
            }
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
                let started = now();
                let outcome = subtransaction(|| {
                    crate::raised::capturing(|| {
                        as_author(step.added_by, &step.search_path, self.caller, || {
                            run_command(&step.command, self.deferrable)
                        })
                    })
                });
                let finished = now();
                match outcome {
                    Ok(()) => {
                        let next = self.owner(|| {
                            let (batch, attempt, added_by, next) =
                                mark_done(id, at, started, finished)?;
                            self.audit.borrow_mut().write(&Attempt {
                                outcome: "done",
                                ran: Some((started, finished)),
                                ..locked.attempt(id, &batch, attempt, added_by)
                            })?;
                            Ok(next)
                        })?;
                        Ok(Flow::Ran(next))
                    }
                    Err(failure) if failure.kind() == FailureKind::Interrupted => {
                        // Nothing is recorded: the whole transaction rolls back and the
                        // step stays pending for the next run.
                        failure.raise(
                            format!("Step {id} of batch \"{}\" was interrupted and is still pending.", self.batch),
                            format!("Run \"CALL etc_batch.exec_batch_from_id({id})\" to continue the chain."),
                        )
                    }
                    Err(failure) => {
                        let sqlstate = failure.sqlstate();
                        let attempt = self.owner(|| {
                            let (batch, attempt, added_by) = query::row(
                                sql::MARK_FAILED,
                                &[
                                    id.into(),
                                    started.into(),
                                    finished.into(),
                                    failure.message.as_str().into(),
                                    sqlstate.as_str().into(),
                                ],
                                |r| {
                                    Ok((
                                        r.get::<String>(1)?.unwrap_or_default(),
                                        r.get::<i32>(2)?.unwrap_or_default(),
                                        r.get::<pg_sys::Oid>(3)?.unwrap_or(pg_sys::Oid::INVALID),
                                    ))
                                },
                            )?
                            .ok_or(BatchError::UnknownStep { id })?;
                            self.audit.borrow_mut().write(&Attempt {
                                outcome: "failed",
                                ran: Some((started, finished)),
                                error: Some((&failure.message, &sqlstate)),
                                ..locked.attempt(id, &batch, attempt, added_by)
                            })?;
                            Ok(attempt)
                        })?;
                        tx.commit();
                        failure.raise(
                            format!(
                                "Step {id} of batch \"{}\" failed on attempt {attempt}.",
                                self.batch
                            ),
                            retry_step_hint(id),
                        )
                    }
                }
            }
        }
    }

    fn owner<R>(&self, work: impl FnOnce() -> Result<R>) -> Result<R> {
        as_role(self.bookkeeper, work)
    }

    /// Takes the step's row lock and reads the step as it is now, and where the locked
    /// version lies (for marking it done). `None`: another runner holds it and `wait` is
    /// false.
    fn lock(&self, id: i64) -> Result<Option<(LockedStep, Tid)>> {
        let step = as_role(self.bookkeeper, || {
            rows::with_table("batch_log", |steps| {
                steps.lock_by_key("id", Key::Int8(id), self.wait, |row| {
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
                        search_path: row.get::<String>("search_path")?.unwrap_or_default(),
                        paused: Paused::from_row(row.get("paused_at")?, row.get("paused_by")?),
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
            query::row(sql::STEP_HOLDER, &[id.into()], |row| row.get::<i32>(1))
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
    Spi::run(command).map_err(BatchError::from).or_raise();
    // Deferred constraints are checked now, inside the step's subtransaction, so that a
    // violation is the step's failure rather than an error of the COMMIT after it. In a
    // database without deferrable constraints or triggers there is nothing to check.
    if deferrable {
        query::run("SET CONSTRAINTS ALL IMMEDIATE", &[]).or_raise();
    }
}

/// Marks the step done, as MARK_DONE does, without a statement where batch_log has no
/// trigger for it (see `rows`): the step's row is locked, and no other transaction can
/// have changed it. Returns its batch, its attempts and who added it, and the next step
/// of its batch.
fn mark_done(
    id: i64,
    at: Tid,
    started: TimestampWithTimeZone,
    finished: TimestampWithTimeZone,
) -> Result<(String, i32, pg_sys::Oid, Option<i64>)> {
    let direct = rows::with_table("batch_log", |steps| {
        if steps.fires_on_update() {
            return Ok(None);
        }
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
        let after = steps.next_by_key("id", Key::Int8(id), |row| {
            Ok((row.get::<i64>("id")?, row.get::<String>("batch")?))
        })?;
        Ok(Some((batch, attempt, added_by, after)))
    })?;
    let Some((batch, attempt, added_by, after)) = direct else {
        return query::row(
            sql::MARK_DONE,
            &[id.into(), started.into(), finished.into()],
            |r| {
                Ok((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<i32>(2)?.unwrap_or_default(),
                    r.get::<pg_sys::Oid>(3)?.unwrap_or(pg_sys::Oid::INVALID),
                    r.get::<i64>(4)?,
                ))
            },
        )?
        .ok_or(BatchError::UnknownStep { id });
    };
    let next = match after {
        None => None,
        Some((next, Some(b))) if b == batch => next,
        Some(_) => query::one::<i64>(sql::NEXT_IN_BATCH, &[batch.as_str().into(), id.into()])?,
    };
    Ok((batch, attempt, added_by, next))
}
