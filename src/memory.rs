//! A memory context for one round of repeated work (a step, a chunk, a batch of
//! approved items), reset before each round, so that a loop over a million of them uses
//! the memory of one.

use pgrx::pg_sys;
use std::ffi::CStr;

#[derive(Clone, Copy)]
pub struct Scratch {
    /// A child of the context current when it was made; it goes when that one goes.
    context: pg_sys::MemoryContext,
}

impl Scratch {
    pub fn new(name: &'static CStr) -> Scratch {
        // SAFETY: a new child of the current context, which outlives every round (the
        // caller makes the scratch where its loop begins).
        let context = unsafe {
            pg_sys::AllocSetContextCreateExtended(
                pg_sys::CurrentMemoryContext,
                name.as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            )
        };
        Scratch { context }
    }

    /// Runs one round with the scratch context current; whatever PostgreSQL allocated in
    /// it for the round before is freed first.
    pub fn round<R>(&self, work: impl FnOnce() -> R) -> R {
        // SAFETY: the context is live (see the field); a commit inside `work` returns to
        // the context that was current when it was called.
        let previous = unsafe {
            pg_sys::MemoryContextReset(self.context);
            pg_sys::MemoryContextSwitchTo(self.context)
        };
        let result = work();
        unsafe { pg_sys::MemoryContextSwitchTo(previous) };
        result
    }

    /// Frees the context and all that was left in it, when the loop is done before the
    /// context it was made in is.
    pub fn free(self) {
        // SAFETY: the context is live, and not current (round switches back)
        unsafe { pg_sys::MemoryContextDelete(self.context) };
    }
}

thread_local! {
    /// Whether the transaction's end should hand free memory back (see hand_back).
    static HAND_BACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether the transaction callback below is registered in this backend.
    static REGISTERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Hands memory freed by a large piece of work (a registration of a million items) back
/// to the operating system, now and once more at the end of the transaction, when the
/// statement that called it, and the argument it was given, are freed too: otherwise
/// the C library keeps the freed memory in the backend for as long as the connection
/// lives.
pub fn hand_back() {
    trim();
    HAND_BACK.with(|h| h.set(true));
    if !REGISTERED.with(|r| r.replace(true)) {
        // SAFETY: a callback with the signature PostgreSQL expects, registered once.
        unsafe { pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut()) };
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    if matches!(
        event,
        XACT_EVENT_COMMIT
            | XACT_EVENT_ABORT
            | XACT_EVENT_PARALLEL_COMMIT
            | XACT_EVENT_PARALLEL_ABORT
    ) && HAND_BACK.with(|h| h.replace(false))
    {
        trim();
    }
}

fn trim() {
    // SAFETY: malloc_trim only returns free heap pages; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
