//! A test aid, compiled only with the cargo feature `crash_points`: the setting
//! `etc_batch.crash_at` names a point in a chunk's transaction at which the backend
//! terminates itself, to show what survives a client or backend that dies there. As
//! PostgreSQL builds its own injection points only when configured for testing, the
//! library users install has neither the setting nor the points; `reached` is then
//! nothing at all.

/// The points, in the order a chunk reaches them: after its change, after its audit
/// rows and checkpoint (written one after the other, nothing between them), between it
/// and the next chunk of its transaction (a job whose transactions are sized by time,
/// group.rs), after its COMMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    AfterChange,
    AfterCheckpoint,
    BetweenChunks,
    AfterCommit,
}

impl Point {
    pub fn name(self) -> &'static str {
        match self {
            Point::AfterChange => "after_change",
            Point::AfterCheckpoint => "after_checkpoint",
            Point::BetweenChunks => "between_chunks",
            Point::AfterCommit => "after_commit",
        }
    }
}

#[cfg(feature = "crash_points")]
mod points {
    use super::Point;
    use pgrx::prelude::*;
    use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

    static CRASH_AT: GucSetting<Option<std::ffi::CString>> =
        GucSetting::<Option<std::ffi::CString>>::new(None);

    pub fn register() {
        GucRegistry::define_string_guc(
            c"etc_batch.crash_at",
            c"Test aid: terminate the backend at this point of a job's chunk.",
            c"One of after_change, after_checkpoint (the audit rows are written with it), between_chunks (of one transaction, under a transaction_time), after_commit. Empty (the default) does nothing.",
            &CRASH_AT,
            GucContext::Suset,
            GucFlags::NO_SHOW_ALL,
        );
    }

    /// Terminates the backend (FATAL) if etc_batch.crash_at names `point`.
    pub fn reached(point: Point) {
        let Some(setting) = CRASH_AT.get() else {
            return;
        };
        if setting.to_bytes() == point.name().as_bytes() {
            ereport!(
                PgLogLevel::FATAL,
                PgSqlErrorCode::ERRCODE_ADMIN_SHUTDOWN,
                format!(
                    "etc_batch.crash_at: terminating the backend {}",
                    point.name()
                )
            );
        }
    }
}

#[cfg(feature = "crash_points")]
pub use points::{reached, register};

/// Without the feature there is no setting to register.
#[cfg(not(feature = "crash_points"))]
pub fn register() {}

/// Without the feature no point does anything.
#[cfg(not(feature = "crash_points"))]
#[inline(always)]
pub fn reached(_point: Point) {}
