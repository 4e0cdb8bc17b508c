//! Checks a step's SQL when it is added, so that a chain never stops at night on a
//! command that could never have run.

use super::step::StepKind;
use crate::error::{capitalize, BatchError, Result};
use crate::parse::{self, Kind};

const NO_TRANSACTION_CONTROL: &str = "Each step runs inside a transaction that etc_batch \
     commits for it, so BEGIN, COMMIT, ROLLBACK, SAVEPOINT and PREPARE TRANSACTION cannot \
     appear in a step command.";

/// Parses the command (syntax only: the objects it names may not exist yet) and rejects
/// empty commands and transaction control; a step that commits must be a single CALL.
pub fn check(command: &str, kind: StepKind) -> Result<()> {
    if command.trim().is_empty() {
        return Err(BatchError::InvalidCommand {
            detail: "The command is empty.".into(),
        });
    }
    if command.contains('\0') {
        return Err(BatchError::InvalidCommand {
            detail: "The command contains a zero byte.".into(),
        });
    }
    let statements = parse::statements(command).map_err(|failure| BatchError::Syntax {
        what: "step command",
        detail: format!("{}.", capitalize(&failure.message)),
    })?;
    if statements.is_empty() {
        return Err(BatchError::InvalidCommand {
            detail: "The command contains no statement.".into(),
        });
    }
    if statements
        .iter()
        .any(|s| s.kind == Kind::TransactionControl)
    {
        return Err(BatchError::InvalidCommand {
            detail: NO_TRANSACTION_CONTROL.into(),
        });
    }
    let one_call = matches!(statements.as_slice(), [one] if matches!(one.kind, Kind::Call(_)));
    match kind {
        StepKind::Plain => Ok(()),
        StepKind::Commits if one_call => Ok(()),
        StepKind::Commits => Err(BatchError::InvalidCommand {
            detail: ONE_CALL.into(),
        }),
    }
}

const ONE_CALL: &str = "A step that commits runs the procedure it calls in the runner's own \
     transaction loop, so its command is a single CALL: CALL etc_batch.drain_job('festival'), \
     CALL partman.run_maintenance_proc(), CALL a procedure of yours.";

/// The step a command runs the chain of, when it is `CALL etc_batch.exec_batch_from_id(n,
/// ...)` (or `p_id => n`) with n a literal: for the check that a chain never runs itself.
/// The command was checked when it was added, so it parses.
pub fn called_step(command: &str) -> Option<i64> {
    let statements = parse::statements(command).ok()?;
    let [statement] = statements.as_slice() else {
        return None;
    };
    let Kind::Call(call) = &statement.kind else {
        return None;
    };
    let is_runner = match call.name.as_slice() {
        [schema, name] => schema == "etc_batch" && name == "exec_batch_from_id",
        [name] => name == "exec_batch_from_id",
        _ => false,
    };
    if !is_runner {
        return None;
    }
    call.args
        .iter()
        .enumerate()
        .find_map(|(i, arg)| match &arg.name {
            Some(name) if name == "p_id" => arg.integer,
            None if i == 0 => arg.integer,
            _ => None,
        })
}
