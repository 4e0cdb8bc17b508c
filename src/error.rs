//! The one error type of etc_batch.
//!
//! Every error a user can see is a variant here, with its SQLSTATE, its message in
//! PostgreSQL's style (lower case, no period, names in double quotes), a detail that
//! states the facts, and a hint that says what to do. Callers branch on the SQLSTATE,
//! so it is the most specific one that fits, and it is chosen in exactly one place.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode as Code;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// A procedure that commits was called where it cannot commit.
    AtomicContext {
        procedure: &'static str,
        /// Inside BEGIN ... COMMIT, as a driver with autocommit off puts every statement.
        in_transaction_block: bool,
    },
    /// A required argument was NULL.
    NullArgument {
        argument: &'static str,
    },
    /// An argument has a value that is never valid.
    InvalidArgument {
        message: String,
        detail: Option<String>,
    },
    /// A step command that etc_batch will never be able to run as one step.
    InvalidCommand {
        detail: String,
    },
    /// A step command that does not parse.
    CommandSyntax {
        detail: String,
    },
    UnknownStep {
        id: i64,
    },
    UnknownBatch {
        batch: String,
    },
    StepExists {
        id: i64,
        batch: String,
    },
    /// The chain reached a step that failed earlier and was not retried.
    StepFailed {
        id: i64,
        batch: String,
        attempts: i32,
        sqlstate: Option<String>,
        error: Option<String>,
    },
    /// `retry_step` on a step that is not failed.
    StepNotFailed {
        id: i64,
        status: String,
    },
    /// A step that was added by a role that no longer exists.
    StepOwnerMissing {
        id: i64,
        batch: String,
    },
    /// A handler job whose handler function was dropped.
    HandlerMissing {
        job: String,
    },
    /// A column named in a job that the target does not have.
    UndefinedColumn {
        column: String,
    },
    /// Something etc_batch does not support (yet), such as a key of an unusual type.
    Unsupported {
        message: String,
        detail: String,
    },
    UnknownJob {
        job: String,
    },
    /// The database's etc_batch objects are of another version than this library.
    VersionMismatch {
        installed: String,
    },
    PermissionDenied {
        message: String,
        detail: String,
    },
    /// The same job id registered again with different content.
    JobMismatch {
        job: String,
        detail: String,
    },
    /// An item no longer holds what was approved: a business decision is needed.
    JobConflict {
        job: String,
        detail: String,
    },
    /// The job's progress does not match its approved list.
    JobCorrupt {
        job: String,
        detail: String,
    },
    JobAborted {
        job: String,
        reason: Option<String>,
    },
    /// A fence check failed: the holder no longer holds that generation of the lease.
    LeaseLost {
        name: String,
        holder: String,
        generation: i64,
        detail: String,
    },
    UnknownLease {
        name: String,
    },
    /// release_lease by a holder that does not hold the lease.
    LeaseNotHeld {
        name: String,
        holder: String,
        detail: String,
    },
    /// Something etc_batch itself did not expect; a bug, never a user error.
    Internal(String),
}

