//! An error as the SQL that raised it made it: its own SQLSTATE and its CONTEXT.
//!
//! pgrx turns a PostgreSQL error into a Rust value keeping only the SQLSTATEs it knows
//! (a user-defined one, `RAISE ... USING ERRCODE = 'UE001'`, becomes XX000) and no
//! CONTEXT at all. A step's command and a job's change run `capturing`: an error context
//! callback of ours, called by PostgreSQL while the error is being raised, after the
//! callbacks of the SQL inside have added their context lines, copies the SQLSTATE and
//! the context as they are. When etc_batch raises the error again, `restore_on_raise`
//! installs a second callback that gives them back to the error being raised, in the
//! same way, before PostgreSQL sends it. PostgreSQL's own handler (or the PG_CATCH that
//! catches the error) resets the callback stack afterwards.

use pgrx::pg_sys;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// The SQLSTATE (as PostgreSQL packs it) and the context of an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raised {
    pub code: i32,
    pub context: Option<String>,
}

impl Raised {
    /// The same error without the context line that quotes `sql`, a statement of
    /// etc_batch's own that ran the SQL which raised it: that line says nothing of the
    /// error, and a job's change is long.
    pub fn without_statement(mut self, sql: &str) -> Self {
        let line = format!("SQL statement \"{sql}\"");
        self.context = self.context.and_then(|context| {
            let text = context.replace(&format!("\n{line}"), "").replace(&line, "");
            (!text.trim().is_empty()).then_some(text)
        });
        self
    }
}

thread_local! {
    static CAPTURED: RefCell<Option<Raised>> = const { RefCell::new(None) };
    static TO_RESTORE: RefCell<Option<(i32, Raised)>> = const { RefCell::new(None) };
}

// PostgreSQL's error API, which pgrx keeps to itself; callable from a context callback,
// where they change the error being raised.
unsafe extern "C" {
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errcontext_msg(fmt: *const c_char, ...) -> c_int;
    fn set_errcontext_domain(domain: *const c_char) -> c_int;
}

/// Puts PostgreSQL's callback stack back as it was when dropped, on return and unwind
/// alike.
struct Pop(*mut pg_sys::ErrorContextCallback);

impl Drop for Pop {
    fn drop(&mut self) {
        // SAFETY: ours is on top: whatever `work` pushed it popped again (a PG_TRY, or the
        // boundary pgrx puts around every call into PostgreSQL, restores the stack as it
        // was when it began).
        unsafe { pg_sys::error_context_stack = self.0 };
    }
}

/// Runs `work` with the error it raises, if any, copied as it is raised; `take` hands
/// the copy over afterwards.
pub fn capturing<R>(work: impl FnOnce() -> R) -> R {
    CAPTURED.with(|c| c.borrow_mut().take());
    // SAFETY: the callback lives in this frame, which outlasts `work`; `Pop` takes it off
    // the stack before the frame ends, however `work` ends.
    let mut callback = pg_sys::ErrorContextCallback {
        previous: unsafe { pg_sys::error_context_stack },
        callback: Some(capture),
        arg: std::ptr::null_mut(),
    };
    let _pop = Pop(callback.previous);
    unsafe { pg_sys::error_context_stack = &mut callback };
    work()
}

/// The error `capturing` copied last, if any.
pub fn take() -> Option<Raised> {
    CAPTURED.with(|c| c.borrow_mut().take())
}

/// Called by PostgreSQL for every report raised below `capturing`, notices included:
/// an ERROR's SQLSTATE and context are copied.
unsafe extern "C-unwind" fn capture(_arg: *mut c_void) {
    // No Rust panic may leave a callback PostgreSQL called.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: CopyErrorData copies the report being raised, out of ErrorContext
        let copied = unsafe {
            let previous = pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
            let data = pg_sys::CopyErrorData();
            let raised = ((*data).elevel >= pgrx::PgLogLevel::ERROR as i32).then(|| Raised {
                code: (*data).sqlerrcode,
                context: (!(*data).context.is_null()).then(|| {
                    CStr::from_ptr((*data).context)
                        .to_string_lossy()
                        .into_owned()
                }),
            });
            pg_sys::FreeErrorData(data);
            pg_sys::MemoryContextSwitchTo(previous);
            raised
        };
        if let Some(raised) = copied {
            CAPTURED.with(|c| *c.borrow_mut() = Some(raised));
        }
    });
}

/// Gives `raised` back to the next ERROR raised with SQLSTATE `raised_as` (the one pgrx
/// knows it by), when PostgreSQL raises it: its own SQLSTATE, its context lines before
/// any that error gets.
pub fn restore_on_raise(raised_as: i32, raised: Raised) {
    thread_local! {
        static CALLBACK: RefCell<pg_sys::ErrorContextCallback> = const {
            RefCell::new(pg_sys::ErrorContextCallback {
                previous: std::ptr::null_mut(),
                callback: None,
                arg: std::ptr::null_mut(),
            })
        };
    }
    TO_RESTORE.with(|r| *r.borrow_mut() = Some((raised_as, raised)));
    // SAFETY: the callback is a thread-local that lives as long as the backend; it goes on
    // top of the stack as it is now, which holds only callbacks of frames that are still
    // there when the error is raised (etc_batch's own are taken off before it raises).
    CALLBACK.with(|cb| unsafe {
        let mut cb = cb.borrow_mut();
        if std::ptr::eq(pg_sys::error_context_stack, &*cb) {
            return;
        }
        cb.previous = pg_sys::error_context_stack;
        cb.callback = Some(restore);
        pg_sys::error_context_stack = &mut *cb;
    });
}

unsafe extern "C-unwind" fn restore(_arg: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: geterrcode reads the report being raised
        let code = unsafe { pg_sys::geterrcode() };
        let Some((_, raised)) = TO_RESTORE.with(|r| {
            let mut r = r.borrow_mut();
            match r.as_ref() {
                Some((raised_as, _)) if *raised_as == code => r.take(),
                _ => None,
            }
        }) else {
            return;
        };
        // SAFETY: errcode and errcontext change the report being raised
        unsafe {
            errcode(raised.code);
            if let Some(context) = raised.context.and_then(|c| CString::new(c).ok()) {
                set_errcontext_domain(std::ptr::null());
                errcontext_msg(c"%s".as_ptr(), context.as_ptr());
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_that_ran_it_is_not_context() {
        let raised = Raised {
            code: 1,
            context: Some(
                "PL/pgSQL function f(jsonb) line 3 at RAISE\nSQL statement \"SELECT f($1)\"".into(),
            ),
        };
        assert_eq!(
            raised
                .clone()
                .without_statement("SELECT f($1)")
                .context
                .as_deref(),
            Some("PL/pgSQL function f(jsonb) line 3 at RAISE")
        );
        assert_eq!(raised.clone().without_statement("SELECT g()"), raised);
        let only = Raised {
            code: 1,
            context: Some("SQL statement \"SELECT f($1)\"".into()),
        };
        assert_eq!(only.without_statement("SELECT f($1)").context, None);
    }
}
