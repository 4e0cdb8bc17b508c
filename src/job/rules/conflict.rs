//! Saying what a conflict is: which item, what the approval expected, and what the row
//! holds now or that it is gone. Pure, so the wording is unit-tested.

use crate::job::rules::guard::Guard;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// What the approval expected of one item.
pub struct Expected<'a> {
    pub key: &'a str,
    pub position: i32,
    pub item_count: i32,
    /// The job's tenant; None: the whole table.
    pub tenant: Option<&'a str>,
    pub guard: &'a Guard,
    /// The revision (or digest) approved.
    pub revision: i64,
    pub guards: &'a BTreeMap<String, Value>,
    pub expect: &'a BTreeMap<String, Value>,
    /// The handler that returned NULL for the item, refusing it; None when the item's
    /// change simply found no row to change.
    pub refused_by: Option<&'a str>,
}

/// The detail message and the problem record for an item whose row did not match.
/// `row` is the row as to_jsonb(t) gives it, or None when no row of the tenant has the key.
pub fn describe(e: &Expected, row: Option<&Value>) -> (String, Value) {
    let at = item_at(e);
    let expected = json!({
        "revision": e.revision,
        "guards": Value::Object(e.guards.clone().into_iter().collect::<Map<_, _>>()),
        "expect": Value::Object(e.expect.clone().into_iter().collect::<Map<_, _>>()),
    });
    let problem = |found: Value| json!({"position": e.position, "key": e.key, "expected": expected, "found": found});
    let Some(row) = row else {
        let whose = match e.tenant {
            Some(tenant) => format!("no row of tenant \"{tenant}\""),
            None => "no row".to_string(),
        };
        return (
            format!("{at} is gone: the job sees {whose} with that key any more."),
            problem(Value::Null),
        );
    };
    let now = |column: &str| row.get(column).cloned().unwrap_or(Value::Null);
    let revision_column = e.guard.column();
    let detail = if revision_column.is_some_and(|c| !same(&now(c), &json!(e.revision))) {
        format!(
            "{at} was approved at revision {}, but the row now has revision {}.",
            e.revision,
            now(revision_column.unwrap_or_default())
        )
    } else if let Some((column, value)) = e.guards.iter().find(|(c, v)| !same(&now(c), v)) {
        format!(
            "{at} was approved with {column} = {value}, but the row now has {column} = {}.",
            now(column)
        )
    } else if let Some((column, value)) = e.expect.iter().find(|(c, v)| !same(&now(c), v)) {
        format!(
            "{at} must have {column} = {value}, but the row now has {column} = {}.",
            now(column)
        )
    } else if let Some(handler) = e.refused_by {
        format!("{at} was refused by its handler {handler}, which returned NULL for it; its row still holds what was approved.")
    } else if *e.guard == Guard::Row {
        format!("{at} was approved with a row that has changed since: its digest is no longer the one taken when the job was registered.")
    } else {
        format!("{at} did not match while the chunk ran; it matches again now, so it changed concurrently.")
    };
    (detail, problem(row.clone()))
}

/// What stopped a restore (a revert of a job that deleted its rows) at item `e`: a row
/// that has its key again (`row`), or, restoring a move, its row no longer in the
/// archive as it was moved; and the problem, as `describe` gives it.
pub fn describe_restore(e: &Expected, row: Option<&Value>) -> (String, Value) {
    let at = item_at(e);
    let detail = match row {
        Some(_) => format!("{at} was to be put back, but a row has its key again."),
        None => format!(
            "{at} was to be taken back from the archive, but its row is no longer there as it was moved."
        ),
    };
    let problem = json!({"position": e.position, "key": e.key,
                         "expected": "no row of its key", "found": row.cloned().unwrap_or(Value::Null)});
    (detail, problem)
}

/// "Item K (the Nth of M approved items)": where a conflict is.
fn item_at(e: &Expected) -> String {
    format!(
        "Item {} (the {} of {} approved items)",
        e.key,
        ordinal(e.position + 1),
        e.item_count
    )
}

/// 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, ...
pub fn ordinal(n: i32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, r) if r != 11 => "st",
        (2, r) if r != 12 => "nd",
        (3, r) if r != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// JSON equality where numbers compare by value, exactly (2 = 2.0 = 2.00, and
/// 0.1000000000000000001 is not 0.1).
fn same(a: &Value, b: &Value) -> bool {
    use crate::job::rules::approval::canonical_number;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            canonical_number(&x.to_string()) == canonical_number(&y.to_string())
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static REVISION: std::sync::LazyLock<Guard> = std::sync::LazyLock::new(|| Guard::Revision {
        column: "revision".into(),
    });

    fn expected<'a>(
        guards: &'a BTreeMap<String, Value>,
        expect: &'a BTreeMap<String, Value>,
    ) -> Expected<'a> {
        Expected {
            key: "15",
            position: 14,
            item_count: 40,
            tenant: Some("alien-fest"),
            guard: &REVISION,
            revision: 3,
            guards,
            expect,
            refused_by: None,
        }
    }

    #[test]
    fn ordinals() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111]
            .iter()
            .map(|n| ordinal(*n))
            .collect();
        assert_eq!(
            got,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
                "111th"
            ]
        );
    }

    #[test]
    fn names_the_first_difference() {
        let guards = BTreeMap::from([("qty".to_string(), json!(2))]);
        let expect = BTreeMap::from([("status".to_string(), json!("pending"))]);
        let e = expected(&guards, &expect);
        let (d, p) = describe(&e, None);
        assert_eq!(d, "Item 15 (the 15th of 40 approved items) is gone: the job sees no row of tenant \"alien-fest\" with that key any more.");
        assert_eq!(p["found"], Value::Null);
        assert_eq!(p["expected"]["revision"], json!(3));

        let (d, _) = describe(
            &e,
            Some(&json!({"revision": 4, "qty": 2, "status": "pending"})),
        );
        assert_eq!(d, "Item 15 (the 15th of 40 approved items) was approved at revision 3, but the row now has revision 4.");
        let (d, _) = describe(
            &e,
            Some(&json!({"revision": 3, "qty": 5, "status": "pending"})),
        );
        assert_eq!(d, "Item 15 (the 15th of 40 approved items) was approved with qty = 2, but the row now has qty = 5.");
        let (d, _) = describe(
            &e,
            Some(&json!({"revision": 3, "qty": 2.0, "status": "shipped"})),
        );
        assert_eq!(
            d,
            "Item 15 (the 15th of 40 approved items) must have status = \"pending\", but the row now has status = \"shipped\"."
        );
        let (d, _) = describe(
            &e,
            Some(&json!({"revision": 3, "qty": 2, "status": "pending"})),
        );
        assert!(d.contains("changed concurrently"));

        let refused = Expected {
            refused_by: Some("public.cancel_order(pg_catalog.jsonb)"),
            ..expected(&guards, &expect)
        };
        let (d, _) = describe(
            &refused,
            Some(&json!({"revision": 3, "qty": 2, "status": "pending"})),
        );
        assert_eq!(d, "Item 15 (the 15th of 40 approved items) was refused by its handler public.cancel_order(pg_catalog.jsonb), which returned NULL for it; its row still holds what was approved.");
        // a handler's NULL for a row that drifted is told as the drift
        let (d, _) = describe(
            &refused,
            Some(&json!({"revision": 4, "qty": 2, "status": "pending"})),
        );
        assert!(d.contains("was approved at revision 3, but the row now has revision 4"));
    }
}
