//! What a runner does with a step, decided from the status it reads after the lock.

use crate::error::{non_empty, Result};
pub use crate::status::StepStatus;

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

/// The kinds of step: each is checked in its own way when it is added (command.rs) and
/// run in its own way (runner.rs). Kept in batch_log as the column `commits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Any SQL, run in a subtransaction of the runner's transaction, which commits it
    /// with the step's done mark.
    Plain,
    /// A single CALL of a procedure that may COMMIT, run in the runner's own non-atomic
    /// context; its outcome is recorded once it returns.
    Commits,
}

impl StepKind {
    pub fn of(commits: bool) -> StepKind {
        if commits {
            StepKind::Commits
        } else {
            StepKind::Plain
        }
    }

    /// As batch_log keeps it.
    pub fn commits(self) -> bool {
        self == StepKind::Commits
    }
}

pub fn action_for(status: StepStatus) -> Action {
    match status {
        StepStatus::Pending => Action::Run,
        StepStatus::Done => Action::Skip,
        StepStatus::Failed => Action::Stop,
    }
}

/// A step's timeout in milliseconds, as statement_timeout takes it: above 0, and at most
/// what statement_timeout can hold.
pub fn timeout_ms(timeout: pgrx::datum::Interval) -> Result<i32> {
    let micros = timeout.as_micros();
    if micros < 1000 || micros > i32::MAX as i128 * 1000 {
        return Err(crate::error::BatchError::invalid_because(
            format!("timeout of {} ms is out of range", micros / 1000),
            "Give a timeout of at least 1 millisecond and at most 24 days, or NULL for none.",
        ));
    }
    Ok((micros / 1000) as i32)
}

/// A batch name as given to add_step or reset_batch.
pub fn check_batch_name(batch: &str) -> Result<()> {
    non_empty(batch, "batch name")
}

/// A run key given to run_chain: not empty, and no slash (the run's batch is
/// "<chain>/<run key>").
pub fn check_run_key(run_key: &str) -> Result<()> {
    non_empty(run_key, "run key")?;
    if run_key.contains('/') {
        return Err(crate::error::BatchError::invalid_because(
            format!("run key \"{run_key}\" has a slash"),
            "A run's batch is named \"<chain>/<run key>\"; give a key without one, such as a date.",
        ));
    }
    Ok(())
}

/// A step id given to add_step.
pub fn check_step_id(id: i64) -> Result<()> {
    if id < 1 {
        return Err(crate::error::BatchError::invalid_because(
            format!("step id {id} is out of range"),
            "Step ids are positive.",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pending_steps_run() {
        assert_eq!(action_for(StepStatus::Pending), Action::Run);
        assert_eq!(action_for(StepStatus::Done), Action::Skip);
        assert_eq!(action_for(StepStatus::Failed), Action::Stop);
    }

    #[test]
    fn empty_batch_names_are_rejected() {
        assert!(check_batch_name("").is_err());
        assert!(check_batch_name("  ").is_err());
        assert!(check_batch_name("nightly").is_ok());
    }

    #[test]
    fn step_ids_are_positive() {
        assert!(check_step_id(0).is_err());
        assert!(check_step_id(-3).is_err());
        assert!(check_step_id(1).is_ok());
    }
}
