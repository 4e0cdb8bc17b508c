//! Leases: acquire_lease, release_lease, check_lease. The lock helpers (lock_key,
//! try_xact_lock, xact_lock) and the views leases and locks are SQL, in sql/leases.sql and sql/locks.sql.

use crate::error::{required, OrRaise};
use crate::lease::{self, Fence};
use crate::roles::as_owner;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

/// Takes a free or expired lease (its generation goes up by one), renews the caller's
/// own (same generation), or reports who holds it. One statement, no session state.
#[pg_extern(volatile, parallel_unsafe)]
fn acquire_lease(
    name: Option<String>,
    holder: Option<String>,
    ttl: Option<Interval>,
) -> TableIterator<
    'static,
    (
        name!(acquired, bool),
        name!(holder, String),
        name!(generation, i64),
        name!(expires_at, TimestampWithTimeZone),
    ),
> {
    crate::standby::refuse_writes("etc_batch.acquire_lease").or_raise();
    let name = required(name, "name").or_raise();
    let holder = required(holder, "holder").or_raise();
    let ttl = required(ttl, "ttl").or_raise();
    let a = lease::acquire(&name, &holder, ttl).or_raise();
    TableIterator::once((a.acquired, a.holder, a.generation, a.expires_at))
}

/// Ends the caller's lease now; its generation stays, so the next holder gets a new one.
#[pg_extern(volatile, parallel_unsafe)]
fn release_lease(name: Option<String>, holder: Option<String>) -> bool {
    crate::standby::refuse_writes("etc_batch.release_lease").or_raise();
    let name = required(name, "name").or_raise();
    let holder = required(holder, "holder").or_raise();
    lease::release(&name, &holder).or_raise()
}

/// Raises SQLSTATE 0B000 unless `holder` still holds `generation` of the lease,
/// unexpired. Until the calling transaction ends, the lease cannot change hands.
#[pg_extern(volatile, parallel_unsafe)]
fn check_lease(name: Option<String>, holder: Option<String>, generation: Option<i64>) {
    crate::standby::refuse_writes("etc_batch.check_lease").or_raise();
    let fence = Fence::from_args(
        Some(required(name, "name").or_raise()),
        Some(required(holder, "holder").or_raise()),
        Some(required(generation, "generation").or_raise()),
    )
    .or_raise()
    .expect("all three arguments are given");
    as_owner(|| fence.check()).or_raise()
}
