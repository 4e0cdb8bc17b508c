//! A guarded UPDATE of columns to each item's own value, frozen with the item when its
//! job was registered: the columns register_job's set_from_query names (a backfill from a
//! join: the items query joins and names the value), and a revert's, which sets back the
//! values a job recorded before its change. The statement is set_values' (set_values.rs),
//! with these columns' assignments.
//!
//! The value to set is the item's own member of the column's name, in its guards (so
//! that a query's column or a list item's member is taken as it was given). What the
//! row held before is recorded too, when the job is registered, under the guards' member
//! `BEFORE`, an object of those columns: no column can be named so, so the two never meet.
//! A chunk changes a row only if it still holds that value (the row it was read from),
//! and the revert sets it back: it swaps the two, and so does the revert of that revert.
//! A revert registered by 0.4.0 recorded nothing before: its items have no `BEFORE`, and
//! nothing is asked of them.

use crate::error::{BatchError, Result};
use crate::job::target::{text_array_sql, Target};
use pgrx::spi::{quote_identifier, quote_literal};
use serde_json::Value;

pub(crate) use crate::job::target::BEFORE;

/// Refuses a column named twice in set_from_query, which the UPDATE would assign twice.
pub(crate) fn check_named_once(from_items: &[String]) -> Result<()> {
    match from_items
        .iter()
        .enumerate()
        .find(|(i, c)| from_items[..*i].contains(c))
    {
        Some((_, column)) => Err(BatchError::invalid(format!(
            "set_from_query names column \"{column}\" twice"
        ))),
        None => Ok(()),
    }
}

/// The columns set from each item, as set_values names columns, for registration to
/// check them with set_values' own (columns of the target, none that names or guards a
/// row, none generated).
pub(crate) fn named(from_items: &[String]) -> Value {
    from_items
        .iter()
        .map(|c| (c.clone(), Value::Null))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The assignments of the columns set from each item, read from the chunk's item `it`.
pub(crate) fn assignments<'a>(
    target: &'a Target,
    from_items: &'a [String],
) -> impl Iterator<Item = String> + 'a {
    from_items.iter().map(|column| {
        format!(
            "{} = {}",
            quote_identifier(column),
            target.item_value("it", column)
        )
    })
}

/// SQL: the object of the values the row `t` holds now in the columns set from each item
/// (`value` reads one column of `t`, as recording reads it), recorded as `BEFORE`.
pub(crate) fn recorded_sql(
    from_items: &[String],
    value: impl Fn(&str) -> String,
) -> Option<String> {
    (!from_items.is_empty()).then(|| {
        format!(
            "pg_catalog.jsonb_build_object({}, pg_catalog.jsonb_build_object({}))",
            quote_literal(BEFORE),
            from_items
                .iter()
                .map(|c| format!("{}, {}", quote_literal(c), value(c)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// SQL: the guards `guards` with the values recorded before the change of the columns
/// `columns` in their place, and nothing else recorded: a revert's item, which sets
/// them back (its registration records what the rows hold then).
pub(crate) fn recorded_in_place(guards: &str, columns: &[String]) -> String {
    let before = quote_literal(BEFORE);
    if columns.is_empty() {
        return format!("({guards} OPERATOR(pg_catalog.-) {before}::pg_catalog.text)");
    }
    format!(
        "({guards} OPERATOR(pg_catalog.-) {before}::pg_catalog.text OPERATOR(pg_catalog.||) COALESCE(\
         (SELECT pg_catalog.jsonb_object_agg(b.key, b.value) \
         FROM pg_catalog.jsonb_each({guards} OPERATOR(pg_catalog.->) {before}::pg_catalog.text) b \
         WHERE b.key OPERATOR(pg_catalog.=) ANY ({})), '{{}}'::pg_catalog.jsonb))",
        text_array_sql(columns)
    )
}

/// SQL: how many items of a revert (`revert_items`) recorded, in the columns `columns`
/// it sets back, other values than its job's items (`{items}`) set: rows that changed
/// after they were read against the job's items.
pub(crate) fn recorded_since_sql(
    target: &Target,
    revert_items: &str,
    columns: &[String],
) -> String {
    let before = quote_literal(BEFORE);
    let differs: Vec<String> = columns
        .iter()
        .map(|c| {
            let lit = quote_literal(c);
            format!(
                "{} IS DISTINCT FROM {}",
                target.cast(
                    &format!(
                        "r.guards OPERATOR(pg_catalog.->) {before} OPERATOR(pg_catalog.->>) {lit}"
                    ),
                    c
                ),
                target.item_value("i", c)
            )
        })
        .collect();
    format!(
        "SELECT pg_catalog.count(*)\n  FROM {revert_items} r\n  \
         JOIN {{items}} i ON i.item_key OPERATOR(pg_catalog.=) r.item_key\n WHERE {}",
        differs.join(" OR ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_named_twice_is_refused() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_named_once(&names(&["region", "tier"])).is_ok());
        let err = check_named_once(&names(&["region", "tier", "region"])).unwrap_err();
        assert!(err.to_string().contains("\"region\" twice"), "{err}");
    }
}
