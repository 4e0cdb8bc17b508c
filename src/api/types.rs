//! The SQL types of arguments that pgrx has no Rust type for, as a DBA writes them: a
//! column's `name`, a table's `regclass`, a function's `regprocedure`, and `jsonb` read
//! as its text. Each is declared with its SQL type here, so that the functions taking
//! them are declared by pgrx from their Rust signatures, once.

use crate::error::BatchError;
use pgrx::callconv::{Arg, ArgAbi};
use pgrx::datum::FromDatum;
use pgrx::nullable::Nullable;
use pgrx::pg_sys;
use std::ffi::CStr;

/// Declares an argument type: its SQL type, and how its datum becomes the Rust value.
macro_rules! argument_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $sql:literal, |$datum:ident| $read:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name(pub $inner);

        impl FromDatum for $name {
            unsafe fn from_polymorphic_datum(
                $datum: pg_sys::Datum,
                is_null: bool,
                _: pg_sys::Oid,
            ) -> Option<Self> {
                // a datum of the SQL type this argument is declared with
                (!is_null).then(|| $name($read))
            }
        }

        // SAFETY: the datum is of the SQL type declared below, which from_datum reads
        unsafe impl<'fcx> ArgAbi<'fcx> for $name {
            unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
                let index = arg.index();
                unsafe { arg.unbox_arg_using_from_datum() }
                    .unwrap_or_else(|| panic!("argument {index} must not be null"))
            }

            unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
                unsafe { arg.unbox_arg_using_from_datum() }.into()
            }
        }

        pgrx::impl_sql_translatable!($name, arg_only = $sql);
    };
}

argument_type!(
    /// A column's name.
    Name(String),
    "name",
    |datum| CStr::from_ptr(datum.cast_mut_ptr::<std::ffi::c_char>())
        .to_string_lossy()
        .into_owned()
);

argument_type!(
    /// Column names, as an array of names.
    Names(Vec<String>),
    "name[]",
    |datum| names(datum)
);

