//! Settings changed for the span of one closure, as a function's SET clause changes them.

use pgrx::pg_sys;
use std::ffi::{CStr, CString};

/// Settings under which a value prints the same text in every session, whatever the
/// session's own: for SQL that keeps a row's or a key's text (a row digest, a key of a
/// date or timestamp type) and compares it later, perhaps in another session.
pub const STABLE_OUTPUT: &[(&CStr, &str)] = &[
    (c"DateStyle", "ISO, YMD"),
    (c"IntervalStyle", "postgres"),
    (c"TimeZone", "UTC"),
    (c"extra_float_digits", "1"),
    (c"bytea_output", "hex"),
    (c"lc_monetary", "C"),
];

/// Runs `work` with each setting (name, value) in force, at a nesting level of its own:
/// undone when `work` returns, whatever `work` itself SET meanwhile ("false" below undoes
/// every change made at the level, as a subtransaction abort would; "true" would keep
/// plain SETs for the rest of the session). On an error the enclosing (sub)transaction's
/// abort undoes them.
pub fn with<R>(settings: &[(&CStr, &str)], work: impl FnOnce() -> R) -> R {
    let level = unsafe { pg_sys::NewGUCNestLevel() };
    for (name, value) in settings {
        // One that holds the value already is left as it is: setting search_path throws
        // away the schemas looked up for it, which the next statement looks up again.
        // The level undoes what `work` sets either way.
        if !holds(name, value) {
            set(name, value, pg_sys::GucAction::GUC_ACTION_SAVE);
        }
    }
    let result = work();
    unsafe { pg_sys::AtEOXact_GUC(false, level) };
    result
}

/// Runs `work` under STABLE_OUTPUT when `stable` (a statement that prints rows or keys
/// as text, or takes digests of rows), as it is otherwise.
pub fn stable_output_if<R>(stable: bool, work: impl FnOnce() -> R) -> R {
    with(if stable { STABLE_OUTPUT } else { &[] }, work)
}

/// Sets `name` to `value` for the session, as SET does, and returns the value it had:
/// for work that commits on its way, across which a setting of `with` would not last
/// (a commit ends every nesting level). The caller sets the old value back afterwards.
pub fn set_in_session(name: &CStr, value: &str) -> String {
    let old = current(name).unwrap_or_default();
    set(name, value, pg_sys::GucAction::GUC_ACTION_SET);
    old
}

/// A setting's value (as the configuration gives it, without units), or None for a
/// setting that does not exist. Read for etc_batch's own decisions, so whatever the
/// caller's privileges: shared_preload_libraries is hidden from roles without
/// pg_read_all_settings, and a launch by one must still know whether it is preloaded.
pub fn current(name: &CStr) -> Option<String> {
    // SAFETY: GetConfigOption returns a string of its own (or NULL for a setting that does
    // not exist, missing_ok), copied before anything else can change it.
    unsafe {
        let value = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
    }
}

/// Whether setting `name` reads `value` now, as `current` would give it.
fn holds(name: &CStr, value: &str) -> bool {
    // SAFETY: as in current; the string is compared before anything can change it.
    unsafe {
        let now = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        !now.is_null() && CStr::from_ptr(now).to_bytes() == value.as_bytes()
    }
}

/// Sets a setting as the server's configuration would (a superuser's setting, such as
/// log_min_messages, in a process of etc_batch's own), for the rest of the session.
pub fn set_for_process(name: &CStr, value: &str) {
    let value = CString::new(value).unwrap_or_default();
    // SAFETY: both strings are NUL-terminated and live across the call; an invalid value
    // raises an ERROR.
    unsafe {
        pg_sys::SetConfigOption(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_SESSION,
        )
    };
}

/// Sets one setting as SET does (GUC_ACTION_SET) or as a function's SET clause does
/// (GUC_ACTION_SAVE, undone at the end of its nesting level).
fn set(name: &CStr, value: &str, action: pg_sys::GucAction::Type) {
    let value = CString::new(value).unwrap_or_default();
    // SAFETY: both strings are NUL-terminated and live across the call; an invalid value
    // raises an ERROR, as SET would.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            action,
            true,
            pgrx::PgLogLevel::ERROR as i32,
            false,
        );
    }
}
