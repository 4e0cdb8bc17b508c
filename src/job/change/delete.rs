//! A guarded DELETE (action 'delete'): each chunk one statement that deletes every item's
//! row that still matches it, and returns, for the audit, each deleted row's whole
//! content (unless the approval said keep_deleted => false), in its row type's text
//! form: what a revert inserts again.

use super::{guarded_rows, Ran};
use crate::error::{BatchError, Result};
use crate::job::rules::approval::Action;
use crate::job::target::{Constants, Target};
use crate::query;
use pgrx::datum::DatumWithOid;
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

/// SQL: the row `t` as the audit keeps it: its row type's text form, which the row
/// type's input reads back column by column, every type included; NULL when not kept.
pub(crate) fn kept_row(keep: bool) -> &'static str {
    if keep {
        "t::pg_catalog.text"
    } else {
        "NULL::pg_catalog.text"
    }
}

/// The guarded DELETE of one chunk, one statement, run as the registering role; its
/// parameters as set_values' chunk_sql (no values to set).
pub(crate) fn chunk_sql(
    target: &Target,
    guard_columns: &[String],
    constants: &Constants,
    key_bounds: bool,
    keep: bool,
) -> String {
    let (items, conditions) = guarded_rows(target, guard_columns, constants, key_bounds);
    format!(
        "DELETE FROM {} AS t\n USING {items}\n WHERE {conditions}\n\
         RETURNING it.position, NULL::pg_catalog.int8 AS guard_now, {} AS kept",
        target.sql_name,
        kept_row(keep),
    )
}

/// Runs a chunk's DELETE (or a move's statement, which returns the same) and reads, for
/// the audit, each item whose row it deleted and the row kept.
pub(crate) fn run(
    sql: &str,
    args: &[DatumWithOid],
    planning: query::Planning,
    items: usize,
) -> Result<Ran> {
    query::row_reader! {
        /// A row deleted, as chunk_sql returns it.
        struct Deleted {
            position: i32 = -1,
            guard_now: Option<i64>,
            kept: Option<String>,
        }
    }
    let mut changed = Vec::with_capacity(items);
    let mut kept = Vec::with_capacity(items);
    query::rows_planned(sql, args, planning, 0, |r| {
        let row = Deleted::read(r)?;
        changed.push((row.position, row.guard_now));
        if let Some(text) = row.kept {
            kept.push((row.position, text));
        }
        Ok(())
    })?;
    Ok(Ran {
        changed,
        refused: Vec::new(),
        kept,
    })
}