/// The elements of a name[] datum, NULL ones left out.
///
/// # Safety
/// `datum` is a non-NULL name[] argument.
unsafe fn names(datum: pg_sys::Datum) -> Vec<String> {
    let array = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
    let mut elements: *mut pg_sys::Datum = std::ptr::null_mut();
    let mut nulls: *mut bool = std::ptr::null_mut();
    let mut count = 0;
    // name: 64 bytes, passed by reference, aligned as char
    pg_sys::deconstruct_array(
        array,
        pg_sys::NAMEOID,
        pg_sys::NAMEDATALEN as i32,
        false,
        b'c' as std::ffi::c_char,
        &mut elements,
        &mut nulls,
        &mut count,
    );
    (0..count as usize)
        .filter(|&i| !*nulls.add(i))
        .map(|i| {
            CStr::from_ptr((*elements.add(i)).cast_mut_ptr::<std::ffi::c_char>())
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

argument_type!(
    /// A table, by OID.
    RegClass(pg_sys::Oid),
    "regclass",
    |datum| pg_sys::Oid::from(datum.value() as u32)
);

argument_type!(
    /// A function, by OID.
    RegProcedure(pg_sys::Oid),
    "regprocedure",
    |datum| pg_sys::Oid::from(datum.value() as u32)
);

argument_type!(
    /// A jsonb argument, as the datum PostgreSQL passed, read as JSON text when asked
    /// (`text`), for reading an item at a time. pgrx's JsonB turns jsonb that serde_json
    /// cannot hold (nesting deeper than it reads, a number beyond double precision) into
    /// an internal error; this lets the approval refuse it with a clear one.
    Jsonb(pg_sys::Datum),
    "jsonb",
    |datum| datum
);

impl Jsonb {
    /// The value as JSON text, as jsonb_out prints it.
    pub fn text(&self, what: &str) -> crate::error::Result<String> {
        use crate::job::register::JsonList;
        self.list(what).text()
    }
}

/// A jsonb approved list, detoasted once and read an element at a time
/// (register::JsonList); the detoasted copy, if one was made, is freed with it.
pub struct JsonbList {
    what: String,
    jsonb: *mut pg_sys::Jsonb,
    /// Whether `jsonb` is a copy made by detoasting, to free.
    copied: bool,
}

impl Jsonb {
    /// The value as a list read an element at a time; `what` names it in errors.
    pub fn list(&self, what: &str) -> JsonbList {
        // SAFETY: the datum is a jsonb argument of this call; detoasted here, once.
        unsafe {
            let stored = self.0.cast_mut_ptr::<pg_sys::varlena>();
            let detoasted = pg_sys::pg_detoast_datum(stored);
            JsonbList {
                what: what.to_string(),
                jsonb: detoasted.cast(),
                copied: detoasted != stored,
            }
        }
    }
}

impl Drop for JsonbList {
    fn drop(&mut self) {
        if self.copied {
            // SAFETY: the copy pg_detoast_datum palloc'd, no longer read
            unsafe { pg_sys::pfree(self.jsonb.cast()) };
        }
    }
}

impl JsonbList {
    /// A container (or, for a scalar, the jsonb made of it) printed as JSON text into
    /// `buffer` and handed to `read`.
    unsafe fn print<R>(
        &self,
        buffer: pg_sys::StringInfo,
        container: *mut pg_sys::JsonbContainer,
        len: i32,
        read: impl FnOnce(&str) -> crate::error::Result<R>,
    ) -> crate::error::Result<R> {
        let printed = pg_sys::JsonbToCString(buffer, container, len);
        match CStr::from_ptr(printed).to_str() {
            Ok(text) => read(text),
            Err(_) => Err(not_utf8(&self.what)),
        }
    }
}

fn not_utf8(what: &str) -> BatchError {
    BatchError::Unsupported {
        message: format!("{what} is not valid UTF-8"),
        detail: "etc_batch reads approvals in UTF8 databases only.".into(),
    }
}

impl crate::job::register::JsonList for JsonbList {
    fn array_len(&self) -> Option<usize> {
        // SAFETY: a detoasted jsonb; its root container's header says what it holds
        let header = unsafe { (*self.jsonb).root.header };
        let array = header & pg_sys::JB_FARRAY != 0 && header & pg_sys::JB_FSCALAR == 0;
        array.then_some((header & pg_sys::JB_CMASK) as usize)
    }

    fn each_element(
        &self,
        visit: &mut dyn FnMut(&str) -> crate::error::Result<()>,
    ) -> crate::error::Result<()> {
        use pg_sys::JsonbIteratorToken::{WJB_DONE, WJB_ELEM};
        // Printing leaves what it allocates behind (each number's text): an element is
        // printed in a scratch context of its own, reset before the next.
        let scratch = crate::memory::Scratch::new(c"etc_batch jsonb element");
        // SAFETY: iterates the detoasted jsonb's root array without descending into its
        // elements (skipNested); each element is printed on its own.
        let each = unsafe {
            let mut iterator = pg_sys::JsonbIteratorInit(&mut (*self.jsonb).root);
            let mut value: pg_sys::JsonbValue = std::mem::zeroed();
            loop {
                let done = match pg_sys::JsonbIteratorNext(&mut iterator, &mut value, true) {
                    WJB_DONE => break Ok(()),
                    WJB_ELEM => scratch.round(|| {
                        let buffer = pg_sys::makeStringInfo();
                        if value.type_ == pg_sys::jbvType::jbvBinary {
                            let binary = value.val.binary;
                            self.print(buffer, binary.data, binary.len, |text| visit(text))
                        } else {
                            // a scalar element, which the approval refuses, printed as
                            // the jsonb it makes
                            let scalar = pg_sys::JsonbValueToJsonb(&mut value);
                            self.print(buffer, &mut (*scalar).root, 16, |text| visit(text))
                        }
                    }),
                    _ => Ok(()),
                };
                if done.is_err() {
                    break done;
                }
            }
        };
        scratch.free();
        each
    }

    fn text(&self) -> crate::error::Result<String> {
        // SAFETY: the detoasted jsonb's root container, printed in a scratch context
        let scratch = crate::memory::Scratch::new(c"etc_batch jsonb");
        let text = scratch.round(|| unsafe {
            let len = pgrx::varlena::varsize_any(self.jsonb.cast()) as i32;
            let buffer = pg_sys::makeStringInfo();
            self.print(buffer, &mut (*self.jsonb).root, len, |text| {
                Ok(text.to_string())
            })
        });
        scratch.free();
        text
    }
}
