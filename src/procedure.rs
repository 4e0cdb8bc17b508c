//! A C-language procedure that commits: how PostgreSQL calls one, how it reads its
//! arguments, and how it hands back its INOUT results.
//!
//! `#[pg_extern]` makes functions, which always run atomically. A procedure that commits
//! between steps or chunks is declared by hand (sql/procedures.sql) as LANGUAGE c, and
//! its library side is written here once: the V1 info record, the check that it was
//! CALLed where it may commit (txn::TxnLoop::begin), its arguments read by name from its
//! `Signature`, and its INOUT row built in the memory context the caller reads it from.
//! An api file declares a procedure with `c_procedure!` and only converts.
//!
//! Each `Signature` states the arguments exactly as `pg_get_function_arguments` prints
//! the installed procedure; a test compares the two, so the declaration in SQL and what
//! the library reads cannot drift apart.

use crate::error::{required, BatchError, OrRaise, Result};
use crate::txn::TxnLoop;
use pgrx::datum::{FromDatum, IntoDatum};
use pgrx::pg_sys;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    In,
    InOut,
}

/// One argument as the procedure's CREATE PROCEDURE declares it.
#[derive(Debug)]
pub struct Arg {
    pub name: &'static str,
    /// As format_type prints it: `text`, `bigint`, `text[]`.
    pub sql_type: &'static str,
    /// The default as PostgreSQL prints it (`NULL::integer`, `true`), if any.
    pub default: Option<&'static str>,
    pub mode: Mode,
}

/// A procedure's name and arguments, in order.
#[derive(Debug)]
pub struct Signature {
    /// Schema-qualified, as it appears in messages: `etc_batch.drain_job`.
    pub name: &'static str,
    pub args: &'static [Arg],
}

