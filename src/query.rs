//! Small wrappers over pgrx's Spi for the statements etc_batch sends.
//!
//! Each call connects, runs one statement read-write (so SPI takes a fresh snapshot for
//! it, which matters right after a COMMIT, when no snapshot is active), copies out what
//! it needs and disconnects: nothing from SPI outlives the call, so a COMMIT may follow.

use crate::error::Result;
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::prelude::*;
use pgrx::spi::SpiTupleTable;

/// The first column of the first row, or `None` when there is no row (or it is NULL).
pub fn one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid]) -> Result<Option<T>> {
    row(sql, args, |row| row.get::<T>(1)).map(Option::flatten)
}

/// Reads the first row with `read`, or `None` when the statement returned no row.
pub fn row<R>(
    sql: &str,
    args: &[DatumWithOid],
    read: impl FnOnce(&SpiTupleTable) -> pgrx::spi::Result<R>,
) -> Result<Option<R>> {
    Ok(Spi::connect_mut(|client| {
        let table = client.update(sql, Some(1), args)?;
        if table.is_empty() {
            return Ok::<_, pgrx::spi::Error>(None);
        }
        read(&table.first()).map(Some)
    })?)
}

/// Runs a statement for its effect.
pub fn run(sql: &str, args: &[DatumWithOid]) -> Result<()> {
    Ok(Spi::run_with_args(sql, args)?)
}
