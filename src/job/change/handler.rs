//! A handler: a function (item jsonb) RETURNS jsonb that etc_batch calls once per item,
//! in position order, as the registering role; it changes the row itself and returns
//! its new state (the revision included), or NULL to refuse the item. Reverted by a
//! handler that undoes it (inverse).

use super::{Ran, RevertTerms};
use crate::error::{BatchError, Result};
use crate::job::definition::Definition;
use crate::job::rules::approval;
use crate::job::rules::guard::Guard;
use crate::job::sql;
use crate::job::target::Target;
use crate::query;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::spi::quote_literal;
use serde_json::Value;
use std::collections::BTreeMap;

/// A handler job's handler, checked: the job has a revision column to hand it, and the
/// function takes and returns jsonb. Returns its regprocedure text.
pub(crate) fn check(guard: &Guard, handler: pg_sys::Oid) -> Result<String> {
    if guard.column().is_none() {
        return Err(BatchError::Unsupported {
            message: "a handler job needs a revision column".into(),
            detail: "A handler is handed each item's revision and returns the row's new one; a job guarded by a digest of the row or by named columns changes rows with set_values.".into(),
        });
    }
    signature(handler)
}

/// Why a handler job records no values before its change.
pub(crate) fn records_nothing() -> BatchError {
    BatchError::invalid_because(
        "record_before is for a job that sets values",
        "A handler's change is its own: which columns it changes, and so which values to record, is known only to it.",
    )
}

/// A handler is a function (jsonb) RETURNS jsonb; returns its regprocedure text.
pub(crate) fn name(handler: pg_sys::Oid) -> Result<String> {
    signature(handler)
}

fn signature(handler: pg_sys::Oid) -> Result<String> {
    query::row_reader! {
        struct Function {
            name: Option<String>,
            takes_and_returns_jsonb: bool = false,
        }
    }
    let row = query::row(sql::HANDLER, &[handler.into()], Function::read)?;
    match row.map(|f| (f.name, f.takes_and_returns_jsonb)) {
        Some((Some(name), true)) => Ok(name),
        Some((Some(name), false)) => Err(BatchError::invalid_because(
            format!("handler {name} must take one jsonb argument and return jsonb"),
            "It is called once per item with the item as jsonb, and returns the new state of the row, or NULL for a conflict.",
        )),
        _ => Err(BatchError::UnknownFunction {
            oid: handler.to_u32(),
        }),
    }
}

/// A handler job's chunk: the handler is called once per item, in position order,
/// with the item as jsonb (its key columns, its revision, the tenant, the guards);
/// it returns the row's new state, or NULL for a conflict. Returns (position, result
/// as text, key) per item. $1-$3 as change_sql.
pub(crate) fn chunk_sql(target: &Target, items: &str, chunk_size: i32, handler: &str) -> String {
    let s = &target.shape;
    let mut fields: Vec<String> = s
        .key
        .columns()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let part = match s.key.columns().len() {
                1 => "it.item_key".to_string(),
                _ => format!("(it.item_key::pg_catalog.jsonb OPERATOR(pg_catalog.->>) {i})"),
            };
            format!("{}, {}", quote_literal(c), target.cast(&part, c))
        })
        .collect();
    if let Some(column) = s.guard.column() {
        fields.push(format!("{}, it.revision", quote_literal(column)));
    }
    if let Some(column) = &s.tenant_column {
        fields.push(format!(
            "{}, {}",
            quote_literal(column),
            target.cast("$3", column)
        ));
    }
    format!(
        "SELECT it.position, {handler}(pg_catalog.jsonb_build_object({}) \
         OPERATOR(pg_catalog.||) it.guards)::pg_catalog.text AS result, it.item_key\n  FROM {}\n ORDER BY it.position",
        fields.join(", "),
        Target::chunk_items(items, chunk_size),
    )
}

/// A handler job's chunk: each item's result, read as text (jsonb that serde_json
/// cannot hold is a clear error here, not an internal one); NULL refuses the item.
pub(crate) fn run(def: &Definition, sql: &str, args: &[DatumWithOid], items: usize) -> Result<Ran> {
    query::row_reader! {
        /// An item's result, as chunk_sql gives it.
        struct Called {
            position: i32 = -1,
            result: Option<String>,
            item_key: String = String::new(),
        }
    }
    let rows = query::rows(sql, args, 0, Called::read)?;
    let mut changed = Vec::with_capacity(items);
    let mut refused = Vec::new();
    for Called {
        position,
        result,
        item_key: key,
    } in rows
    {
        let Some(text) = result else {
            refused.push(position);
            continue;
        };
        let result = approval::read_json(&format!("the handler's result for item {key}"), &text)?;
        let field = def.guard.column().unwrap_or_default();
        let Some(revision) = result.get(field).and_then(Value::as_i64) else {
            return Err(BatchError::invalid_because(
                format!("handler result for item {key} has no integer \"{field}\""),
                "A handler returns the new state of the row, revision included, or NULL for a conflict.",
            ));
        };
        changed.push((position, Some(revision)));
    }
    Ok(Ran { changed, refused })
}

/// What the revert of a handler job sets and expects: nothing etc_batch knows; its
/// `inverse` undoes the change, item by item.
pub(crate) fn reverted(def: &Definition, inverse: Option<pg_sys::Oid>) -> Result<RevertTerms> {
    let Some(inverse) = inverse else {
        return Err(BatchError::Unsupported {
            message: format!(
                "job \"{}\" changed its rows with a handler, whose change etc_batch cannot undo by itself",
                def.job_id
            ),
            detail: "A handler job is reverted by a handler that undoes its change: give it as inverse => 'schema.function(jsonb)'::regprocedure.".into(),
        });
    };
    Ok(RevertTerms {
        set_back: None,
        from_items: Vec::new(),
        inverse: Some(inverse),
        expressions: BTreeMap::new(),
        expect: BTreeMap::new(),
        strip: def.guard_columns.clone(),
    })
}
