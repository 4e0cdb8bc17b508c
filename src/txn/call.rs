//! The driver of a CALLed procedure that commits: its non-atomic SPI connection; and of
//! a background worker's loop of work, which runs in the same kind of connection (see
//! worker.rs).
//!
//! pgrx's `Spi::connect` always connects atomically, so it can never commit. A
//! procedure that commits between rounds instead:
//! 1. proves it was CALLed in a non-atomic context (`CallLoop::begin`),
//! 2. connects with `SPI_OPT_NONATOMIC`,
//! 3. does each round's work with ordinary statements, each on an atomic connection
//!    nested above this one and finished again, and
//! 4. ends each round with `SPI_commit` or `SPI_rollback`, which end the transaction and
//!    start the next.

use super::{Failure, Transactions};
use crate::error::{BatchError, Result};
use crate::memory::Scratch;
use pgrx::pg_sys;
use pgrx::PgTryBuilder;
use std::ffi::CString;

/// A non-atomic SPI connection owned by the running procedure.
pub struct CallLoop {
    finished: bool,
    /// Reset before every round, so a loop over a million chunks uses the memory of one.
    /// A child of SPI's procedure context, which lives until SPI_finish, across commits.
    scratch: Scratch,
}

impl CallLoop {
    /// Checks that the procedure may commit and connects SPI in non-atomic mode.
    ///
    /// # Safety
    /// `fcinfo` must be the call info PostgreSQL passed to the running C function.
    pub unsafe fn begin(fcinfo: pg_sys::FunctionCallInfo, procedure: &str) -> Result<Self> {
        if !Self::may_commit(fcinfo) {
            return Err(BatchError::AtomicContext {
                procedure: procedure.to_string(),
                in_transaction_block: pg_sys::IsTransactionBlock() && !pg_sys::IsSubTransaction(),
            });
        }
        Self::connect()
    }

    /// Connects SPI in non-atomic mode in a background worker's transaction, which the
    /// worker started itself under a portal of its own (worker.rs).
    ///
    /// # Safety
    /// Only in a background worker, inside a transaction it started, with no SPI
    /// connection open.
    pub(super) unsafe fn in_worker() -> Result<Self> {
        Self::connect()
    }

    unsafe fn connect() -> Result<Self> {
        let rc = pg_sys::SPI_connect_ext(pg_sys::SPI_OPT_NONATOMIC as i32);
        if rc != pg_sys::SPI_OK_CONNECT as i32 {
            return Err(BatchError::Internal(format!(
                "SPI_connect_ext returned {rc}"
            )));
        }
        Ok(CallLoop {
            finished: false,
            scratch: Scratch::new(c"etc_batch item"),
        })
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

    /// Disconnects SPI after the last commit.
    pub fn finish(mut self) {
        self.finished = true;
        // the loop's last transaction, which the CALL (or the worker) commits
        super::citus::in_two_phases();
        // SAFETY: our connection is the top of the SPI stack (see commit).
        unsafe {
            pg_sys::SPI_finish();
        }
    }
}

impl Drop for CallLoop {
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

impl Transactions for CallLoop {
    fn item<R>(&mut self, work: impl FnOnce(&mut Self) -> R) -> R {
        super::sync_wait::raise_cancel_used_by_commit();
        let scratch = self.scratch;
        scratch.round(|| work(self))
    }

    fn commit(&mut self) {
        super::citus::in_two_phases();
        // SAFETY: we are connected non-atomically (begin), and every nested atomic
        // connection opened by pgrx's Spi has been finished again by the time control
        // comes back here, so SPI_commit sees our own connection on top.
        super::sync_wait::watching(|| unsafe { pg_sys::SPI_commit() })
    }

    fn rollback(&mut self) {
        // SAFETY: as in commit.
        unsafe { pg_sys::SPI_rollback() }
    }

    /// The error unwound past what the statements in flight had set up and leave to the
    /// abort, which SPI_rollback checks before it aborts:
    /// - their atomic SPI connections (query.rs) are still above ours: they are finished
    ///   first, because SPI_rollback runs on the connection at the top, and only a
    ///   non-atomic one may roll back;
    /// - their active snapshots are still pushed above the CALL's own (its portal's),
    ///   which SPI_rollback counts on being the only ones: they are popped.
    ///
    /// The abort then releases everything else the failed statement held: its locks,
    /// buffer pins, registered snapshots and executor state.
    fn rollback_after_error(&mut self) {
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

    /// On this non-atomic connection, the top of the SPI stack.
    fn call(&mut self, sql: &str) -> std::result::Result<(), Failure> {
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
}
