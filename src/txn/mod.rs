//! Transaction control: the only module that commits, rolls back, or opens
//! subtransactions by hand.
//!
//! A loop of work that commits as it goes (a drain, a chain) runs in `Transactions`:
//! each round of its work (a chunk, a step, a wait) is one transaction, and the loop
//! alone ends it, with `commit` or `rollback`, never the work inside. Two drivers run
//! such a loop: a CALL's non-atomic SPI connection (`call::CallLoop`), and a background
//! worker's own transactions. The work in a round uses the ordinary statement API
//! (src/query.rs), which opens and finishes its own SPI connection per statement, so
//! nothing of SPI is held across a commit.
//!
//! PostgreSQL releases everything of a failed transaction itself (the SPI stack
//! included), so the only cleanup owed here is on the success path.

mod call;
mod citus;
mod failure;
mod sync_wait;
pub mod worker;

pub use call::CallLoop;
pub use failure::{unpack_sqlstate, with_context, Failure, FailureKind};

use pgrx::pg_sys;
use pgrx::PgTryBuilder;

/// The transactions a loop of work runs in, one per round. As `dyn Transactions` (what
/// a chain's step delegate is handed) it ends transactions, and runs no rounds.
pub trait Transactions {
    /// Runs one round of the loop (a step, a chunk) with a fresh scratch memory context
    /// as the current one; whatever PostgreSQL allocated for the round before is freed.
    fn item<R>(&mut self, work: impl FnOnce(&mut Self) -> R) -> R
    where
        Self: Sized;

    /// Commits the current transaction and starts the next one.
    fn commit(&mut self);

    /// Rolls the current transaction back, locks and all, and starts the next one.
    fn rollback(&mut self);

    /// Rolls the current transaction back after an error raised in it was caught (a
    /// chunk's transient error, a step's failure that must not end the loop), and starts
    /// the next one, as PostgreSQL's own loops (autovacuum's, a backend's) abort the
    /// transaction an error left behind.
    fn rollback_after_error(&mut self);

    /// Runs `sql`, a CALL, in the loop's own non-atomic context, so that the procedure it
    /// calls may COMMIT and ROLLBACK as it does when a client CALLs it: whatever it
    /// committed stays committed. Its error is caught and returned, its SQLSTATE and
    /// context kept (raised.rs); the transaction it left is broken then, and
    /// `rollback_after_error` must come next.
    fn call(&mut self, sql: &str) -> std::result::Result<(), Failure>;
}

/// Whether the last commit of the loop stayed unconfirmed by the synchronous standbys it
/// waited for, because a cancel ended the wait (txn/sync_wait.rs): asked right after a
/// commit of the work, whose caller must then not tell of it as of any other. A cancel
/// that no one asks about ends the call at the loop's next round.
pub fn last_commit_unconfirmed() -> bool {
    sync_wait::take()
}

/// Sleeps `for_how_long` between two transactions of the loop, after a commit, so that it
/// holds nothing (a pace's slot, a wait for the replicas, the backoff before a retry),
/// waking for interrupts: a cancel or a statement_timeout ends the call here with an
/// ERROR, everything committed before kept.
pub fn sleep(for_how_long: std::time::Duration) {
    let until = std::time::Instant::now() + for_how_long;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        // SAFETY: waits on the backend's own latch, as pg_sleep does; interrupts are
        // checked after every wake-up
        unsafe {
            pgrx::pg_sys::WaitLatch(
                pgrx::pg_sys::MyLatch,
                (pgrx::pg_sys::WL_LATCH_SET
                    | pgrx::pg_sys::WL_TIMEOUT
                    | pgrx::pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                left.as_millis().clamp(1, 1000) as std::ffi::c_long,
                pgrx::pg_sys::PG_WAIT_EXTENSION,
            );
            pgrx::pg_sys::ResetLatch(pgrx::pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }
}

/// The id of the current (top-level) transaction, assigned now if it has none, as
/// txid_current() returns it.
pub fn txid_current() -> i64 {
    // SAFETY: assigns an xid if needed, as any write does; raises an ERROR when it cannot.
    unsafe { pg_sys::GetTopFullTransactionId().value as i64 }
}

/// Runs `work` in a subtransaction. On success the subtransaction is released
/// (its writes become part of the enclosing transaction); on an error it is rolled
/// back, so none of `work`'s writes survive, and the error is returned, not raised.
pub fn subtransaction<R>(work: impl FnOnce() -> R) -> std::result::Result<R, Failure> {
    subtransaction_unless(|| Ok::<R, std::convert::Infallible>(work())).map(|r| match r {
        Ok(value) => value,
        Err(never) => match never {},
    })
}

/// As `subtransaction`, but `work` may also decide to roll back by returning `Err`: the
/// subtransaction is rolled back and that `Err` is handed back, inside `Ok`.
pub fn subtransaction_unless<R, E>(
    work: impl FnOnce() -> std::result::Result<R, E>,
) -> std::result::Result<std::result::Result<R, E>, Failure> {
    // SAFETY: the memory context and resource owner are saved before the
    // subtransaction starts and restored after it ends either way, as PL/pgSQL's
    // exception blocks do; BeginInternalSubTransaction switches both.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(memory);

        let mut work = Some(work);
        // The caught error is as large as pgrx makes it; it becomes a Failure below.
        #[allow(clippy::result_large_err)]
        let outcome =
            PgTryBuilder::new(std::panic::AssertUnwindSafe(
                || Ok((work.take().unwrap())()),
            ))
            .catch_others(Err)
            .execute();

        let keep = matches!(outcome, Ok(Ok(_)));
        if keep {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(memory);
        pg_sys::CurrentResourceOwner = owner;
        outcome.map_err(Failure::from)
    }
}
