//! The commit loop behind `CALL etc_batch.exec_batch_from_id(id, wait)`.
//!
//! One transaction per step, in id order, no recursion:
//!   lock the step's row -> re-read its status -> run / skip / stop ->
//!   record the outcome and the audit row -> find the next step -> COMMIT.
//! The lock is the step's row lock (SELECT ... FOR UPDATE), held until that COMMIT, so a
//! second runner waits on the same step and then reads the status the first committed.

use super::sql;
use super::step::{action_for, Action, StepStatus};
use crate::activity::Activity;
use crate::error::{retry_step_hint, BatchError, OrRaise, Result};
use crate::installed;
use crate::lease::Fence;
use crate::query;
use crate::roles::{as_author, as_role, current_user};
use crate::txn::{subtransaction, FailureKind, TxnLoop};
use pgrx::datum::clock_timestamp as now;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// What the runner knows once it holds a step's lock.
struct LockedStep {
    status: StepStatus,
    command: String,
    added_by: pg_sys::Oid,
    attempts: i32,
    last_sqlstate: Option<String>,
    last_error: Option<String>,
    owner_exists: bool,
    search_path: String,
}

enum Flow {
    /// This runner ran the step; it commits with the step's transaction. The next step.
    Ran(Option<i64>),
    /// An earlier runner had done the step. The next step.
    Skipped(Option<i64>),
    /// Another runner holds the step and the caller asked not to wait.
    Yielded,
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
    };

    let mut next = Some(first);
    while let Some(id) = next {
        next = tx.item(|tx| -> Result<Option<i64>> {
            let (ran, next) = match runner.run_step(tx, id)? {
                Flow::Yielded => return Ok(None),
                Flow::Ran(next) => (true, next),
                Flow::Skipped(next) => (false, next),
            };
            tx.commit();
            if ran {
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
        let Some(step) = self.lock(id)? else {
            self.report_holder(id)?;
            return Ok(Flow::Yielded);
        };
        let lock_acquired = now();

        match action_for(step.status) {
            Action::Skip => {
                let next = as_role(self.bookkeeper, || {
                    query::one::<i64>(
                        sql::RECORD_SKIP,
                        &[
                            id.into(),
                            self.caller.into(),
                            lock_requested.into(),
                            lock_acquired.into(),
                        ],
                    )
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
                if !step.owner_exists {
                    return Err(BatchError::StepOwnerMissing {
                        id,
                        batch: self.batch.clone(),
                    });
                }
                let started = now();
                let outcome = subtransaction(|| {
                    as_author(step.added_by, &step.search_path, self.caller, || {
                        run_command(&step.command, self.deferrable)
                    })
                });
                let finished = now();
                let times = || -> Vec<pgrx::datum::DatumWithOid<'static>> {
                    vec![
                        id.into(),
                        started.into(),
                        finished.into(),
                        self.caller.into(),
                        lock_requested.into(),
                        lock_acquired.into(),
                    ]
                };
                match outcome {
                    Ok(()) => {
                        let next = as_role(self.bookkeeper, || {
                            query::one::<i64>(sql::MARK_DONE, &times())
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
                        let mut args = times();
                        args.push(failure.message.clone().into());
                        args.push(failure.sqlstate().into());
                        let attempt = as_role(self.bookkeeper, || {
                            query::one::<i32>(sql::MARK_FAILED, &args)
                        })?
                        .unwrap_or_default();
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

    /// Takes the step's row lock and reads the step as it is now. `None`: another
    /// runner holds it and `wait` is false.
    fn lock(&self, id: i64) -> Result<Option<LockedStep>> {
        let statement = if self.wait {
            sql::LOCK_STEP
        } else {
            sql::LOCK_STEP_NOWAIT
        };
        let step = as_role(self.bookkeeper, || {
            query::row(statement, &[id.into()], |row| {
                Ok(LockedStep {
                    status: StepStatus::parse(&row.get::<String>(1)?.unwrap_or_default())?,
                    command: row.get::<String>(2)?.unwrap_or_default(),
                    added_by: row.get::<pg_sys::Oid>(3)?.unwrap_or(pg_sys::Oid::INVALID),
                    attempts: row.get::<i32>(4)?.unwrap_or_default(),
                    last_sqlstate: row.get::<String>(5)?,
                    last_error: row.get::<String>(6)?,
                    owner_exists: row.get::<bool>(7)?.unwrap_or(false),
                    search_path: row.get::<String>(8)?.unwrap_or_default(),
                })
            })
        })?;
        match step {
            None if self.wait => Err(BatchError::UnknownStep { id }),
            step => Ok(step),
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
