//! What pg_stat_activity shows while a chain or a job runs: the statement the client
//! sent, prefixed with what etc_batch is doing right now, updated at every step or
//! chunk; and the statement alone again when the call ends.

use pgrx::pg_sys;
use std::ffi::{CStr, CString};

/// The client's statement, as pg_stat_activity showed it when the call began.
pub struct Activity {
    statement: String,
}

impl Activity {
    pub fn begin() -> Activity {
        // SAFETY: debug_query_string is the statement the backend is executing, or NULL.
        let statement = unsafe {
            let q = pg_sys::debug_query_string;
            if q.is_null() {
                String::new()
            } else {
                CStr::from_ptr(q).to_string_lossy().into_owned()
            }
        };
        Activity { statement }
    }

    /// Shows `doing` (one line, e.g. `job "festival": chunk 3 of 4`) before the statement.
    pub fn report(&self, doing: &str) {
        self.show(&format!("/* etc_batch: {doing} */ {}", self.statement));
    }

    fn show(&self, text: &str) {
        if let Ok(text) = CString::new(text) {
            // SAFETY: the text is copied into shared memory (truncated to
            // track_activity_query_size) before this returns.
            unsafe {
                pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_RUNNING, text.as_ptr())
            }
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let statement = self.statement.clone();
            self.show(&statement);
        }
    }
}