impl Signature {
    /// The arguments as `pg_get_function_arguments` prints them.
    pub fn arguments(&self) -> String {
        self.args
            .iter()
            .map(|a| {
                // a procedure's arguments always print with their mode
                let mode = match a.mode {
                    Mode::In => "IN ",
                    Mode::InOut => "INOUT ",
                };
                let default = a
                    .default
                    .map(|d| format!(" DEFAULT {d}"))
                    .unwrap_or_default();
                format!("{mode}{} {}{default}", a.name, a.sql_type)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.args
            .iter()
            .position(|a| a.name == name)
            .ok_or_else(|| {
                BatchError::Internal(format!("{} has no argument \"{name}\"", self.name))
            })
    }

    fn results(&self) -> usize {
        self.args.iter().filter(|a| a.mode == Mode::InOut).count()
    }
}

/// The arguments of one call, read by name.
pub struct Args {
    fcinfo: pg_sys::FunctionCallInfo,
    signature: &'static Signature,
}

impl Args {
    /// The argument called `name`, or None when it is NULL.
    pub fn get<T: FromDatum>(&self, name: &str) -> Result<Option<T>> {
        let n = self.signature.position(name)?;
        // SAFETY: fcinfo is the call PostgreSQL is making (see run), which has checked
        // that it carries exactly the signature's arguments.
        Ok(unsafe { pgrx::fcinfo::pg_getarg(self.fcinfo, n) })
    }

    /// The argument called `name`, which must not be NULL.
    pub fn required<T: FromDatum>(&self, name: &'static str) -> Result<T> {
        required(self.get(name)?, name)
    }
}

/// The INOUT results of a procedure, in the order it declares them.
pub trait Results {
    fn datums(self) -> Vec<Option<pg_sys::Datum>>;
}

impl Results for () {
    fn datums(self) -> Vec<Option<pg_sys::Datum>> {
        Vec::new()
    }
}

impl<A: IntoDatum, B: IntoDatum, C: IntoDatum, D: IntoDatum, E: IntoDatum> Results
    for (A, B, C, D, E)
{
    fn datums(self) -> Vec<Option<pg_sys::Datum>> {
        vec![
            self.0.into_datum(),
            self.1.into_datum(),
            self.2.into_datum(),
            self.3.into_datum(),
            self.4.into_datum(),
        ]
    }
}

/// Runs a procedure that commits, for the C function PostgreSQL called: checks that the
/// CALL may commit and connects SPI non-atomically (TxnLoop), hands `body` the arguments
/// and the loop, disconnects, and returns the INOUT row, or raises the error.
///
/// # Safety
/// `fcinfo` must be the call info PostgreSQL passed to the running C function, declared
/// in SQL with `signature`'s arguments.
pub unsafe fn run<R: Results>(
    fcinfo: pg_sys::FunctionCallInfo,
    signature: &'static Signature,
    body: impl FnOnce(&Args, &mut TxnLoop) -> Result<R>,
) -> pg_sys::Datum {
    // The result row is built where the caller will read it: the memory context current
    // at entry, which outlives the commits (SPI's own contexts do not).
    let caller_context = pg_sys::CurrentMemoryContext;
    let results = (|| {
        let declared = (*fcinfo).nargs as usize;
        if declared != signature.args.len() {
            // Declared otherwise than the library reads it: the database's etc_batch is
            // of another version (the gate says so), or the declaration is wrong.
            crate::installed::owner()?;
            return Err(BatchError::Internal(format!(
                "{} was called with {declared} arguments, but the library reads {}",
                signature.name,
                signature.args.len()
            )));
        }
        crate::standby::refuse_writes(signature.name)?;
        let mut tx = TxnLoop::begin(fcinfo, signature.name)?;
        let results = body(&Args { fcinfo, signature }, &mut tx)?;
        tx.finish();
        Ok(results.datums())
    })()
    .or_raise();
    pg_sys::MemoryContextSwitchTo(caller_context);
    result_datum(fcinfo, signature, results).or_raise()
}

/// The procedure's result: nothing without INOUT arguments, the value itself with one,
/// a row of them with several, as ExecuteCallStmt expects.
unsafe fn result_datum(
    fcinfo: pg_sys::FunctionCallInfo,
    signature: &Signature,
    mut values: Vec<Option<pg_sys::Datum>>,
) -> Result<pg_sys::Datum> {
    if values.len() != signature.results() {
        return Err(BatchError::Internal(format!(
            "{} returns {} results, but declares {} INOUT arguments",
            signature.name,
            values.len(),
            signature.results()
        )));
    }
    match values.len() {
        0 => {
            (*fcinfo).isnull = true;
            Ok(pg_sys::Datum::from(0))
        }
        1 => {
            let value = values.pop().flatten();
            (*fcinfo).isnull = value.is_none();
            Ok(value.unwrap_or(pg_sys::Datum::from(0)))
        }
        _ => {
            let mut tupdesc: pg_sys::TupleDesc = std::ptr::null_mut();
            if pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut tupdesc)
                != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE
            {
                return Err(BatchError::Internal(format!(
                    "{} was not declared with INOUT arguments",
                    signature.name
                )));
            }
            let tupdesc = pg_sys::BlessTupleDesc(tupdesc);
            let mut nulls: Vec<bool> = values.iter().map(Option::is_none).collect();
            let mut datums: Vec<pg_sys::Datum> = values
                .into_iter()
                .map(|v| v.unwrap_or(pg_sys::Datum::from(0)))
                .collect();
            let tuple = pg_sys::heap_form_tuple(tupdesc, datums.as_mut_ptr(), nulls.as_mut_ptr());
            Ok(pg_sys::heap_copy_tuple_as_datum(tuple, tupdesc))
        }
    }
}

/// Declares the C function behind a procedure that commits: its exported symbol (the
/// name sql/procedures.sql gives after MODULE_PATHNAME), its V1 info record, and the
/// body, a `fn(&Args, &mut TxnLoop) -> Result<impl Results>` run by `procedure::run`.
macro_rules! c_procedure {
    ($symbol:ident, $info:ident, $signature:expr, $body:expr) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $info() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record =
                ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        /// # Safety
        /// Called by PostgreSQL only, with the call info of a CALL of this procedure.
        #[::pgrx::pg_guard]
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $symbol(
            fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
        ) -> ::pgrx::pg_sys::Datum {
            $crate::procedure::run(fcinfo, &$signature, $body)
        }
    };
}
pub(crate) use c_procedure;

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: Signature = Signature {
        name: "etc_batch.example",
        args: &[
            Arg {
                name: "job_id",
                sql_type: "text",
                default: None,
                mode: Mode::In,
            },
            Arg {
                name: "status",
                sql_type: "text",
                default: Some("NULL::text"),
                mode: Mode::InOut,
            },
        ],
    };

    #[test]
    fn arguments_print_as_postgres_prints_them() {
        assert_eq!(
            EXAMPLE.arguments(),
            "IN job_id text, INOUT status text DEFAULT NULL::text"
        );
        assert_eq!(EXAMPLE.results(), 1);
        assert_eq!(EXAMPLE.position("status"), Ok(1));
        assert!(EXAMPLE.position("nope").is_err());
    }
}
