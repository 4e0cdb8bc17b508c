//! The lock that keeps a step that commits to one runner while its procedure runs.
//!
//! A step's row lock is the runner's for the span of the step's transaction, and a step
//! that commits has many transactions. So the runner that read the step pending under
//! its row lock also takes this session-level lock before it lets the row go, and keeps
//! it until the step's outcome is recorded: another runner that finds the step pending
//! meanwhile cannot take it, lets the row go, and waits for it (or, with wait => false,
//! says who holds it). A backend that dies lets it go with everything else it held.
//!
//! It is an advisory lock in a key space of etc_batch's own (the fourth field 3, where
//! pg_advisory_lock(bigint) uses 1 and pg_advisory_lock(int, int) uses 2), so no lock
//! an application takes can stand for it; pg_locks shows it as an advisory lock with
//! objsubid 3, classid and objid the step id's high and low 32 bits.

use pgrx::pg_sys;

/// The step's lock, held for the session until dropped.
pub struct StepLock {
    tag: pg_sys::LOCKTAG,
}

fn tag(step: i64) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: reads the backend's database
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (step >> 32) as u32,
        locktag_field3: step as u32,
        locktag_field4: 3,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

impl StepLock {
    /// The step's lock, if no other runner holds it.
    pub fn try_take(step: i64) -> Option<StepLock> {
        let tag = tag(step);
        // SAFETY: a session lock in the user lock method, as pg_try_advisory_lock takes it
        let got = unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as i32, true, true) };
        (got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL).then_some(StepLock { tag })
    }

    /// Waits until the runner holding the step's lock lets it go, and lets it go too.
    pub fn wait_for(step: i64) {
        let tag = tag(step);
        // SAFETY: as in try_take, waiting (a cancel or lock_timeout ends the wait)
        unsafe {
            pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as i32, true, false);
            pg_sys::LockRelease(&tag, pg_sys::ExclusiveLock as i32, true);
        }
    }
}

impl Drop for StepLock {
    fn drop(&mut self) {
        // SAFETY: releases the session lock try_take took
        unsafe { pg_sys::LockRelease(&self.tag, pg_sys::ExclusiveLock as i32, true) };
    }
}
