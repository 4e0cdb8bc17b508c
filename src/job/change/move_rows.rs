//! A guarded move to an archive table (action 'move', archive): each chunk one statement
//! that deletes every item's row that still matches it and inserts the deleted rows into
//! the archive, columns by name, pt-archiver's copy-then-delete as one statement: the
//! insert and the delete commit together or not at all. The archive keeps each row's
//! own values, an identity column's too: OVERRIDING SYSTEM VALUE, so that an archive
//! made LIKE the target INCLUDING ALL (an identity GENERATED ALWAYS) takes them, as a
//! restore puts them back. The rows are kept with the
//! audit as a delete's are.

use super::{delete, guarded_rows};
use crate::error::{BatchError, Result};
use crate::job::rules::approval::Action;
use crate::job::rules::columns::Columns;
use crate::job::target::{columns_of, Constants, Target};
use pgrx::pg_sys;
use pgrx::spi::quote_identifier;
use serde_json::Value;

/// A move's approval: it sets nothing, and its archive is a table with every column of
/// the target, each of a type the target's column is assignable to, none generated.
pub(crate) fn check(
    target: &Target,
    table: pg_sys::Oid,
    set_values: Option<&Value>,
    archive: pg_sys::Oid,
    keep: bool,
) -> Result<Action> {
    delete::refuse_values("move", set_values)?;
    if archive == table {
        return Err(BatchError::invalid_because(
            format!("archive {} is the target itself", target.display),
            "A move inserts the rows it deletes into another table.",
        ));
    }
    let (sql_name, display, columns) = columns_of(archive)?;
    check_columns(&target.shape.columns, &display, &columns)?;
    Ok(Action::Move {
        archive: sql_name,
        keep,
    })
}

/// Every column of the target has a column of the same name in the archive, not
/// generated, of a type the target's is assignable to (as INSERT assigns it).
fn check_columns(target: &Columns, archive: &str, columns: &Columns) -> Result<()> {
    for column in target.in_order() {
        let Some(to) = columns.get(&column.name) else {
            return Err(BatchError::invalid_because(
                format!("archive {archive} has no column \"{}\"", column.name),
                "A move inserts each row into the archive whole, column by column by name: the archive needs every column of the target.",
            ));
        };
        if to.generated {
            return Err(BatchError::invalid_because(
                format!("column \"{}\" of archive {archive} is a generated column", column.name),
                "A move inserts each row's value of every column of the target into the archive, which cannot store it in a generated column. An archive made with CREATE TABLE archive (LIKE target INCLUDING ALL EXCLUDING GENERATED) has a plain column in its place.",
            ));
        }
        // SAFETY: a lookup in the cast catalog by two type OIDs the catalog just gave
        let assignable = unsafe {
            pg_sys::can_coerce_type(
                1,
                &column.type_oid,
                &to.type_oid,
                pg_sys::CoercionContext::COERCION_ASSIGNMENT,
            )
        };
        if !assignable {
            return Err(BatchError::TypeMismatch {
                message: format!(
                    "column \"{}\" of archive {archive} is of type {}, which the target's {} cannot be assigned to",
                    column.name, to.sql_type, column.sql_type
                ),
                detail: "A move inserts each row's values into the archive's columns as INSERT assigns them.".into(),
            });
        }
    }
    Ok(())
}

/// The guarded move of one chunk, one statement, run as the registering role: the
/// rows deleted, then inserted into `archive` from what the delete returned; its
/// parameters and what it returns as delete's chunk_sql.
pub(crate) fn chunk_sql(
    target: &Target,
    guard_columns: &[String],
    constants: &Constants,
    key_bounds: bool,
    archive: &str,
    keep: bool,
) -> String {
    let (items, conditions) = guarded_rows(target, guard_columns, constants, key_bounds);
    let names: Vec<String> = target
        .shape
        .columns
        .in_order()
        .map(|c| quote_identifier(&c.name))
        .collect();
    let values: Vec<String> = names.iter().map(|n| format!("(m.moved_row).{n}")).collect();
    format!(
        "WITH moved AS (\n\
         DELETE FROM {} AS t\n USING {items}\n WHERE {conditions}\n\
         RETURNING it.position, t AS moved_row),\n\
         archived AS (\n\
         INSERT INTO {archive} ({}) OVERRIDING SYSTEM VALUE\nSELECT {} FROM moved m)\n\
         SELECT m.position, NULL::pg_catalog.int8 AS guard_now, {} AS kept FROM moved m",
        target.sql_name,
        names.join(", "),
        values.join(", "),
        match keep {
            true => "m.moved_row::pg_catalog.text",
            false => "NULL::pg_catalog.text",
        },
    )
}

/// The archive of a move job, by the name it keeps (as a handler is kept by name).
pub(crate) fn archive_oid(name: &str) -> Result<pg_sys::Oid> {
    crate::query::one::<pg_sys::Oid>(
        "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
        &[name.into()],
    )?
    .ok_or_else(|| {
        BatchError::invalid_because(
            format!("archive {name} does not exist"),
            "A move job keeps its archive by name: a table of that name must exist.",
        )
    })
}
