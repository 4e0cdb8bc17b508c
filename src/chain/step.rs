//! What a runner does with a step, decided from the status it reads after the lock.

use crate::error::{BatchError, Result};
use pgrx::PgSqlErrorCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepStatus {
    Pending,
    Done,
    Failed,
}

impl StepStatus {
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "pending" => Ok(StepStatus::Pending),
            "done" => Ok(StepStatus::Done),
            "failed" => Ok(StepStatus::Failed),
            other => Err(BatchError::Internal(format!(
                "unknown step status \"{other}\""
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Done => "done",
            StepStatus::Failed => "failed",
        }
    }
}

/// The runner's move for one step, given what it saw once the step's lock was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run the command, then mark the step done in the same transaction.
    Run,
    /// Another runner finished it first: record the skip and go on.
    Skip,
    /// It failed before and nobody retried it: stop the chain here.
    Stop,
}

pub fn action_for(status: StepStatus) -> Action {
    match status {
        StepStatus::Pending => Action::Run,
        StepStatus::Done => Action::Skip,
        StepStatus::Failed => Action::Stop,
    }
}

/// How an error raised by a step's command is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The step itself failed: record it as failed and raise the error.
    StepFailed,
    /// The caller interrupted the run (pg_cancel_backend, statement_timeout): the step
    /// did nothing wrong, so it stays pending and the whole transaction rolls back.
    Interrupted,
}

pub fn classify_failure(code: PgSqlErrorCode) -> FailureKind {
    match code {
        PgSqlErrorCode::ERRCODE_QUERY_CANCELED => FailureKind::Interrupted,
        _ => FailureKind::StepFailed,
    }
}

/// A batch name as given to add_step or reset_batch.
pub fn check_batch_name(batch: &str) -> Result<()> {
    if batch.trim().is_empty() {
        return Err(BatchError::InvalidArgument {
            message: "batch name must not be empty".into(),
            detail: None,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips() {
        for s in [StepStatus::Pending, StepStatus::Done, StepStatus::Failed] {
            assert_eq!(StepStatus::parse(s.as_str()).unwrap(), s);
        }
        assert!(StepStatus::parse("running").is_err());
    }

    #[test]
    fn only_pending_steps_run() {
        assert_eq!(action_for(StepStatus::Pending), Action::Run);
        assert_eq!(action_for(StepStatus::Done), Action::Skip);
        assert_eq!(action_for(StepStatus::Failed), Action::Stop);
    }

    #[test]
    fn cancellation_is_not_a_step_failure() {
        assert_eq!(
            classify_failure(PgSqlErrorCode::ERRCODE_QUERY_CANCELED),
            FailureKind::Interrupted
        );
        assert_eq!(
            classify_failure(PgSqlErrorCode::ERRCODE_DIVISION_BY_ZERO),
            FailureKind::StepFailed
        );
        assert_eq!(
            classify_failure(PgSqlErrorCode::ERRCODE_RAISE_EXCEPTION),
            FailureKind::StepFailed
        );
    }

    #[test]
    fn empty_batch_names_are_rejected() {
        assert!(check_batch_name("").is_err());
        assert!(check_batch_name("  ").is_err());
        assert!(check_batch_name("nightly").is_ok());
    }
}
