//! A guarded UPDATE of columns to each item's own value, recorded in the item's guards
//! when its job was registered (a revert's set_from_items: the values before the change
//! of a job that recorded them). The statement is set_values' (set_values.rs), with
//! these columns' assignments; its revert sets back what set_values' sets back.

use crate::job::target::Target;
use pgrx::spi::quote_identifier;
use serde_json::Value;

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
