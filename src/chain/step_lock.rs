//! The lock that keeps a step that commits to one runner while its procedure runs.
//!
//! A step's row lock is the runner's for the span of the step's transaction, and a step
//! that commits has many transactions. So the runner that read the step pending under
//! its row lock also takes this session-level lock before it lets the row go, and keeps
//! it until the step's outcome is recorded: another runner that finds the step pending
//! meanwhile cannot take it, lets the row go, and waits for it (or, with wait => false,
//! says who holds it). A backend that dies lets it go with everything else it held.
//! pg_locks shows it as an advisory lock with objsubid 3 (session_lock.rs).

use crate::session_lock::{SessionLock, Space};

/// The step's lock, held for the session until dropped.
pub struct StepLock(#[allow(dead_code)] SessionLock);

impl StepLock {
    /// The step's lock, if no other runner holds it.
    pub fn try_take(step: i64) -> Option<StepLock> {
        SessionLock::try_exclusive(Space::Step, step).map(StepLock)
    }

    /// Waits until the runner holding the step's lock lets it go.
    pub fn wait_for(step: i64) {
        SessionLock::wait_for(Space::Step, step)
    }
}
