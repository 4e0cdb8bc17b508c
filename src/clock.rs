//! The wall clock, as clock_timestamp() reads it.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;

pub fn now() -> TimestampWithTimeZone {
    let raw = unsafe { pg_sys::GetCurrentTimestamp() };
    TimestampWithTimeZone::try_from(raw).expect("the current time is a valid timestamp")
}
