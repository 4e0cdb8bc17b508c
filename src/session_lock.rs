//! Session-level locks in etc_batch's own key spaces of PostgreSQL's advisory locks: held
//! across the commits of a call, let go when it ends (or when its backend dies, with
//! everything else the backend held), and shown in pg_locks as advisory locks whose
//! objsubid is the key space (where pg_advisory_lock(bigint) uses 1 and
//! pg_advisory_lock(int, int) uses 2), classid and objid the high and low 32 bits of the
//! id, so that no lock an application takes can stand for one of them.

use pgrx::pg_sys;

/// What a key space's locks stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// A step that commits, held by the runner inside it (chain/step_lock.rs).
    Step = 3,
    /// A job, held shared by every call draining it, for as long as the call lasts:
    /// what job_progress counts as its drainers, even while one waits between chunks.
    Drainer = 4,
    /// One worker of a launch (launch id and worker number, `launch::slot`), held by the
    /// process that is that worker for as long as it lives: no two processes are ever
    /// the same worker, and a worker whose lock is free is not running.
    Worker = 5,
    /// Launches, cluster-wide and for the span of the launching transaction: launches
    /// count etc_batch's workers one after another (src/launch/start.rs).
    Launches = 6,
    /// A database's supervisor of launches (id 0), held while it lives: one per database.
    Supervisor = 7,
}

/// A session lock, held until dropped.
pub struct SessionLock {
    tag: pg_sys::LOCKTAG,
    mode: pg_sys::LOCKMODE,
}

fn tag(space: Space, id: i64) -> pg_sys::LOCKTAG {
    // a lock of every database is one of database 0, as a shared catalog's are
    let database = match space {
        Space::Launches => pg_sys::Oid::INVALID,
        // SAFETY: reads the backend's database
        _ => unsafe { pg_sys::MyDatabaseId },
    };
    pg_sys::LOCKTAG {
        locktag_field1: database.to_u32(),
        locktag_field2: (id >> 32) as u32,
        locktag_field3: id as u32,
        locktag_field4: space as u16,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

impl SessionLock {
    /// The exclusive lock of `id`, if no other session holds it.
    pub fn try_exclusive(space: Space, id: i64) -> Option<SessionLock> {
        Self::acquire(space, id, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, true)
    }

    /// A shared lock of `id`, which only an exclusive one would keep it waiting for.
    pub fn shared(space: Space, id: i64) -> SessionLock {
        Self::acquire(space, id, pg_sys::ShareLock as pg_sys::LOCKMODE, false)
            .expect("a lock that waits is granted or raises an error")
    }

    fn acquire(space: Space, id: i64, mode: pg_sys::LOCKMODE, skip: bool) -> Option<SessionLock> {
        let tag = tag(space, id);
        // SAFETY: a session lock in the user lock method, as pg_advisory_lock takes it
        let got = unsafe { pg_sys::LockAcquire(&tag, mode, true, skip) };
        // `then`, not `then_some`: a SessionLock made for a lock not granted would be
        // dropped at once, releasing a lock this session does not hold (a WARNING "you
        // don't own a lock of type ExclusiveLock" wherever two runners met)
        (got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL).then(|| SessionLock { tag, mode })
    }

    /// Waits until the session holding the exclusive lock of `id` lets it go.
    pub fn wait_for(space: Space, id: i64) {
        drop(Self::acquire(
            space,
            id,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
            false,
        ));
    }
}

/// The exclusive lock of `id` for the rest of the current transaction, waiting for it.
pub fn transaction_lock(space: Space, id: i64) {
    let tag = tag(space, id);
    // SAFETY: a transaction-level lock in the user lock method, as pg_advisory_xact_lock
    // takes it; released by the transaction's end
    unsafe {
        pg_sys::LockAcquire(
            &tag,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
            false,
            false,
        )
    };
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        // SAFETY: releases the session lock acquire took
        unsafe { pg_sys::LockRelease(&self.tag, self.mode, true) };
    }
}
