//! Running a piece of work as another role, for the span of one closure.
//!
//! etc_batch does two things as a role other than the caller:
//! - its bookkeeping (batch_log, step_audit) runs as the extension's owner, so that
//!   callers need no write privilege on those tables and cannot forge who added a step;
//! - a step's command runs as the role that added the step, never as the caller, and a
//!   job's change as the role that registered it; restricted when that is not the caller.
//!
//! A switch never spans a commit: PostgreSQL remembers the user at the start of each
//! transaction and restores it on abort, so a switch made before a commit would become
//! the "original" user of the next transaction and survive an error in it.

use crate::error::Result;
use pgrx::pg_sys;
use std::ffi::CStr;

/// The most settings SQL of another author runs with: its search_path, its lock
/// timeout, and what etc_batch adds (roles::as_author's `extra`).
const MAX_SETTINGS: usize = 12;

/// Restores the saved user on drop, on the success path and while unwinding alike.
struct Restore {
    user: pg_sys::Oid,
    context: i32,
}

impl Drop for Restore {
    fn drop(&mut self) {
        unsafe { pg_sys::SetUserIdAndSecContext(self.user, self.context) }
    }
}

/// Runs `work` with `role`'s privileges. SECURITY_LOCAL_USERID_CHANGE makes SET ROLE
/// and SET SESSION AUTHORIZATION fail inside, as in a SECURITY DEFINER function.
pub fn as_role<R>(role: pg_sys::Oid, work: impl FnOnce() -> R) -> R {
    switch_to(role, 0, work)
}

fn switch_to<R>(role: pg_sys::Oid, restrictions: u32, work: impl FnOnce() -> R) -> R {
    let mut user = pg_sys::Oid::INVALID;
    let mut context = 0;
    let added = (pg_sys::SECURITY_LOCAL_USERID_CHANGE | restrictions) as i32;
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(role, context | added);
    }
    let _restore = Restore { user, context };
    work()
}

/// Runs SQL that `author` wrote (a step's command, a job's change, its handler and the
/// target's triggers) for `caller`, in the author's context: the author's privileges and
/// the search_path the author's session had, never the caller's, whose look-alike
/// functions would otherwise run with the author's privileges. Its lock waits are bounded
/// by etc_batch.chunk_lock_timeout (retries.rs), unless that is 0. Settings the SQL changes
/// (SET, SET LOCAL, set_config) end with it, so it cannot change the caller's session or
/// the next step's settings. When author and caller differ it is also a security-restricted
/// operation, as VACUUM and REFRESH MATERIALIZED VIEW run a table owner's code: the SQL
/// cannot create temporary objects or cursors WITH HOLD, LISTEN or DISCARD, which would
/// outlive it in the caller's session. A temporary table is searched before every schema: one planted
/// with a trigger of the author's would run as the caller at the caller's next
/// unqualified INSERT.
///
/// `extra`: settings of etc_batch's own the SQL runs with besides (for a job's SQL that
/// keeps rows' text, settings::STABLE_OUTPUT; for a chunk's change, its plan's).
pub fn as_author<R>(
    author: pg_sys::Oid,
    search_path: &str,
    caller: pg_sys::Oid,
    extra: &[(&CStr, &str)],
    work: impl FnOnce() -> R,
) -> R {
    let restrictions = if author == caller {
        0
    } else {
        pg_sys::SECURITY_RESTRICTED_OPERATION
    };
    let lock_timeout = crate::retries::lock_timeout();
    let mut settings = [(c"search_path", search_path); MAX_SETTINGS];
    let mut set = 1;
    for setting in lock_timeout
        .as_deref()
        .map(|timeout| (c"lock_timeout", timeout))
        .iter()
        .chain(extra)
    {
        settings[set] = *setting;
        set += 1;
    }
    crate::settings::with(&settings[..set], || switch_to(author, restrictions, work))
}

/// Whether a role with this OID exists (it may have been dropped since it was recorded).
pub fn exists(role: pg_sys::Oid) -> bool {
    // SAFETY: a syscache probe by OID.
    unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::AUTHOID as i32,
            pg_sys::Datum::from(role.to_u32()),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        )
    }
}

/// The role running the current statement (current_user).
pub fn current_user() -> pg_sys::Oid {
    unsafe { pg_sys::GetUserId() }
}

/// Runs `work` as the extension's owner: for etc_batch's own bookkeeping only.
pub fn as_owner<R>(work: impl FnOnce() -> Result<R>) -> Result<R> {
    let owner = crate::installed::owner()?;
    as_role(owner, work)
}
