//! Whether a commit's wait for the synchronous standbys was cancelled.
//!
//! A commit that waits for the standbys of `synchronous_standby_names` (PostgreSQL's
//! SyncRepWaitForLSN) and is cancelled meanwhile (pg_cancel_backend, a client's cancel
//! request, statement_timeout) stops waiting: the transaction stays committed on this
//! server, PostgreSQL warns that it "might not have been replicated", and the cancel is
//! used up. The call would go on to its next chunk or step as if nothing had happened,
//! and tell its client of a commit a failover to the standby may lose. PostgreSQL says
//! so only in that WARNING, so the commit is watched for it: an emit_log_hook, set only
//! for the span of the commit, knows the WARNING by its untranslated message.

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::pg_sys;

const CANCELED: &CStr = c"canceling wait for synchronous replication due to user request";

thread_local! {
    /// Set by the hook when the last commit's wait was cancelled; taken by `take`.
    static SEEN: Cell<bool> = const { Cell::new(false) };
    /// The hook that was in place before ours, for the span of a commit.
    static PREVIOUS: Cell<pg_sys::emit_log_hook_type> = const { Cell::new(None) };
}

/// Runs `commit` watching for its synchronous wait being cancelled; `take` says whether
/// it was.
pub fn watching(commit: impl FnOnce()) {
    struct Restore(pg_sys::emit_log_hook_type);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: the backend's hook, set back as it was, on any way out
            unsafe { pg_sys::emit_log_hook = self.0 };
        }
    }
    // SAFETY: one backend, one thread: the hook is ours until Restore sets it back
    let previous = unsafe { pg_sys::emit_log_hook };
    PREVIOUS.with(|p| p.set(previous));
    let _restore = Restore(previous);
    unsafe { pg_sys::emit_log_hook = Some(seen) };
    commit();
}

/// Whether the wait of a commit watched since the last call was cancelled.
pub fn take() -> bool {
    SEEN.with(|s| s.replace(false))
}

/// After a cancel the commit used up and no one took (a commit of etc_batch's own
/// bookkeeping between chunks or steps, a pace's slot, not of the work): the cancel is
/// raised here, before the next round of work begins, as the cancel it was. Were it only
/// made pending again, a chunk would start and be interrupted half-way, and recording
/// that failure would commit, and wait for the standby again, with no cancel left to
/// end that wait.
pub fn raise_cancel_used_by_commit() {
    if take() {
        // SAFETY: what the SIGINT handler sets; CHECK_FOR_INTERRUPTS then raises
        // "canceling statement due to user request", or later if interrupts are held
        unsafe {
            pg_sys::QueryCancelPending = 1;
            pg_sys::InterruptPending = 1;
        }
        pgrx::check_for_interrupts!();
    }
}

unsafe extern "C-unwind" fn seen(edata: *mut pg_sys::ErrorData) {
    // SAFETY: PostgreSQL hands the hook a valid ErrorData for the report being emitted
    unsafe {
        let data = &*edata;
        if data.elevel == pg_sys::WARNING as i32
            && !data.message_id.is_null()
            && CStr::from_ptr(data.message_id) == CANCELED
        {
            SEEN.with(|s| s.set(true));
        }
        if let Some(previous) = PREVIOUS.with(|p| p.get()) {
            previous(edata);
        }
    }
}
