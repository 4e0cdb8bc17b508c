//! Transactions of a background worker, which no client's statement wraps: the worker
//! starts and ends them itself.
//!
//! A worker's loop of work (a drain, a chain) runs in the same `CallLoop` a CALL runs in,
//! under a portal made to stand for the CALL's, as pg_partman's worker does: SPI's
//! non-atomic statements take their outer snapshot from the active portal, and
//! SPI_commit counts on the portal's snapshot being the only one active. Its bookkeeping
//! (the launch's rows) runs in short transactions of its own.

use super::CallLoop;
use crate::error::Result;
use pgrx::pg_sys;
use pgrx::PgTryBuilder;

/// Runs `work` in a transaction of its own, under a snapshot of its own (SPI plans and
/// catalog lookups need an outer one, which a CALL's portal gives a backend), committed
/// if `work` returns; an ERROR raised in it propagates, and the transaction is aborted
/// with the worker.
pub fn in_transaction<R>(work: impl FnOnce() -> R) -> R {
    // SAFETY: called between transactions of a worker, never inside one.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = work();
    // SAFETY: the transaction started above, with every SPI connection of `work` finished
    // and its snapshot the one on top.
    unsafe {
        pg_sys::PopActiveSnapshot();
        pg_sys::CommitTransactionCommand();
    }
    result
}

/// Runs a loop of work in a `CallLoop` of the worker's own, and ends its last
/// transaction: committed when `work` returns (Ok or Err, each of which says how the work
/// ended); aborted when it raises an ERROR, which is caught and handed back, so that the
/// worker can record it in a transaction of its own.
pub fn run_loop<R>(
    work: impl FnOnce(&mut CallLoop) -> Result<R>,
) -> std::result::Result<Result<R>, super::Failure> {
    // SAFETY: called between transactions of a worker; the portal lives outside every
    // transaction (it is made before the first starts), so no commit of the loop drops it.
    let portal = unsafe {
        let portal = pg_sys::CreateNewPortal();
        (*portal).visible = false;
        (*portal).resowner = pg_sys::CurrentResourceOwner;
        pg_sys::ActivePortal = portal;
        pg_sys::PortalContext = (*portal).portalContext;
        portal
    };
    // The caught error is as large as pgrx makes it; it becomes a Failure below.
    #[allow(clippy::result_large_err)]
    let outcome = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
        // SAFETY: no transaction is open; the loop's first one starts here.
        let connected = unsafe {
            pg_sys::SetCurrentStatementStartTimestamp();
            pg_sys::StartTransactionCommand();
            CallLoop::in_worker()
        };
        let result = connected.and_then(|mut tx| {
            // SAFETY: the portal is the active one, and has no snapshot yet
            unsafe { pg_sys::EnsurePortalSnapshotExists() };
            let result = work(&mut tx);
            tx.finish();
            result
        });
        // SAFETY: the loop's last transaction, with SPI finished: its portal's snapshot
        // (if a statement left one) goes before it commits.
        unsafe {
            if pg_sys::ActiveSnapshotSet() {
                pg_sys::PopActiveSnapshot();
            }
            pg_sys::CommitTransactionCommand();
        }
        Ok::<Result<R>, pgrx::pg_sys::panic::CaughtError>(result)
    }))
    .catch_others(Err)
    .execute();
    // SAFETY: after an error the transaction is aborted (which releases its locks, its SPI
    // stack and its snapshots); the portal goes either way.
    unsafe {
        if outcome.is_err() {
            pg_sys::AbortCurrentTransaction();
        }
        // it never ran a query of its own: done, for PortalDrop, which refuses a portal
        // still being set up
        (*portal).status = pg_sys::PortalStatus::PORTAL_DONE;
        pg_sys::PortalDrop(portal, false);
        pg_sys::ActivePortal = std::ptr::null_mut();
        pg_sys::PortalContext = std::ptr::null_mut();
    }
    outcome.map_err(super::Failure::from)
}
