//! Transaction control from inside a procedure: the only module that calls SPI in
//! non-atomic mode, commits, or opens subtransactions by hand.
//!
//! pgrx's `Spi::connect` always connects atomically, so it can never commit. A
//! procedure that commits between items instead:
//! 1. proves it was CALLed in a non-atomic context (`TxnLoop::begin`),
//! 2. connects with `SPI_OPT_NONATOMIC`,
//! 3. does each item's work with pgrx's ordinary `Spi` API (which nests an atomic
//!    connection per statement and finishes it again, so nothing from SPI is ever
//!    held across a commit), and
//! 4. calls `TxnLoop::commit`.
//!
//! PostgreSQL releases everything of a failed transaction itself (the SPI stack
//! included), so the only cleanup owed here is on the success path.

use crate::error::{BatchError, Result};
use crate::memory::Scratch;
use crate::raised::Raised;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::{CaughtError, ErrorReport, ErrorReportWithLevel};
use pgrx::{PgSqlErrorCode, PgTryBuilder};
use std::ffi::CString;

/// A non-atomic SPI connection owned by the running procedure.
pub struct TxnLoop {
    finished: bool,
    /// Reset before every item, so a loop over a million items uses the memory of one.
    /// A child of SPI's procedure context, which lives until SPI_finish, across commits.
    scratch: Scratch,
}

impl TxnLoop {
    /// Checks that the procedure may commit and connects SPI in non-atomic mode.
    ///
    /// # Safety
    /// `fcinfo` must be the call info PostgreSQL passed to the running C function.
    pub unsafe fn begin(fcinfo: pg_sys::FunctionCallInfo, procedure: &'static str) -> Result<Self> {
        if !Self::may_commit(fcinfo) {
            return Err(BatchError::AtomicContext {
                procedure,
                in_transaction_block: pg_sys::IsTransactionBlock() && !pg_sys::IsSubTransaction(),
            });
        }
        let rc = pg_sys::SPI_connect_ext(pg_sys::SPI_OPT_NONATOMIC as i32);
        if rc != pg_sys::SPI_OK_CONNECT as i32 {
            return Err(BatchError::Internal(format!(
                "SPI_connect_ext returned {rc}"
            )));
        }
        Ok(TxnLoop {
            finished: false,
            scratch: Scratch::new(c"etc_batch item"),
        })
    }

    /// Runs one item of the loop (a step, a chunk) with a fresh scratch memory context
    /// as the current one; whatever PostgreSQL allocated for the previous item is freed.
    pub fn item<R>(&mut self, work: impl FnOnce(&mut Self) -> R) -> R {
        let scratch = self.scratch;
        scratch.round(|| work(self))
    }

    /// A procedure may commit only when ExecuteCallStmt handed it a CallContext with
    /// `atomic = false`: that is false inside BEGIN ... COMMIT, under a function or
    /// SELECT, under an EXCEPTION block, and below a procedure with SET or SECURITY
    /// DEFINER, which is exactly where COMMIT would fail half-way through the work.
    unsafe fn may_commit(fcinfo: pg_sys::FunctionCallInfo) -> bool {
        if fcinfo.is_null() {
            return false;
        }
        let context = (*fcinfo).context;
        if context.is_null() || !pgrx::is_a(context, pg_sys::NodeTag::T_CallContext) {
            return false;
        }
        let call = context as *mut pg_sys::CallContext;
        !(*call).atomic && !pg_sys::IsSubTransaction()
    }

    /// Commits the current transaction and starts the next one.
    pub fn commit(&mut self) {
        // SAFETY: we are connected non-atomically (begin), and every nested atomic
        // connection opened by pgrx's Spi has been finished again by the time control
        // comes back here, so SPI_commit sees our own connection on top.
        unsafe { pg_sys::SPI_commit() }
    }

    /// Rolls the current transaction back, locks and all, and starts the next one.
    pub fn rollback(&mut self) {
        // SAFETY: as in commit.
        unsafe { pg_sys::SPI_rollback() }
    }

    /// Rolls the current transaction back after an error raised in it was caught (a
    /// chunk's transient error, retries.rs), and starts the next one, as PostgreSQL's own
    /// loops (autovacuum's, a backend's) abort the transaction an error left behind.
    ///
    /// The error unwound past what the statements in flight had set up and leave to the
    /// abort, which SPI_rollback checks before it aborts:
    /// - their atomic SPI connections (query.rs) are still above ours: they are finished
    ///   first, because SPI_rollback runs on the connection at the top, and only a
    ///   non-atomic one may roll back;
    /// - their active snapshots are still pushed above the CALL's own (its portal's),
    ///   which SPI_rollback counts on being the only ones: they are popped.
    /// The abort then releases everything else the failed statement held: its locks,
    /// buffer pins, registered snapshots and executor state.
    pub fn rollback_after_error(&mut self) {
        // SAFETY: every connection above ours is an atomic one a statement of this
        // transaction opened (nothing non-atomic runs below our statements), so
        // finishing them frees only those statements' memory, which nothing reads
        // again; the loop stops at the first non-atomic connection from the top, ours.
        // Likewise every active snapshot above the portal's was pushed by them.
        unsafe {
            while !pg_sys::SPI_inside_nonatomic_context() {
                if pg_sys::SPI_finish() != pg_sys::SPI_OK_FINISH as i32 {
                    break;
                }
            }
            let portal = pg_sys::ActivePortal;
            let kept = if portal.is_null() {
                std::ptr::null_mut()
            } else {
                (*portal).portalSnapshot
            };
            while pg_sys::ActiveSnapshotSet() && pg_sys::GetActiveSnapshot() != kept {
                pg_sys::PopActiveSnapshot();
            }
            pg_sys::SPI_rollback()
        }
    }

