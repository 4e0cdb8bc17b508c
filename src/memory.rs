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
}
