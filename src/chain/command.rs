//! Checks a step's SQL when it is added, so that a chain never stops at night on a
//! command that could never have run.

use crate::error::{capitalize, BatchError, Result};
use crate::txn;
use pgrx::pg_sys;
use pgrx::PgList;
use std::ffi::CString;

const NO_TRANSACTION_CONTROL: &str = "Each step runs inside a transaction that etc_batch \
     commits for it, so BEGIN, COMMIT, ROLLBACK, SAVEPOINT and PREPARE TRANSACTION cannot \
     appear in a step command.";

/// Parses the command (syntax only: the objects it names may not exist yet) and rejects
/// empty commands and transaction control.
pub fn check(command: &str) -> Result<()> {
    if command.trim().is_empty() {
        return Err(BatchError::InvalidCommand {
            detail: "The command is empty.".into(),
        });
    }
    let text = CString::new(command).map_err(|_| BatchError::InvalidCommand {
        detail: "The command contains a zero byte.".into(),
    })?;

    // The parser reports a syntax error with ereport; a subtransaction turns it into a
    // value, so the error can name the step command instead of the caller's statement.
    let parsed = txn::subtransaction(|| unsafe {
        let statements = pg_sys::raw_parser(text.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
        let statements = PgList::<pg_sys::RawStmt>::from_pg(statements);
        let mut count = 0usize;
        let mut transaction_control = false;
        for raw in statements.iter_ptr() {
            count += 1;
            transaction_control |= pgrx::is_a((*raw).stmt, pg_sys::NodeTag::T_TransactionStmt);
        }
        (count, transaction_control)
    });

    match parsed {
        Err(failure) => Err(BatchError::Syntax {
            what: "step command",
            detail: format!("{}.", capitalize(&failure.message)),
        }),
        Ok((0, _)) => Err(BatchError::InvalidCommand {
            detail: "The command contains no statement.".into(),
        }),
        Ok((_, true)) => Err(BatchError::InvalidCommand {
            detail: NO_TRANSACTION_CONTROL.into(),
        }),
        Ok(_) => Ok(()),
    }
}