    /// Runs `sql`, a CALL, on this non-atomic connection, so that the procedure it calls
    /// may COMMIT and ROLLBACK as it does when a client CALLs it: whatever it committed
    /// stays committed. Its error is caught and returned, its SQLSTATE and context kept
    /// (raised.rs); the transaction it left is broken then, and `rollback_after_error`
    /// must come next.
    pub fn call(&mut self, sql: &str) -> std::result::Result<(), Failure> {
        let text = CString::new(sql).map_err(|_| {
            Failure::from(BatchError::InvalidCommand {
                detail: "The command contains a zero byte.".into(),
            })
        })?;
        PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
            crate::raised::capturing(|| {
                let options = pg_sys::SPIExecuteOptions {
                    allow_nonatomic: true,
                    ..Default::default()
                };
                // SAFETY: our non-atomic connection is the top of the SPI stack (see
                // commit); allow_nonatomic hands the CALL a non-atomic context.
                let rc = unsafe { pg_sys::SPI_execute_extended(text.as_ptr(), &options) };
                if rc < 0 {
                    return Err(Failure::from(BatchError::Internal(format!(
                        "SPI_execute_extended returned {rc}"
                    ))));
                }
                Ok(())
            })
        }))
        .catch_others(|caught| Err(Failure::from(caught)))
        .execute()
    }

    /// Disconnects SPI after the last commit.
    pub fn finish(mut self) {
        self.finished = true;
        // SAFETY: our connection is the top of the SPI stack (see commit).
        unsafe {
            pg_sys::SPI_finish();
        }
    }
}

impl Drop for TxnLoop {
    fn drop(&mut self) {
        // On an error the transaction's abort pops the SPI stack; finishing here as well
        // would pop a connection that is no longer ours.
        if !self.finished && !std::thread::panicking() {
            unsafe {
                pg_sys::SPI_finish();
            }
        }
    }
}

/// Sleeps `for_how_long` between two transactions of the loop, after a commit, so that it
/// holds nothing (a pace's slot, a wait for the replicas, the backoff before a retry),
/// waking for interrupts: a cancel or a statement_timeout ends the call here with an
/// ERROR, everything committed before kept.
pub fn sleep(for_how_long: std::time::Duration) {
    let until = std::time::Instant::now() + for_how_long;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        // SAFETY: waits on the backend's own latch, as pg_sleep does; interrupts are
        // checked after every wake-up
        unsafe {
            pgrx::pg_sys::WaitLatch(
                pgrx::pg_sys::MyLatch,
                (pgrx::pg_sys::WL_LATCH_SET
                    | pgrx::pg_sys::WL_TIMEOUT
                    | pgrx::pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                left.as_millis().clamp(1, 1000) as std::ffi::c_long,
                pgrx::pg_sys::PG_WAIT_EXTENSION,
            );
            pgrx::pg_sys::ResetLatch(pgrx::pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }
}

/// The id of the current (top-level) transaction, assigned now if it has none, as
/// txid_current() returns it.
pub fn txid_current() -> i64 {
    // SAFETY: assigns an xid if needed, as any write does; raises an ERROR when it cannot.
    unsafe { pg_sys::GetTopFullTransactionId().value as i64 }
}

/// Runs `work` in a subtransaction. On success the subtransaction is released
/// (its writes become part of the enclosing transaction); on an error it is rolled
/// back, so none of `work`'s writes survive, and the error is returned, not raised.
pub fn subtransaction<R>(work: impl FnOnce() -> R) -> std::result::Result<R, Failure> {
    subtransaction_unless(|| Ok::<R, std::convert::Infallible>(work())).map(|r| match r {
        Ok(value) => value,
        Err(never) => match never {},
    })
}

/// As `subtransaction`, but `work` may also decide to roll back by returning `Err`: the
/// subtransaction is rolled back and that `Err` is handed back, inside `Ok`.
pub fn subtransaction_unless<R, E>(
    work: impl FnOnce() -> std::result::Result<R, E>,
) -> std::result::Result<std::result::Result<R, E>, Failure> {
    // SAFETY: the memory context and resource owner are saved before the
    // subtransaction starts and restored after it ends either way, as PL/pgSQL's
    // exception blocks do; BeginInternalSubTransaction switches both.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(memory);

        let mut work = Some(work);
        let outcome =
            PgTryBuilder::new(std::panic::AssertUnwindSafe(
                || Ok((work.take().unwrap())()),
            ))
            .catch_others(|caught| Err(caught))
            .execute();

        let keep = matches!(outcome, Ok(Ok(_)));
        if keep {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(memory);
        pg_sys::CurrentResourceOwner = owner;
        outcome.map_err(Failure::from)
    }
}

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
        assert_eq!(
            unpack_sqlstate(PgSqlErrorCode::ERRCODE_DIVISION_BY_ZERO as i32),
            "22012"
        );
        assert_eq!(
            unpack_sqlstate(PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_TERMINATION as i32),
            "2D000"
        );
        assert_eq!(
            unpack_sqlstate(PgSqlErrorCode::ERRCODE_QUERY_CANCELED as i32),
            "57014"
        );
        assert_eq!(
            unpack_sqlstate(PgSqlErrorCode::ERRCODE_RAISE_EXCEPTION as i32),
            "P0001"
        );
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
