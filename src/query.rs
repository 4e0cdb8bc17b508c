//! The statements etc_batch sends for itself, and how their rows are read.
//!
//! Each call connects SPI, runs one statement read-write (so SPI takes a fresh snapshot
//! for it, which matters right after a COMMIT, when no snapshot is active), copies out
//! what it needs and disconnects: nothing from SPI outlives the call, so a COMMIT may
//! follow.
//!
//! Reads go through `row` rather than pgrx's `SpiClient::update`, which asks for a
//! transaction id before every statement. A runner that waits for a step's or a job's
//! row lock would then hold an xid older than the one it waits for, and audit txids
//! would not follow the order in which steps and chunks commit; a reader would burn an
//! xid for nothing. Here an xid is assigned when something is written or locked, as in
//! plain SQL.

use crate::error::{BatchError, Result};
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;
use std::os::raw::c_char;

/// One row of a statement run by `row`, read while SPI still holds it.
pub struct Row {
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
}

impl Row {
    /// Column `n` (1-based), copied out as a Rust value of a compatible type.
    pub fn get<T: FromDatum + IntoDatum>(&self, n: usize) -> Result<Option<T>> {
        // SAFETY: tuple and desc come from SPI_tuptable of the statement just run, and
        // rows are read before SPI_finish frees them.
        unsafe {
            let column = n as i32;
            let type_oid = pg_sys::SPI_gettypeid(self.desc, column);
            if !T::is_compatible_with(type_oid) {
                return Err(BatchError::Internal(format!(
                    "column {n} has type oid {}, which {} cannot hold",
                    type_oid.to_u32(),
                    std::any::type_name::<T>()
                )));
            }
            let mut is_null = false;
            let datum = pg_sys::SPI_getbinval(self.tuple, self.desc, column, &mut is_null);
            Ok(T::from_polymorphic_datum(datum, is_null, type_oid))
        }
    }
}

/// Runs `sql` and reads every row it returns with `read` (at most `limit`, 0 = all).
pub fn rows<R>(
    sql: &str,
    args: &[DatumWithOid],
    limit: i64,
    mut read: impl FnMut(&Row) -> Result<R>,
) -> Result<Vec<R>> {
    let text = CString::new(sql)
        .map_err(|_| BatchError::Internal("a statement contains a zero byte".into()))?;
    let mut types: Vec<pg_sys::Oid> = args.iter().map(|a| a.oid()).collect();
    let mut values: Vec<pg_sys::Datum> = args
        .iter()
        .map(|a| {
            a.datum()
                .map(|d| d.sans_lifetime())
                .unwrap_or(pg_sys::Datum::from(0usize))
        })
        .collect();
    let nulls: Vec<c_char> = args
        .iter()
        .map(|a| (if a.datum().is_some() { b' ' } else { b'n' }) as c_char)
        .collect();
    // SAFETY: a plain atomic SPI connection, finished before returning. An error raised
    // by PostgreSQL unwinds through pgrx's guard, and the transaction's (or the
    // subtransaction's) abort pops the connection.
    unsafe {
        pg_sys::SPI_connect();
        let rc = pg_sys::SPI_execute_with_args(
            text.as_ptr(),
            args.len() as i32,
            types.as_mut_ptr(),
            values.as_mut_ptr(),
            nulls.as_ptr(),
            false,
            limit,
        );
        let mut out = Vec::new();
        let result = if rc < 0 {
            Err(BatchError::Internal(format!(
                "SPI_execute_with_args returned {rc}"
            )))
        } else if pg_sys::SPI_tuptable.is_null() {
            Ok(())
        } else {
            let table = &*pg_sys::SPI_tuptable;
            (0..pg_sys::SPI_processed as usize).try_for_each(|i| {
                out.push(read(&Row {
                    tuple: *table.vals.add(i),
                    desc: table.tupdesc,
                })?);
                Ok(())
            })
        };
        pg_sys::SPI_finish();
        result.map(|()| out)
    }
}

/// Reads the first row with `read`, or `None` when the statement returned no row.
pub fn row<R>(
    sql: &str,
    args: &[DatumWithOid],
    read: impl FnOnce(&Row) -> Result<R>,
) -> Result<Option<R>> {
    let mut read = Some(read);
    Ok(rows(sql, args, 1, |r| (read.take().expect("one row"))(r))?.pop())
}

/// The first column of the first row, or `None` when there is no row (or it is NULL).
pub fn one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid]) -> Result<Option<T>> {
    row(sql, args, |row| row.get::<T>(1)).map(Option::flatten)
}

/// Runs a statement for its effect.
pub fn run(sql: &str, args: &[DatumWithOid]) -> Result<()> {
    Ok(Spi::run_with_args(sql, args)?)
}
