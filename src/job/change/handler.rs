//! A handler: a function (item jsonb) RETURNS jsonb that etc_batch calls once per item,
//! in position order, as the registering role; it changes the row itself and returns
//! its new state, or NULL to refuse the item. Before it is called for an item, the
//! item's row is locked and checked against the item's guard (its revision, its digest
//! or its named columns) exactly as a guarded UPDATE checks it: a handler is never
//! handed a row that drifted. Reverted by a handler that undoes it (inverse).

use super::{Asked, ChunkSql, Ran, RevertTerms};
use crate::error::{BatchError, Result};
use crate::job::definition::Definition;
use crate::job::rules::guard::Guard;
use crate::job::sql;
use crate::job::target::{Constants, Target};
use crate::query;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::spi::quote_literal;
use std::collections::BTreeMap;

/// A handler job's handler, checked: the function takes and returns jsonb. Returns its
/// regprocedure text. Any guard will do: etc_batch checks it before the call.
pub(crate) fn check(handler: pg_sys::Oid) -> Result<String> {
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

/// A handler job's chunk: every item's row locked and checked against the item's guard
/// first (`passed`, as a guarded UPDATE checks it, tenant, key, guard, guard columns and
/// expectations; a row changed meanwhile is checked again as it is now), then the
/// handler called once per item whose row passed, in position order, with the item as
/// jsonb (its key columns, its revision, the tenant, the guards); it returns the row's
/// new state, or NULL to refuse the item. An item whose row did not pass is not handed
/// over: `given` is NULL and `passed` false. Returns (position, passed, given: whether
/// the handler returned a state, key) per item; the state itself is never printed, which
/// for a handler returning its row as jsonb cost as much as the call. $1-$3 as
/// set_values' chunk_sql, then the expectations.
///
/// The locks come first, the calls after: the handler is volatile, so PostgreSQL calls
/// it after the sort, which reads every row of the join and so of `passed` first.
pub(crate) fn chunk_sql(
    target: &Target,
    items: &str,
    chunk_size: i32,
    handler: &str,
    guard_columns: &[String],
    constants: &Constants,
) -> String {
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
    let items_sql = Target::chunk_items(items, chunk_size);
    format!(
        "WITH passed AS MATERIALIZED (\n\
         SELECT it.position\n  FROM {name} AS t, {items_sql}\n WHERE {matches}\n   FOR UPDATE OF t)\n\
         SELECT it.position, p.position IS NOT NULL AS passed,\n       \
         CASE WHEN p.position IS NOT NULL THEN {handler}(pg_catalog.jsonb_build_object({fields}) \
         OPERATOR(pg_catalog.||) it.guards) IS NOT NULL END AS given, it.item_key\n  \
         FROM {items_sql}\n  LEFT JOIN passed p ON p.position OPERATOR(pg_catalog.=) it.position\n \
         ORDER BY it.position",
        name = target.sql_name,
        matches = target.item_matches(guard_columns, constants),
        fields = fields.join(", "),
    )
}

/// The guard value each item's row holds after the handler changed it, read from the
/// row (what the audit keeps: the fact, not what the handler said it did). $1-$3 as
/// chunk_sql, $4 the positions changed. None for a job guarded by named columns, whose
/// audit keeps no guard value.
pub(crate) fn guard_after_sql(target: &Target, items: &str, chunk_size: i32) -> Option<String> {
    let s = &target.shape;
    if s.guard == Guard::Columns {
        return None;
    }
    let mut joins: Vec<String> = target.tenant_condition("$3").into_iter().collect();
    joins.push(s.key.matches("it.item_key", &s.columns));
    Some(format!(
        "SELECT it.position, {} AS guard_now\n  FROM {}, {} AS t\n WHERE {}\n   \
         AND it.position OPERATOR(pg_catalog.=) ANY ($4::pg_catalog.int4[])",
        s.guard_now(),
        Target::chunk_items(items, chunk_size),
        target.sql_name,
        joins.join("\n   AND "),
    ))
}

/// A handler job's chunk: whether each item's handler returned a state; a refusal is an
/// item whose row passed its guard and that the handler returned NULL for, and an item
/// whose row drifted is left for the drain to skip or stop at. Then the guard value of
/// each row changed, read from the row.
pub(crate) fn run(sql: &ChunkSql, args: &[DatumWithOid], items: usize) -> Result<Ran> {
    query::row_reader! {
        /// An item's call, as chunk_sql gives it.
        struct Called {
            position: i32 = -1,
            passed: bool = false,
            given: Option<bool>,
        }
    }
    let rows = query::rows(&sql.change, args, 0, Called::read)?;
    let mut changed: Vec<(i32, Option<i64>)> = Vec::with_capacity(items);
    let mut refused = Vec::new();
    for Called {
        position,
        passed,
        given,
    } in rows
    {
        match (passed, given) {
            (true, Some(true)) => changed.push((position, None)),
            (true, _) => refused.push(position),
            (false, _) => {}
        }
    }
    if let (Some(after), false) = (&sql.guard_after, changed.is_empty()) {
        query::row_reader! {
            struct After {
                position: i32 = -1,
                guard_now: Option<i64>,
            }
        }
        let positions: Vec<i32> = changed.iter().map(|(p, _)| *p).collect();
        // the chunk's positions and tenant, as the change had them
        let mut args: Vec<DatumWithOid> = args[..3]
            .iter()
            // SAFETY: the same datums, of the same types, for the same statement's life
            .map(|a| unsafe { DatumWithOid::new_from_datum(a.datum(), a.oid()) })
            .collect();
        args.push(positions.into());
        let now: BTreeMap<i32, Option<i64>> = query::rows(after, &args, 0, After::read)?
            .into_iter()
            .map(|a| (a.position, a.guard_now))
            .collect();
        for (position, guard) in &mut changed {
            *guard = now.get(position).copied().flatten();
        }
    }
    Ok(Ran {
        changed,
        refused,
        kept: Vec::new(),
    })
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
        action: Asked::Update,
    })
}
