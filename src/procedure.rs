//! A C-language procedure that commits: how PostgreSQL calls one, how it reads its
//! arguments, and how it hands back its INOUT results.
//!
//! `#[pg_extern]` makes functions, which always run atomically. A procedure that commits
//! between steps or chunks is declared by hand, once, in sql/procedures.sql, as LANGUAGE
//! c; its library side is written here once: the V1 info record, the check that it was
//! CALLed where it may commit (txn::CallLoop::begin), its arguments read by the names
//! the catalog gives the procedure that was called, and its INOUT row built, by the
//! names of a result struct's fields, in the memory context the caller reads it from. An
//! api file declares the library side with `c_procedure!` and only converts; nothing of
//! the declaration is written twice, so nothing can drift apart.

use crate::error::{required, BatchError, OrRaise, Result};
use crate::txn::CallLoop;
use pgrx::datum::FromDatum;
use pgrx::pg_catalog::pg_proc::{PgProc, ProArgMode};
use pgrx::pg_sys;

/// The arguments of one call, read by the names the procedure declares.
pub struct Args {
    fcinfo: pg_sys::FunctionCallInfo,
    /// The declared name of each argument, in order, and whether it is INOUT.
    declared: Vec<(String, bool)>,
    name: String,
}

impl Args {
    /// The called procedure's declaration, from the catalog.
    ///
    /// # Safety
    /// `fcinfo` is the call info PostgreSQL passed to the running C function.
    unsafe fn of(fcinfo: pg_sys::FunctionCallInfo) -> Result<Args> {
        let oid = (*(*fcinfo).flinfo).fn_oid;
        let proc = PgProc::new(oid).ok_or_else(|| {
            BatchError::Internal(format!("procedure {} is not in the catalog", oid.to_u32()))
        })?;
        let modes = proc.proargmodes();
        let declared = proc
            .proargnames()
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let inout = matches!(modes.get(i), Some(ProArgMode::InOut));
                (name.unwrap_or_default(), inout)
            })
            .collect();
        // SAFETY: a catalog lookup by OID; the name is palloc'd, copied and freed here
        let name = {
            let name = pg_sys::get_func_name(oid);
            let copied = std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned();
            pg_sys::pfree(name.cast());
            format!("etc_batch.{copied}")
        };
        Ok(Args {
            fcinfo,
            declared,
            name,
        })
    }

    /// The procedure's name, schema-qualified, as messages give it.
    pub fn procedure(&self) -> &str {
        &self.name
    }

    fn position(&self, name: &str) -> Result<usize> {
        self.declared
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| {
                BatchError::Internal(format!("{} has no argument \"{name}\"", self.name))
            })
    }

    /// The argument called `name`, or None when it is NULL.
    pub fn get<T: FromDatum>(&self, name: &str) -> Result<Option<T>> {
        let n = self.position(name)?;
        // SAFETY: fcinfo is the call PostgreSQL is making, with the arguments the
        // catalog declares, of which this is one.
        Ok(unsafe { pgrx::fcinfo::pg_getarg(self.fcinfo, n) })
    }

    /// The argument called `name`, which must not be NULL.
    pub fn required<T: FromDatum>(&self, name: &'static str) -> Result<T> {
        required(self.get(name)?, name)
    }

    /// The INOUT arguments' names, in order: the columns of the procedure's result.
    fn results(&self) -> impl Iterator<Item = &str> {
        self.declared
            .iter()
            .filter(|(_, inout)| *inout)
            .map(|(n, _)| n.as_str())
    }
}

/// The INOUT results of a procedure, by the names it declares them with.
pub trait Results {
    fn named(self) -> Vec<(&'static str, Option<pg_sys::Datum>)>;
}

impl Results for () {
    fn named(self) -> Vec<(&'static str, Option<pg_sys::Datum>)> {
        Vec::new()
    }
}

/// A struct whose fields are a procedure's INOUT results, each named as the procedure
/// declares it.
macro_rules! results {
    ($(#[$doc:meta])* pub struct $name:ident { $($(#[$field_doc:meta])* pub $field:ident: $type:ty,)* }) => {
        $(#[$doc])*
        pub struct $name { $($(#[$field_doc])* pub $field: $type,)* }

        impl $crate::procedure::Results for $name {
            fn named(self) -> Vec<(&'static str, Option<::pgrx::pg_sys::Datum>)> {
                vec![$((stringify!($field), ::pgrx::datum::IntoDatum::into_datum(self.$field)),)*]
            }
        }
    };
}
pub(crate) use results;

/// Runs a procedure that commits, for the C function PostgreSQL called: checks that the
/// CALL may commit and connects SPI non-atomically (CallLoop), hands `body` the arguments
/// and the loop, disconnects, and returns the INOUT row, or raises the error.
///
/// # Safety
/// `fcinfo` must be the call info PostgreSQL passed to the running C function.
pub unsafe fn run<R: Results>(
    fcinfo: pg_sys::FunctionCallInfo,
    body: impl FnOnce(&Args, &mut CallLoop) -> Result<R>,
) -> pg_sys::Datum {
    // The result row is built where the caller will read it: the memory context current
    // at entry, which outlives the commits (SPI's own contexts do not).
    let caller_context = pg_sys::CurrentMemoryContext;
    let (args, results) = (|| {
        // A database whose etc_batch is of another version declares its procedures
        // otherwise: the gate says so before any argument is read.
        crate::installed::owner()?;
        let args = Args::of(fcinfo)?;
        crate::standby::refuse_writes(&args.name)?;
        let mut tx = CallLoop::begin(fcinfo, &args.name)?;
        let results = body(&args, &mut tx)?;
        tx.finish();
        Ok((args, results.named()))
    })()
    .or_raise();
    pg_sys::MemoryContextSwitchTo(caller_context);
    result_datum(fcinfo, &args, results).or_raise()
}

/// The procedure's result: nothing without INOUT arguments, the value itself with one,
/// a row of them with several, as ExecuteCallStmt expects, each value placed by its name.
unsafe fn result_datum(
    fcinfo: pg_sys::FunctionCallInfo,
    args: &Args,
    mut named: Vec<(&'static str, Option<pg_sys::Datum>)>,
) -> Result<pg_sys::Datum> {
    let mut values = Vec::with_capacity(named.len());
    for name in args.results() {
        let at = named.iter().position(|(n, _)| *n == name).ok_or_else(|| {
            BatchError::Internal(format!("{} returns no result \"{name}\"", args.name))
        })?;
        values.push(named.swap_remove(at).1);
    }
    if let Some((extra, _)) = named.first() {
        return Err(BatchError::Internal(format!(
            "{} declares no INOUT argument \"{extra}\"",
            args.name
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
                    args.name
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
/// body, a `fn(&Args, &mut CallLoop) -> Result<impl Results>` run by `procedure::run`.
macro_rules! c_procedure {
    ($symbol:ident, $info:ident, $body:expr) => {
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
            $crate::procedure::run(fcinfo, $body)
        }
    };
}
pub(crate) use c_procedure;
