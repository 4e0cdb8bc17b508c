//! Managing a chain's steps: add_step, reset_batch, retry_step. Each runs as the
//! extension's owner, who alone writes batch_log, so that `added_by` is always the role
//! that really called add_step.

use super::step::{self, StepKind, StepStatus};
use super::{command, sql};
use crate::error::{failure_text, BatchError, Result};
use crate::query;
use crate::roles::{as_owner, current_user};
use pgrx::datum::Interval;

/// How a step runs, beyond its command: see add_step.
pub struct Options {
    /// Whether the command is a single CALL of a procedure that may commit.
    pub kind: StepKind,
    /// Its statement_timeout.
    pub timeout: Option<Interval>,
    /// Attempts in all after 40001, 40P01 or 55P03.
    pub max_attempts: i32,
}

/// Adds a pending step that will run as the calling role; returns its id, `id` or the
/// one after the highest.
pub fn add(batch: &str, command: &str, id: Option<i64>, options: Options) -> Result<i64> {
    step::check_batch_name(batch)?;
    if let Some(id) = id {
        step::check_step_id(id)?;
    }
    if options.max_attempts < 1 {
        return Err(BatchError::invalid_because(
            format!("max_attempts {} is out of range", options.max_attempts),
            "Give the number of attempts in all, 1 or more.",
        ));
    }
    if let Some(timeout) = options.timeout {
        step::timeout_ms(timeout)?;
    }
    command::check(command, options.kind)?;
    let adder = current_user();
    as_owner(|| {
        query::run(sql::LOCK_STEP_IDS, &[])?;
        let id = match id {
            Some(id) => {
                if let Some(batch) = query::one::<String>(sql::STEP_BATCH, &[id.into()])? {
                    return Err(BatchError::StepExists { id, batch });
                }
                id
            }
            None => query::one::<i64>(sql::NEXT_FREE_ID, &[])?.unwrap_or(0) + 1,
        };
        query::one::<i64>(
            sql::INSERT_STEP,
            &[
                id.into(),
                batch.into(),
                command.into(),
                adder.into(),
                options.kind.commits().into(),
                options.timeout.into(),
                options.max_attempts.into(),
            ],
        )?
        .ok_or_else(|| BatchError::Internal("INSERT ... RETURNING returned no row".into()))
    })
}

/// Puts every step of a batch back to pending; returns how many. A NOTICE for each step
/// that was not pending says what it was; the failures it clears stay in step_audit.
pub fn reset(batch: &str) -> Result<i32> {
    let steps = as_owner(|| {
        query::rows(sql::RESET_BATCH_STEPS, &[batch.into()], 0, |r| {
            let r = Reset::read(r)?;
            Ok(Cleared {
                id: r.id,
                status: StepStatus::parse(&r.status)?,
                attempts: r.attempts,
                sqlstate: r.sqlstate,
                error: r.error,
            })
        })
    })?;
    if steps.is_empty() {
        return Err(BatchError::UnknownBatch {
            batch: batch.to_string(),
        });
    }
    for step in steps.iter().filter(|s| s.status != StepStatus::Pending) {
        step.notice(batch);
    }
    Ok(steps.len() as i32)
}

/// Puts a failed step back to pending, with a NOTICE of the failure it clears.
pub fn retry(id: i64) -> Result<()> {
    let retried = as_owner(|| {
        if let Some(step) = query::row(sql::RETRY_STEP, &[id.into()], |r| {
            let r = Retried::read(r)?;
            Ok((
                r.batch,
                Cleared {
                    id,
                    status: StepStatus::Failed,
                    attempts: r.attempts,
                    sqlstate: r.sqlstate,
                    error: r.error,
                },
            ))
        })? {
            return Ok(step);
        }
        match query::one::<String>(sql::STEP_STATUS, &[id.into()])? {
            None => Err(BatchError::UnknownStep { id }),
            Some(status) => Err(BatchError::StepNotFailed { id, status }),
        }
    })?;
    retried.1.notice(&retried.0);
    Ok(())
}

/// A step put back to pending, as it was.
struct Cleared {
    id: i64,
    status: StepStatus,
    attempts: i32,
    sqlstate: Option<String>,
    error: Option<String>,
}

query::row_reader! {
    /// A step put back to pending, as RESET_BATCH_STEPS reads it.
    struct Reset {
        id: i64 = 0,
        status: String = String::new(),
        attempts: i32 = 0,
        sqlstate: Option<String>,
        error: Option<String>,
    }
}

query::row_reader! {
    /// A failed step put back to pending, as RETRY_STEP reads it.
    struct Retried {
        batch: String = String::new(),
        attempts: i32 = 0,
        sqlstate: Option<String>,
        error: Option<String>,
    }
}

impl Cleared {
    fn notice(&self, batch: &str) {
        pgrx::ereport!(
            NOTICE,
            pgrx::PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
            format!(
                "step {} of batch \"{batch}\" is pending again; {}",
                self.id,
                self.was()
            ),
            "Its attempts stay in etc_batch.step_audit."
        );
    }

    /// What the step was: done, or failed and how.
    fn was(&self) -> String {
        if self.status != StepStatus::Failed {
            return format!("it was {}", self.status);
        }
        format!(
            "it had {}",
            failure_text(
                self.attempts,
                self.sqlstate.as_deref(),
                self.error.as_deref()
            )
        )
    }
}
