//! An error raised by the work of a round (a step's command, a chunk's change), caught
//! so that it can be recorded, retried or raised again with its own SQLSTATE.

use crate::error::BatchError;
use crate::raised::Raised;
use pgrx::pg_sys::panic::{CaughtError, ErrorReport, ErrorReportWithLevel};
use pgrx::PgSqlErrorCode;

/// An error caught in a subtransaction, kept so it can be recorded and raised again.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The SQLSTATE as pgrx knows it: XX000 for one it does not know.
    pub code: PgSqlErrorCode,
    /// The SQLSTATE and context as the SQL raised them, when `raised::capturing` saw it.
    pub raised: Option<Raised>,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

/// How an error raised by a step's command or a chunk's change is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The work itself failed: a step is recorded as failed, a chunk rolled back.
    WorkFailed,
    /// The caller interrupted the run (pg_cancel_backend, statement_timeout): the work
    /// did nothing wrong, so it stays pending and nothing is recorded.
    Interrupted,
}

impl Failure {
    /// The SQLSTATE as PostgreSQL packs it: the error's own, whatever it is.
    pub fn packed_code(&self) -> i32 {
        self.raised
            .as_ref()
            .map_or(self.code as i32, |raised| raised.code)
    }

    /// The five-character SQLSTATE, as PostgreSQL prints it.
    pub fn sqlstate(&self) -> String {
        unpack_sqlstate(self.packed_code())
    }

    pub fn kind(&self) -> FailureKind {
        match self.code {
            PgSqlErrorCode::ERRCODE_QUERY_CANCELED => FailureKind::Interrupted,
            _ => FailureKind::WorkFailed,
        }
    }

    /// Raises the error again as PostgreSQL would, with its own SQLSTATE and context,
    /// and `detail` and `hint` used only where the original error had none.
    pub fn raise(self, detail: String, hint: String) -> ! {
        if let Some(raised) = self.raised {
            crate::raised::restore_on_raise(self.code as i32, raised);
        }
        crate::error::raise(
            ErrorReport::new(self.code, self.message, "etc_batch")
                .set_detail(self.detail.unwrap_or(detail))
                .set_hint(self.hint.unwrap_or(hint)),
        )
    }
}

/// Runs `work`; an error PostgreSQL raises in it (not one of etc_batch's own) is raised
/// again as it was, SQLSTATE, message, detail and hint, with `context` as the last line
/// of its CONTEXT: where in etc_batch's work the SQL that failed ran.
pub fn with_context<R>(context: &str, work: impl FnOnce() -> R) -> R {
    pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        crate::raised::capturing(work)
    }))
    .catch_others(|caught| match caught {
        CaughtError::PostgresError(_) => {
            let mut failure = Failure::from(caught);
            let mut raised = failure.raised.take().unwrap_or(crate::raised::Raised {
                code: failure.code as i32,
                context: None,
            });
            raised.context = Some(match raised.context.take() {
                Some(lines) => format!("{lines}\n{context}"),
                None => context.to_string(),
            });
            crate::raised::restore_on_raise(failure.code as i32, raised);
            let mut report = ErrorReport::new(failure.code, failure.message, "etc_batch");
            if let Some(detail) = failure.detail {
                report = report.set_detail(detail);
            }
            if let Some(hint) = failure.hint {
                report = report.set_hint(hint);
            }
            crate::error::raise(report)
        }
        other => other.rethrow(),
    })
    .execute()
}

impl From<BatchError> for Failure {
    fn from(e: BatchError) -> Self {
        let report = e.report();
        Failure {
            code: report.code,
            raised: None,
            message: report.message,
            detail: report.detail,
            hint: report.hint,
        }
    }
}

impl From<CaughtError> for Failure {
    /// The error as pgrx caught it, with the SQLSTATE and context `raised::capturing`
    /// copied while it was raised: the copy is taken when it is of this error (its
    /// SQLSTATE is the one pgrx read, or one pgrx does not know).
    fn from(caught: CaughtError) -> Self {
        let e: &ErrorReportWithLevel = match &caught {
            CaughtError::PostgresError(e) | CaughtError::ErrorReport(e) => e,
            CaughtError::RustPanic { ereport, .. } => ereport,
        };
        let code = e.sql_error_code();
        let raised = crate::raised::take()
            .filter(|r| r.code == code as i32 || code == PgSqlErrorCode::ERRCODE_INTERNAL_ERROR);
        Failure {
            code,
            raised,
            message: e.message().to_string(),
            detail: e.detail().map(str::to_string),
            hint: e.hint().map(str::to_string),
        }
    }
}

impl Failure {
    /// An error recorded earlier as its SQLSTATE, message and detail (a step's, failed in
    /// a worker), to be raised again as it was.
    pub fn recorded(sqlstate: &str, message: String, detail: Option<String>) -> Failure {
        let code = PgSqlErrorCode::ERRCODE_INTERNAL_ERROR;
        Failure {
            code,
            raised: Some(Raised {
                code: pack_sqlstate(sqlstate),
                context: None,
            }),
            message,
            detail,
            hint: None,
        }
    }
}

/// PostgreSQL's MAKE_SQLSTATE: six bits per character, first one lowest.
pub fn pack_sqlstate(sqlstate: &str) -> i32 {
    sqlstate
        .bytes()
        .take(5)
        .enumerate()
        .map(|(i, c)| ((c.wrapping_sub(b'0') & 0x3F) as i32) << (6 * i))
        .sum()
}

/// The inverse of PostgreSQL's MAKE_SQLSTATE: six bits per character, first one lowest.
pub fn unpack_sqlstate(mut code: i32) -> String {
    let mut out = String::with_capacity(5);
    for _ in 0..5 {
        out.push((((code & 0x3F) as u8) + b'0') as char);
        code >>= 6;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_unpack_as_printed() {
        for (code, printed) in [
            (PgSqlErrorCode::ERRCODE_DIVISION_BY_ZERO, "22012"),
            (
                PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_TERMINATION,
                "2D000",
            ),
            (PgSqlErrorCode::ERRCODE_QUERY_CANCELED, "57014"),
            (PgSqlErrorCode::ERRCODE_RAISE_EXCEPTION, "P0001"),
        ] {
            assert_eq!(unpack_sqlstate(code as i32), printed);
            assert_eq!(pack_sqlstate(printed), code as i32);
        }
    }

    fn failure(code: PgSqlErrorCode) -> Failure {
        Failure {
            code,
            raised: None,
            message: String::new(),
            detail: None,
            hint: None,
        }
    }

    #[test]
    fn cancellation_is_not_a_failure_of_the_work() {
        assert_eq!(
            failure(PgSqlErrorCode::ERRCODE_QUERY_CANCELED).kind(),
            FailureKind::Interrupted
        );
        for code in [
            PgSqlErrorCode::ERRCODE_DIVISION_BY_ZERO,
            PgSqlErrorCode::ERRCODE_RAISE_EXCEPTION,
        ] {
            assert_eq!(failure(code).kind(), FailureKind::WorkFailed);
        }
    }
}
