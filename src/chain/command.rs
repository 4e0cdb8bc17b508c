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
/// empty commands and transaction control; a step that commits must be a single CALL.
pub fn check(command: &str, commits: bool) -> Result<()> {
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
        let mut calls = 0usize;
        for raw in statements.iter_ptr() {
            count += 1;
            transaction_control |= pgrx::is_a((*raw).stmt, pg_sys::NodeTag::T_TransactionStmt);
            calls += usize::from(pgrx::is_a((*raw).stmt, pg_sys::NodeTag::T_CallStmt));
        }
        (count, transaction_control, calls)
    });

    match parsed {
        Err(failure) => Err(BatchError::Syntax {
            what: "step command",
            detail: format!("{}.", capitalize(&failure.message)),
        }),
        Ok((0, _, _)) => Err(BatchError::InvalidCommand {
            detail: "The command contains no statement.".into(),
        }),
        Ok((_, true, _)) => Err(BatchError::InvalidCommand {
            detail: NO_TRANSACTION_CONTROL.into(),
        }),
        Ok((count, _, calls)) if commits && (count != 1 || calls != 1) => {
            Err(BatchError::InvalidCommand {
                detail: ONE_CALL.into(),
            })
        }
        Ok(_) => Ok(()),
    }
}

const ONE_CALL: &str = "A step that commits runs the procedure it calls in the runner's own \
     transaction loop, so its command is a single CALL: CALL etc_batch.drain_job('festival'), \
     CALL partman.run_maintenance_proc(), CALL a procedure of yours.";

/// The step a command runs the chain of, when it is `CALL etc_batch.exec_batch_from_id(n,
/// ...)` (or `p_id => n`) with n a literal: for the check that a chain never runs itself.
/// The command was checked when it was added, so it parses.
pub fn called_step(command: &str) -> Option<i64> {
    let text = CString::new(command).ok()?;
    txn::subtransaction(|| unsafe {
        let statements = pg_sys::raw_parser(text.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
        let statements = PgList::<pg_sys::RawStmt>::from_pg(statements);
        let raw = statements.get_ptr(0)?;
        if statements.len() != 1 || !pgrx::is_a((*raw).stmt, pg_sys::NodeTag::T_CallStmt) {
            return None;
        }
        let call = (*raw).stmt as *mut pg_sys::CallStmt;
        let func = (*call).funccall;
        let names: Vec<String> = PgList::<pg_sys::Node>::from_pg((*func).funcname)
            .iter_ptr()
            .map(|n| string_node(n).unwrap_or_default())
            .collect();
        let is_runner = match names.as_slice() {
            [schema, name] => schema == "etc_batch" && name == "exec_batch_from_id",
            [name] => name == "exec_batch_from_id",
            _ => false,
        };
        if !is_runner {
            return None;
        }
        let args = PgList::<pg_sys::Node>::from_pg((*func).args);
        let step = args.iter_ptr().enumerate().find_map(|(i, arg)| {
            if pgrx::is_a(arg, pg_sys::NodeTag::T_NamedArgExpr) {
                let named = arg as *mut pg_sys::NamedArgExpr;
                let name = std::ffi::CStr::from_ptr((*named).name).to_string_lossy();
                (name == "p_id").then(|| integer_const((*named).arg as *mut pg_sys::Node))?
            } else if i == 0 {
                integer_const(arg)
            } else {
                None
            }
        });
        step
    })
    .ok()
    .flatten()
}

/// The text of a String node.
unsafe fn string_node(node: *mut pg_sys::Node) -> Option<String> {
    if !pgrx::is_a(node, pg_sys::NodeTag::T_String) {
        return None;
    }
    let sval = (*(node as *mut pg_sys::String)).sval;
    Some(
        std::ffi::CStr::from_ptr(sval)
            .to_string_lossy()
            .into_owned(),
    )
}

/// An integer literal's value (a bigint one is a Float node, its digits kept as text).
unsafe fn integer_const(node: *mut pg_sys::Node) -> Option<i64> {
    if !pgrx::is_a(node, pg_sys::NodeTag::T_A_Const) {
        return None;
    }
    let constant = node as *mut pg_sys::A_Const;
    if (*constant).isnull {
        return None;
    }
    let value = &(*constant).val;
    match value.node.type_ {
        pg_sys::NodeTag::T_Integer => Some(value.ival.ival as i64),
        pg_sys::NodeTag::T_Float => std::ffi::CStr::from_ptr(value.fval.fval)
            .to_str()
            .ok()?
            .parse()
            .ok(),
        _ => None,
    }
}
