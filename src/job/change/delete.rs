//! A guarded DELETE (action 'delete'): each chunk one statement that deletes every item's
//! row that still matches it, and returns, for the audit, each deleted row's whole
//! content (unless the approval said keep_deleted => false), in its row type's text
//! form: what a revert inserts again.

use super::guarded_rows;
use crate::error::{BatchError, Result};
use crate::job::rules::approval::Action;
use crate::job::target::{Constants, Target};
use serde_json::Value;

/// A delete job's approval: it sets nothing.
pub(crate) fn check(set_values: Option<&Value>, keep: bool) -> Result<Action> {
    refuse_values("delete", set_values)?;
    Ok(Action::Delete { keep })
}

/// A job that deletes or moves its rows sets no values and has no handler.
pub(crate) fn refuse_values(action: &str, set_values: Option<&Value>) -> Result<()> {
    if set_values.is_some() {
        return Err(BatchError::invalid_because(
            format!("a job with action '{action}' sets no values"),
            "set_values is for action 'update'; a job that deletes or moves its rows changes nothing in them.",
        ));
    }
    Ok(())
}

/// The guarded DELETE of one chunk, one statement, run as the registering role; its
/// parameters as set_values' chunk_sql (no values to set). A row kept is printed from
/// what the DELETE returned, after it, as a move prints it: Citus sends a distributed
/// table's DELETE to its workers with its RETURNING list, where it allows no function
/// that is not immutable, and a row's text form (which the row type's input reads back
/// column by column, every type included) is only stable.
pub(crate) fn chunk_sql(
    target: &Target,
    guard_columns: &[String],
    constants: &Constants,
    key_bounds: bool,
    keep: bool,
) -> String {
    let (items, conditions) = guarded_rows(target, guard_columns, constants, key_bounds);
    if !keep {
        return format!(
            "DELETE FROM {} AS t\n USING {items}\n WHERE {conditions}\n\
             RETURNING it.position, NULL::pg_catalog.int8 AS guard_now, NULL::pg_catalog.text AS kept",
            target.sql_name,
        );
    }
    format!(
        "WITH deleted AS (\n\
         DELETE FROM {} AS t\n USING {items}\n WHERE {conditions}\n\
         RETURNING it.position, t AS deleted_row)\n\
         SELECT d.position, NULL::pg_catalog.int8 AS guard_now, d.deleted_row::pg_catalog.text AS kept\n  \
         FROM deleted d",
        target.sql_name,
    )
}
