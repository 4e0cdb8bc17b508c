//! Lock waits and transient errors: the settings `etc_batch.chunk_lock_timeout` and
//! `etc_batch.transient_attempts`, which errors are worth another attempt, and how long
//! to wait before it.
//!
//! A drain shares its tables with the application. Its chunk may queue behind an
//! application transaction's row lock, be chosen as a deadlock's victim, or (under
//! REPEATABLE READ or SERIALIZABLE) lose a serialization race. None of these says
//! anything about the job: the same chunk, tried again a moment later, succeeds. So a
//! chunk's lock waits are bounded, and a chunk that fails for one of these reasons is
//! rolled back with its transaction and tried again, after a backoff that doubles,
//! holding nothing meanwhile.

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PgSqlErrorCode};
use std::time::Duration;

/// Bounds every lock wait of a chunk's change or a chain step's command, in milliseconds;
/// 0: the session's own lock_timeout.
pub static CHUNK_LOCK_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(5000);

/// How many times in all a chunk is tried when it fails with a transient error.
pub static TRANSIENT_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(5);

/// The first backoff; each further one is twice the one before.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest backoff, whatever the number of attempts.
pub const LONGEST_BACKOFF: Duration = Duration::from_secs(10);

pub fn register() {
    GucRegistry::define_int_guc(
        c"etc_batch.chunk_lock_timeout",
        c"Bounds every lock wait inside a job's chunk or a chain's step.",
        c"A chunk that waits longer is rolled back and tried again (see etc_batch.transient_attempts); a step fails with 55P03. 0 leaves the session's lock_timeout in force.",
        &CHUNK_LOCK_TIMEOUT,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"etc_batch.transient_attempts",
        c"How many times in all a job's chunk is tried when it fails with 40001, 40P01 or 55P03.",
        c"Each attempt after the first waits twice as long as the one before it, from 100 ms. After the last, the call fails with the chunk's error and the job stays pending.",
        &TRANSIENT_ATTEMPTS,
        1,
        100,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// The lock_timeout a chunk's change or a step's command runs with, as a setting's
/// value, or None to leave the session's in force.
pub fn lock_timeout() -> Option<String> {
    lock_timeout_setting(CHUNK_LOCK_TIMEOUT.get())
}

fn lock_timeout_setting(milliseconds: i32) -> Option<String> {
    (milliseconds > 0).then(|| format!("{milliseconds}ms"))
}

/// The number of attempts a chunk gets, the first included.
pub fn attempts() -> i32 {
    TRANSIENT_ATTEMPTS.get().max(1)
}

/// Whether an error says nothing about the work, only about its timing: a serialization
/// failure, a deadlock's victim, a lock wait that timed out.
pub fn is_transient(code: i32) -> bool {
    [
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        PgSqlErrorCode::ERRCODE_T_R_DEADLOCK_DETECTED,
        PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
    ]
    .into_iter()
    .any(|transient| transient as i32 == code)
}

/// The wait after failed attempt `attempt` (1 for the first): 100 ms, 200 ms, 400 ms ...,
/// never more than LONGEST_BACKOFF.
pub fn backoff(attempt: i32) -> Duration {
    let doublings = attempt.clamp(1, 32) as u32 - 1;
    FIRST_BACKOFF
        .saturating_mul(1u32.checked_shl(doublings).unwrap_or(u32::MAX))
        .min(LONGEST_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_limit() {
        let waits: Vec<u128> = (1..=5).map(|a| backoff(a).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1600]);
        assert_eq!(backoff(8), Duration::from_secs(10));
        assert_eq!(backoff(100), LONGEST_BACKOFF);
        assert_eq!(backoff(0), FIRST_BACKOFF);
    }

    #[test]
    fn only_timing_errors_are_transient() {
        for code in [
            PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            PgSqlErrorCode::ERRCODE_T_R_DEADLOCK_DETECTED,
            PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        ] {
            assert!(is_transient(code as i32));
        }
        for code in [
            PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
            PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
            PgSqlErrorCode::ERRCODE_DIVISION_BY_ZERO,
            PgSqlErrorCode::ERRCODE_RAISE_EXCEPTION,
        ] {
            assert!(!is_transient(code as i32));
        }
    }

    #[test]
    fn zero_leaves_the_sessions_lock_timeout() {
        assert_eq!(lock_timeout_setting(0), None);
        assert_eq!(lock_timeout_setting(250).as_deref(), Some("250ms"));
    }
}
