//! The etc_batch installed in this database, as the library sees it.
//!
//! Every call that reads or writes etc_batch's tables asks here first, for the
//! extension's owner (who owns those tables and does etc_batch's bookkeeping). It is
//! also the version gate: after a new build is installed and until
//! ALTER EXTENSION etc_batch UPDATE, the database's objects are of another version than
//! the library, the library's statements would not match them, and every call is
//! refused instead.

use crate::error::{BatchError, Result};
use crate::query;
use pgrx::pg_sys;

const EXTENSION: &str = "\
SELECT e.extowner, e.extversion FROM pg_catalog.pg_extension e
 WHERE e.extname OPERATOR(pg_catalog.=) 'etc_batch'";

query::row_reader! {
    /// The row of pg_extension that EXTENSION reads.
    struct Extension {
        extowner: Option<pg_sys::Oid>,
        extversion: Option<String>,
    }
}

/// The owner of the installed etc_batch, once it is known to be of this library's
/// version.
pub fn owner() -> Result<pg_sys::Oid> {
    let Extension {
        extowner,
        extversion,
    } = query::row(EXTENSION, &[], Extension::read)?
        .ok_or_else(|| BatchError::Internal("extension etc_batch is not installed".into()))?;
    match (extowner, extversion) {
        (Some(owner), Some(v)) if v == env!("CARGO_PKG_VERSION") => Ok(owner),
        (_, installed) => Err(BatchError::VersionMismatch {
            installed: installed.unwrap_or_default(),
        }),
    }
}
