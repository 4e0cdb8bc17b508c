//! A step's timeout: the statement timeout PostgreSQL arms for the CALL of
//! exec_batch_from_id, brought forward to the step's deadline while the step runs, and
//! put back afterwards.
//!
//! Setting statement_timeout inside a running statement changes nothing: PostgreSQL arms
//! the timer once, when a client's statement starts, and a procedure's statements and
//! commits do not arm it again. So the step's deadline is armed on the same timer, which
//! ends the step with PostgreSQL's own 57014 "canceling statement due to statement
//! timeout" wherever it is, and the deadline the caller's own statement_timeout set, if
//! any and if sooner, is left as it is.

use pgrx::pg_sys;
use std::ffi::c_int;

// utils/timeout.h; STATEMENT_TIMEOUT is the fourth TimeoutId in PostgreSQL 15 to 18.
const STATEMENT_TIMEOUT: c_int = 3;
unsafe extern "C" {
    fn enable_timeout_at(id: c_int, fin_time: pg_sys::TimestampTz);
    fn disable_timeout(id: c_int, keep_indicator: bool);
    fn get_timeout_active(id: c_int) -> bool;
    fn get_timeout_finish_time(id: c_int) -> pg_sys::TimestampTz;
}

/// Runs `work` (a step's command) under the step's deadline, if it has one: returns what
/// it returned, and whether the deadline had passed when it ended.
pub fn within<R>(milliseconds: Option<i32>, work: impl FnOnce() -> R) -> (R, bool) {
    let timer = milliseconds.map(StepTimer::start);
    let outcome = work();
    let timed_out = timer.as_ref().is_some_and(StepTimer::expired);
    (outcome, timed_out)
}

/// A step's deadline, armed.
pub struct StepTimer {
    deadline: pg_sys::TimestampTz,
    /// The caller's deadline, when its statement_timeout had armed one.
    callers: Option<pg_sys::TimestampTz>,
    /// Whether the step's deadline is the one armed (it is sooner than the caller's).
    armed: bool,
}

impl StepTimer {
    /// Arms `milliseconds` from now, unless the caller's statement ends sooner.
    pub fn start(milliseconds: i32) -> StepTimer {
        // SAFETY: timeout.c's API, used as postgres.c uses it for statement_timeout.
        unsafe {
            let deadline = pg_sys::GetCurrentTimestamp() + milliseconds as i64 * 1000;
            let callers = get_timeout_active(STATEMENT_TIMEOUT)
                .then(|| get_timeout_finish_time(STATEMENT_TIMEOUT));
            let armed = callers.is_none_or(|theirs| deadline < theirs);
            if armed {
                enable_timeout_at(STATEMENT_TIMEOUT, deadline);
            }
            StepTimer {
                deadline,
                callers,
                armed,
            }
        }
    }

    /// Whether the step's own deadline has passed: a 57014 now is the step's timeout,
    /// not the caller's cancel.
    pub fn expired(&self) -> bool {
        // SAFETY: reads the clock.
        self.armed && unsafe { pg_sys::GetCurrentTimestamp() } >= self.deadline
    }
}

impl Drop for StepTimer {
    /// Puts the caller's deadline back, or none, however the step ended.
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // SAFETY: as in start.
        unsafe {
            match self.callers {
                Some(theirs) => enable_timeout_at(STATEMENT_TIMEOUT, theirs),
                None => disable_timeout(STATEMENT_TIMEOUT, false),
            }
        }
    }
}