impl BatchError {
    pub fn sqlstate(&self) -> Code {
        use BatchError::*;
        match self {
            AtomicContext { .. } => Code::ERRCODE_INVALID_TRANSACTION_TERMINATION,
            NullArgument { .. } => Code::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            InvalidArgument { .. } => Code::ERRCODE_INVALID_PARAMETER_VALUE,
            InvalidCommand { .. } => Code::ERRCODE_INVALID_PARAMETER_VALUE,
            CommandSyntax { .. } => Code::ERRCODE_SYNTAX_ERROR,
            UnknownStep { .. } | UnknownBatch { .. } => Code::ERRCODE_UNDEFINED_OBJECT,
            StepExists { .. } => Code::ERRCODE_UNIQUE_VIOLATION,
            StepFailed { .. } | StepNotFailed { .. } => {
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            StepOwnerMissing { .. } => Code::ERRCODE_UNDEFINED_OBJECT,
            HandlerMissing { .. } => Code::ERRCODE_UNDEFINED_FUNCTION,
            UndefinedColumn { .. } => Code::ERRCODE_UNDEFINED_COLUMN,
            Unsupported { .. } => Code::ERRCODE_FEATURE_NOT_SUPPORTED,
            UnknownJob { .. } => Code::ERRCODE_UNDEFINED_OBJECT,
            VersionMismatch { .. } => Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            PermissionDenied { .. } => Code::ERRCODE_INSUFFICIENT_PRIVILEGE,
            JobMismatch { .. } => Code::ERRCODE_DUPLICATE_OBJECT,
            // Not class 40: a conflict is never retryable; it needs a new approval.
            JobConflict { .. } => Code::ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION,
            JobCorrupt { .. } => Code::ERRCODE_DATA_CORRUPTED,
            JobAborted { .. } => Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            // A class no step or job error uses, so that a worker can tell "I lost my
            // lease, step down" from every failure of the work itself.
            LeaseLost { .. } => Code::ERRCODE_INVALID_TRANSACTION_INITIATION,
            UnknownLease { .. } => Code::ERRCODE_UNDEFINED_OBJECT,
            LeaseNotHeld { .. } => Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            Internal(_) => Code::ERRCODE_INTERNAL_ERROR,
        }
    }

    pub fn message(&self) -> String {
        use BatchError::*;
        match self {
            AtomicContext {
                procedure,
                in_transaction_block: true,
            } => {
                format!("{procedure} cannot run inside a transaction block")
            }
            AtomicContext { procedure, .. } => {
                format!("{procedure} cannot run in an atomic context")
            }
            NullArgument { argument } => format!("argument \"{argument}\" must not be null"),
            InvalidArgument { message, .. } => message.clone(),
            InvalidCommand { .. } => "invalid step command".into(),
            CommandSyntax { .. } => "step command has a syntax error".into(),
            UnknownStep { id } => format!("step {id} does not exist"),
            UnknownBatch { batch } => format!("batch \"{batch}\" does not exist"),
            StepExists { id, batch } => format!("step {id} already exists in batch \"{batch}\""),
            StepFailed { id, batch, .. } => format!("step {id} of batch \"{batch}\" has failed"),
            StepNotFailed { id, status } => format!("step {id} is {status}, not failed"),
            StepOwnerMissing { id, batch } => {
                format!("step {id} of batch \"{batch}\" was added by a role that no longer exists")
            }
            HandlerMissing { job } => {
                format!("the handler of job \"{job}\" no longer exists")
            }
            UndefinedColumn { column } => {
                format!("column \"{column}\" does not exist in the target")
            }
            Unsupported { message, .. } => message.clone(),
            UnknownJob { job } => format!("job \"{job}\" does not exist"),
            VersionMismatch { installed } => format!(
                "etc_batch {installed} is installed in this database, but the library is {}",
                env!("CARGO_PKG_VERSION")
            ),
            PermissionDenied { message, .. } => message.clone(),
            JobMismatch { job, .. } => {
                format!("job \"{job}\" is already registered with different content")
            }
            JobConflict { job, .. } => format!("job \"{job}\" is in conflict"),
            JobCorrupt { job, .. } => format!("job \"{job}\" has corrupt progress"),
            JobAborted { job, .. } => format!("job \"{job}\" was aborted"),
            LeaseLost {
                name,
                holder,
                generation,
                ..
            } => {
                format!("lease \"{name}\" is not held by \"{holder}\" at generation {generation}")
            }
            UnknownLease { name } => format!("lease \"{name}\" does not exist"),
            LeaseNotHeld { name, holder, .. } => {
                format!("lease \"{name}\" is not held by \"{holder}\"")
            }
            Internal(what) => format!("etc_batch internal error: {what}"),
        }
    }

    pub fn detail(&self) -> Option<String> {
        use BatchError::*;
        match self {
            AtomicContext {
                in_transaction_block: true,
                ..
            } => Some(
                "It commits as it works, a step or a chunk at a time, and this CALL ran inside a \
                 transaction block: after BEGIN, in a string of several statements (as pg_cron \
                 and psql -c run one), or from a client driver with autocommit off, which opens \
                 one before every statement."
                    .into(),
            ),
            AtomicContext {
                in_transaction_block: false,
                ..
            } => Some(
                "It commits as it works, a step or a chunk at a time, and a function, a SELECT, \
                 a block with an EXCEPTION clause, or a calling procedure with a SET clause or \
                 SECURITY DEFINER does not allow that."
                    .into(),
            ),
            InvalidArgument { detail, .. } => detail.clone(),
            InvalidCommand { detail } | CommandSyntax { detail } => Some(detail.clone()),
            StepFailed {
                attempts,
                sqlstate,
                error,
                ..
            } => Some(format!(
                "It failed on attempt {attempts}{}{}.",
                sqlstate
                    .as_deref()
                    .map(|s| format!(" with SQLSTATE {s}"))
                    .unwrap_or_default(),
                error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default(),
            )),
            StepOwnerMissing { .. } => {
                Some("A step runs with the privileges of the role that added it.".into())
            }
            HandlerMissing { .. } => Some(
                "The job names its handler by identity, and a function created again is another one; nothing was changed."
                    .into(),
            ),
            Unsupported { detail, .. } | PermissionDenied { detail, .. } => Some(detail.clone()),
            JobMismatch { detail, .. }
            | JobConflict { detail, .. }
            | JobCorrupt { detail, .. }
            | LeaseLost { detail, .. }
            | LeaseNotHeld { detail, .. } => Some(detail.clone()),
            JobAborted { reason, .. } => reason
                .as_ref()
                .map(|r| format!("The reason given was: {r}")),
            _ => None,
        }
    }

    pub fn hint(&self) -> Option<String> {
        use BatchError::*;
        match self {
            AtomicContext { procedure, in_transaction_block: true } => Some(format!(
                "Send \"CALL {procedure}(...)\" as a statement of its own, in autocommit mode: \
                 turn autocommit on in the driver (psycopg: conn.autocommit = True; JDBC: \
                 setAutoCommit(true)), give pg_cron a job string with only the CALL, or COMMIT \
                 the open transaction first."
            )),
            AtomicContext { procedure, in_transaction_block: false } => Some(format!(
                "Run \"CALL {procedure}(...)\" as a statement of its own in autocommit mode, \
                 or from a procedure that was itself CALLed that way."
            )),
            StepFailed { id, .. } => Some(format!(
                "Fix the cause, then run \"SELECT etc_batch.retry_step({id})\" and \
                 \"CALL etc_batch.exec_batch_from_id({id})\"."
            )),
            StepNotFailed { .. } => {
                Some("Only a failed step can be retried; use etc_batch.reset_batch to rerun a whole batch.".into())
            }
            StepExists { .. } => Some("Omit the id to let etc_batch choose the next free one.".into()),
            StepOwnerMissing { .. } => {
                Some("Delete the step and add it again as an existing role.".into())
            }
            HandlerMissing { job } => Some(format!(
                "Abort the job (etc_batch.abort_job('{}', ...)) and register what is left under a new job id.",
                job.replace('\'', "''")
            )),
            VersionMismatch { .. } => {
                Some("Run \"ALTER EXTENSION etc_batch UPDATE\" in this database.".into())
            }
            JobMismatch { .. } => Some(
                "A job id names one approval forever; register the new approval under a new job id.".into(),
            ),
            LeaseLost { .. } => Some(
                "Stop acting as the holder: nothing was changed, and no more work may be done \
                 under this lease. Acquire it again before doing more."
                    .into(),
            ),
            JobConflict { .. } => Some(
                "This is a business conflict, not a transient error: chunks committed earlier stay \
                 committed, and the remaining items need a new approval under a new job id."
                    .into(),
            ),
            JobCorrupt { .. } => Some(
                "etc_batch does not repair progress by itself; compare etc_batch.verify_job with \
                 etc_batch.job_audit, then abort the job and register what remains."
                    .into(),
            ),
            _ => None,
        }
    }

    /// Raises this error in the backend; never returns.
    pub fn raise(self) -> ! {
        ErrorReport::from(self).report(PgLogLevel::ERROR);
        unreachable!("ereport(ERROR) returned")
    }
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for BatchError {}

impl From<BatchError> for ErrorReport {
    fn from(e: BatchError) -> Self {
        let mut report = ErrorReport::new(e.sqlstate(), e.message(), "etc_batch");
        if let Some(detail) = e.detail() {
            report = report.set_detail(detail);
        }
        if let Some(hint) = e.hint() {
            report = report.set_hint(hint);
        }
        report
    }
}

impl From<pgrx::spi::Error> for BatchError {
    fn from(e: pgrx::spi::Error) -> Self {
        BatchError::Internal(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, BatchError>;

/// Raises the error of a failed `Result` in the backend.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T> OrRaise<T> for Result<T> {
    fn or_raise(self) -> T {
        self.unwrap_or_else(|e| e.raise())
    }
}

/// A required argument: NULL is an error, never a silent NULL result.
pub fn required<T>(value: Option<T>, argument: &'static str) -> Result<T> {
    value.ok_or(BatchError::NullArgument { argument })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_follow_postgres_style() {
        let all = [
            BatchError::AtomicContext {
                procedure: "etc_batch.exec_batch_from_id",
                in_transaction_block: true,
            },
            BatchError::AtomicContext {
                procedure: "etc_batch.exec_batch_from_id",
                in_transaction_block: false,
            },
            BatchError::NullArgument { argument: "batch" },
            BatchError::UnknownStep { id: 7 },
            BatchError::UnknownBatch {
                batch: "nightly".into(),
            },
            BatchError::StepExists {
                id: 7,
                batch: "nightly".into(),
            },
            BatchError::StepFailed {
                id: 7,
                batch: "nightly".into(),
                attempts: 2,
                sqlstate: Some("22012".into()),
                error: Some("division by zero".into()),
            },
            BatchError::StepNotFailed {
                id: 7,
                status: "done".into(),
            },
        ];
        for e in all {
            let m = e.message();
            assert!(!m.ends_with('.'), "{m}");
            assert!(m.chars().next().unwrap().is_lowercase(), "{m}");
            for text in [e.detail(), e.hint()].into_iter().flatten() {
                assert!(text.ends_with('.'), "{text}");
                assert!(text.chars().next().unwrap().is_uppercase(), "{text}");
            }
        }
    }

    #[test]
    fn failed_step_detail_names_attempt_and_sqlstate() {
        let e = BatchError::StepFailed {
            id: 24,
            batch: "nightly".into(),
            attempts: 3,
            sqlstate: Some("23505".into()),
            error: Some("duplicate key".into()),
        };
        assert_eq!(
            e.detail().unwrap(),
            "It failed on attempt 3 with SQLSTATE 23505: duplicate key."
        );
        assert!(e.hint().unwrap().contains("etc_batch.retry_step(24)"));
        assert_eq!(e.sqlstate(), Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE);
    }

    #[test]
    fn atomic_context_is_2d000() {
        let e = BatchError::AtomicContext {
            procedure: "etc_batch.exec_batch_from_id",
            in_transaction_block: false,
        };
        assert_eq!(e.sqlstate(), Code::ERRCODE_INVALID_TRANSACTION_TERMINATION);
        assert!(e
            .hint()
            .unwrap()
            .contains("CALL etc_batch.exec_batch_from_id"));
    }
}
