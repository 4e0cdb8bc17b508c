//! A guarded UPDATE to the values the approval names (set_values): each chunk one
//! statement that changes every item whose row still matches it, and returns each
//! changed row's guard value now; reverted by setting back what the rows held before.

use super::{guarded_rows, item_values, set_expressions, Asked, RevertTerms};
use crate::error::{BatchError, Result};
use crate::job::definition::Definition;
use crate::job::rules::columns::scalar_text;
use crate::job::rules::shape::Shape;
use crate::job::sql;
use crate::job::target::{Constants, Target};
use crate::query;
use crate::txn::subtransaction;
use pgrx::pg_sys;
use pgrx::spi::quote_identifier;
use serde_json::Value;
use std::collections::BTreeMap;

/// The values to set, beside the columns set by an expression (set_expressions) and
/// those set from each item (set_from_items): each a column of the target, named once,
/// none of them one that names or guards a row, or generated. None: the job sets
/// columns only by expressions.
pub(crate) fn check(
    shape: &Shape,
    values: Option<&Value>,
    expressions: &[String],
    from_items: &[String],
) -> Result<BTreeMap<String, Value>> {
    let values = match values {
        Some(values) => shape.check_columns_object("set_values", values)?,
        None => BTreeMap::new(),
    };
    // every chunk's UPDATE would fail on the constraint: refused now, not at every drain
    if let Some((column, _)) = values
        .iter()
        .find(|(c, v)| v.is_null() && shape.columns.get(*c).is_some_and(|c| c.not_null))
    {
        return Err(BatchError::NotNullViolation {
            column: column.clone(),
        });
    }
    if let Some(both) = expressions.iter().find(|c| values.contains_key(*c)) {
        return Err(BatchError::invalid_because(
            format!("column \"{both}\" is in both set_values and set_expressions"),
            "A job sets a column to one value or to one expression, not both.",
        ));
    }
    let mut assigned: BTreeMap<String, &'static str> =
        values.keys().map(|c| (c.clone(), "set_values")).collect();
    for (argument, columns) in [
        ("set_from_query", from_items),
        ("set_expressions", expressions),
    ] {
        let named = shape.check_columns_object(argument, &item_values::named(columns))?;
        for column in named.into_keys() {
            if let Some(before) = assigned.insert(column.clone(), argument) {
                return Err(BatchError::invalid_because(
                    format!("column \"{column}\" is in both {before} and {argument}"),
                    "A job sets a column to one value, one expression or each item's own value, not two of them.",
                ));
            }
        }
    }
    check_assigned(shape, &assigned)?;
    Ok(values)
}

/// The columns a job assigns, each with the argument that named it: at least one, and
/// none that names or guards a row, or is generated.
fn check_assigned(shape: &Shape, assigned: &BTreeMap<String, &'static str>) -> Result<()> {
    if assigned.is_empty() {
        return Err(BatchError::invalid(
            "set_values or set_expressions must name at least one column",
        ));
    }
    for protected in shape.roles() {
        if let Some(argument) = assigned.get(protected) {
            return Err(BatchError::invalid_because(
                format!("{argument} must not assign column \"{protected}\""),
                "The key, tenant and revision columns identify the approved rows; the revision is incremented by etc_batch.",
            ));
        }
    }
    if let Some((generated, argument)) = assigned
        .iter()
        .find(|(c, _)| shape.columns[c.as_str()].generated)
    {
        return Err(BatchError::GeneratedColumn {
            column: generated.clone(),
            argument,
        });
    }
    Ok(())
}

/// A value set_values sets that a CHECK constraint of the target on that column alone
/// refuses would fail every chunk: refused now, with the constraint's SQLSTATE. Each
/// constraint is read from the catalog and asked of the value alone, as the caller, in a
/// subtransaction; one that cannot be asked so (it fails on the value) is left to the
/// chunks, as before.
pub(crate) fn check_constraints(
    target: &Target,
    table: pg_sys::Oid,
    values: &BTreeMap<String, Value>,
) -> Result<()> {
    for (name, value) in values {
        let (Some(column), Some(text)) = (target.shape.columns.get(name), scalar_text(value))
        else {
            continue;
        };
        query::row_reader! {
            struct Check {
                name: String = String::new(),
                expression: String = String::new(),
            }
        }
        let checks = query::rows(
            sql::COLUMN_CHECKS,
            &[table.into(), name.as_str().into()],
            0,
            Check::read,
        )?;
        for Check {
            name: constraint,
            expression,
        } in checks
        {
            let asked = format!(
                "SELECT ({expression}) IS NOT FALSE FROM (SELECT $1::pg_catalog.text::{}) AS t({})",
                column.sql_type,
                pgrx::spi::quote_identifier(name)
            );
            let passes = subtransaction(|| query::one::<bool>(&asked, &[text.as_str().into()]));
            if let Ok(Ok(Some(false))) = passes {
                return Err(BatchError::CheckViolation {
                    column: name.clone(),
                    constraint,
                    value: text,
                });
            }
        }
    }
    Ok(())
}

/// The guarded change of one chunk, one statement, run as the registering role: the
/// chunk's items, bound as its row of the frozen list holds them, every one that
/// still matches changed (with what its guard adds, a revision incremented). Returns
/// the position of each item changed and its guard value now, for the audit. $1 the
/// chunk's first position, $3 tenant, then the job's constants; with `key_bounds`
/// (see bounds_chunks), then the chunk's first and last key; last, the chunk's
/// arrays (ItemArrays::args). Bound as values, the arrays tell the planner how many
/// items the chunk has, and the key bounds how many rows of the target lie between
/// its first and last key: planned for them (run/drainer.rs, planning), a chunk whose
/// items are most of the rows of its key range reads that range once and joins it,
/// where one of scattered items probes the target by index once per item.
pub(crate) fn chunk_sql(
    target: &Target,
    guard_columns: &[String],
    constants: &Constants,
    expressions: &BTreeMap<String, String>,
    key_bounds: bool,
) -> String {
    let s = &target.shape;
    let mut assignments: Vec<String> = constants
        .assigned()
        .map(|(column, param)| match param {
            Some(n) => format!("{} = ${n}", quote_identifier(column)),
            None => format!("{} = NULL", quote_identifier(column)),
        })
        .collect();
    assignments.extend(item_values::assignments(target, constants.item_columns()));
    assignments.extend(set_expressions::assignments(expressions));
    assignments.extend(s.guard.assignments());
    let (items, conditions) = guarded_rows(target, guard_columns, constants, key_bounds);
    format!(
        "UPDATE {} AS t\n   SET {}\n  FROM {}\n WHERE {}\n\
         RETURNING it.position, {} AS guard_now, NULL::pg_catalog.text AS kept",
        target.sql_name,
        assignments.join(", "),
        items,
        conditions,
        s.guard_now(),
    )
}

/// What the revert of a job that set values sets and expects. `reverted`: for a revert,
/// the expressions of the job it reverted, which its own revert sets again.
pub(crate) fn reverted(
    def: &Definition,
    inverse: Option<pg_sys::Oid>,
    reverted: &BTreeMap<String, String>,
) -> Result<RevertTerms> {
    if inverse.is_some() {
        return Err(BatchError::invalid_because(
            "an inverse is for a handler job",
            format!(
                "Job \"{}\" set values, which its revert sets back by itself.",
                def.job_id
            ),
        ));
    }
    let set = def.set_values.clone().unwrap_or_default();
    set_back(
        &def.job_id,
        &Changed {
            set: &set,
            from_items: &def.set_from_items,
            expressions: &def.set_expressions,
        },
        &def.expect,
        def.record_before,
        reverted,
    )
}

/// What a job changed: columns set to values (`set`), to each item's own value
/// (`from_items`), and to an expression (`expressions`, their values before always
/// recorded).
struct Changed<'a> {
    set: &'a BTreeMap<String, Value>,
    from_items: &'a [String],
    expressions: &'a BTreeMap<String, String>,
}

/// The revert of a job that changed `changed` on rows expected to hold `expect`. A
/// column goes back to the value the job expected of every row, or, where the job
/// recorded its values before the change (`record_before`, and any column set by an
/// expression), to each item's own. The revert's rows must hold what the job set: the
/// values of `set`, or each item's own value of a column set from it (which stays in
/// its guards); and the rest of what the job expected. A job that is itself a revert
/// sets a column by the expression of the job it reverted (`reverted`) again. Refused
/// when the value before of a column the job set is known no way.
fn set_back(
    job_id: &str,
    changed: &Changed,
    expect: &BTreeMap<String, Value>,
    record_before: bool,
    reverted: &BTreeMap<String, String>,
) -> Result<RevertTerms> {
    let Changed {
        set,
        from_items,
        expressions,
    } = *changed;
    // a revert's columns that the job it reverted set by an expression: set by it again
    let again: BTreeMap<String, String> = set
        .keys()
        .chain(from_items)
        .filter(|c| !expect.contains_key(*c))
        .filter_map(|c| reverted.get(c).map(|e| (c.clone(), e.clone())))
        .collect();
    // a column set from each item had its value before recorded with the item
    // (item_values.rs), or else expected of every row
    let unknown: Vec<String> = set
        .keys()
        .filter(|c| !expect.contains_key(*c) && !record_before)
        .filter(|c| !again.contains_key(*c))
        .map(|c| format!("\"{c}\""))
        .collect();
    if !unknown.is_empty() {
        return Err(BatchError::invalid_because(
            format!(
                "job \"{job_id}\" cannot be reverted: the values of {} before its change are not known",
                unknown.join(", ")
            ),
            "A job knows what a column held before it changed it when its approval expected that value of every row (expect => '{\"column\": value}'), or when it recorded each row's value at registration (record_before => true); this one did neither.",
        ));
    }
    let is_changed =
        |c: &String| set.contains_key(c) || from_items.contains(c) || expressions.contains_key(c);
    let mut still: BTreeMap<String, Value> = expect
        .iter()
        .filter(|(c, _)| !is_changed(c))
        .map(|(c, v)| (c.clone(), v.clone()))
        .collect();
    still.extend(set.iter().map(|(c, v)| (c.clone(), v.clone())));
    let (constant, recorded): (Vec<&String>, Vec<&String>) = set
        .keys()
        .chain(from_items)
        .chain(expressions.keys())
        .filter(|c| !again.contains_key(*c))
        .partition(|c| expect.contains_key(*c));
    Ok(RevertTerms {
        set_back: Some(
            constant
                .iter()
                .map(|c| ((*c).clone(), expect[*c].clone()))
                .collect(),
        ),
        from_items: recorded.into_iter().cloned().collect(),
        inverse: None,
        expect: still,
        strip: set
            .keys()
            .chain(expressions.keys())
            .filter(|c| expect.contains_key(*c))
            .chain(again.keys())
            .cloned()
            .collect(),
        expressions: again,
        action: Asked::Update,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> BTreeMap<String, Value> {
        v.as_object().unwrap().clone().into_iter().collect()
    }

    fn object(values: BTreeMap<String, Value>) -> Value {
        Value::Object(values.into_iter().collect())
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// The revert of a job that set no column by an expression, nor reverted one that did.
    fn revert_of(
        job_id: &str,
        set: &BTreeMap<String, Value>,
        from_items: &[String],
        expect: &BTreeMap<String, Value>,
        record_before: bool,
    ) -> Result<RevertTerms> {
        let none = BTreeMap::new();
        let changed = Changed {
            set,
            from_items,
            expressions: &none,
        };
        set_back(job_id, &changed, expect, record_before, &none)
    }

    fn texts(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(c, e)| (c.to_string(), e.to_string()))
            .collect()
    }

    #[test]
    fn columns_set_by_an_expression_go_back_item_by_item_and_are_not_expected() {
        let expressions = texts(&[("total_cents", "(round(t.total * 100))::bigint")]);
        let (set, none) = (map(json!({"status": "billed"})), BTreeMap::new());
        let job = Changed {
            set: &set,
            from_items: &[],
            expressions: &expressions,
        };
        let t = set_back("j", &job, &map(json!({"status": "open"})), false, &none).unwrap();
        assert_eq!(t.set_back.map(object), Some(json!({"status": "open"})));
        assert_eq!(t.from_items, names(&["total_cents"]));
        // the value an expression left differs row by row: the guard says whether the
        // row is as the job left it, the revert expects no one value of it
        assert_eq!(object(t.expect), json!({"status": "billed"}));
        assert_eq!(t.strip, names(&["status"]));
        assert!(t.expressions.is_empty());
        // an expected value before is set back as such
        let expect = map(json!({"status": "open", "total_cents": null}));
        let t = set_back("j", &job, &expect, false, &none).unwrap();
        assert_eq!(
            t.set_back.map(object),
            Some(json!({"status": "open", "total_cents": null}))
        );
        assert!(t.from_items.is_empty());
        assert_eq!(t.strip, names(&["status", "total_cents"]));
    }

    #[test]
    fn a_revert_of_a_revert_of_expressions_sets_them_again() {
        let expressions = texts(&[("total_cents", "(round(t.total * 100))::bigint")]);
        let none: BTreeMap<String, String> = BTreeMap::new();
        let empty = BTreeMap::new();
        let job = Changed {
            set: &empty,
            from_items: &[],
            expressions: &expressions,
        };
        let revert = set_back("j", &job, &BTreeMap::new(), false, &none).unwrap();
        let set_back_values = revert.set_back.clone().unwrap();
        let the_revert = Changed {
            set: &set_back_values,
            from_items: &revert.from_items,
            expressions: &BTreeMap::new(),
        };
        // alone, the revert sets back the values it recorded with each item before its
        // own change (item_values.rs): what the expression had left
        let alone = set_back(
            "j-back",
            &the_revert,
            &revert.expect,
            false,
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(alone.from_items, names(&["total_cents"]));
        // knowing the expression, it computes them again
        let again = set_back("j-back", &the_revert, &revert.expect, false, &expressions).unwrap();
        assert_eq!(again.expressions, expressions);
        assert!(again.from_items.is_empty());
        assert_eq!(again.set_back.map(object), Some(json!({})));
        // recorded again from the rows, not carried in the items
        assert_eq!(again.strip, names(&["total_cents"]));
    }

    #[test]
    fn a_revert_sets_back_what_was_expected_on_rows_that_hold_what_was_set() {
        let t = revert_of(
            "j",
            &map(json!({"status": "cancelled", "note": null})),
            &[],
            &map(json!({"status": "pending", "note": "x", "region": "eu"})),
            false,
        )
        .unwrap();
        assert_eq!(
            t.set_back.map(object),
            Some(json!({"status": "pending", "note": "x"}))
        );
        assert!(t.from_items.is_empty());
        assert_eq!(
            object(t.expect),
            json!({"status": "cancelled", "note": null, "region": "eu"})
        );
        assert_eq!(t.strip, names(&["note", "status"]));
    }

    #[test]
    fn values_recorded_before_are_set_back_item_by_item_and_stay_in_the_items() {
        let t = revert_of(
            "j",
            &map(json!({"plan": "standard", "status": "moved"})),
            &[],
            &map(json!({"status": "active"})),
            true,
        )
        .unwrap();
        assert_eq!(t.set_back.map(object), Some(json!({"status": "active"})));
        assert_eq!(t.from_items, names(&["plan"]));
        assert_eq!(
            object(t.expect),
            json!({"plan": "standard", "status": "moved"})
        );
        assert_eq!(t.strip, names(&["status"]));
    }

    #[test]
    fn a_revert_of_a_revert_is_the_job_again() {
        let (set, expect) = (
            map(json!({"status": "cancelled"})),
            map(json!({"status": "pending"})),
        );
        let back = revert_of("j", &set, &[], &expect, false).unwrap();
        let again = revert_of("j-back", &back.set_back.unwrap(), &[], &back.expect, false).unwrap();
        assert_eq!(again.set_back.unwrap(), set);
        assert_eq!(again.expect, expect);
    }

    #[test]
    fn a_revert_of_a_revert_of_values_recorded_before_sets_what_the_job_set() {
        // the job set plan and recorded each row's plan before; its revert sets each
        // row's own plan back and expects the job's; the revert of that sets the job's
        // plan again, on rows that hold their own plan (kept in the items as a guard)
        let job = revert_of(
            "j",
            &map(json!({"plan": "standard"})),
            &[],
            &BTreeMap::new(),
            true,
        )
        .unwrap();
        let back = job.set_back.clone().unwrap();
        let again = revert_of("j-back", &back, &job.from_items, &job.expect, false).unwrap();
        assert_eq!(
            again.set_back.map(object),
            Some(json!({"plan": "standard"}))
        );
        assert!(again.from_items.is_empty() && again.strip.is_empty());
        assert_eq!(object(again.expect), json!({}));
    }

    #[test]
    fn values_set_from_each_item_go_back_to_what_each_row_held_and_forth_again() {
        // set_from_query: the values before were recorded with each item, so the revert
        // sets them back item by item, and its own revert the job's values again
        let job = revert_of(
            "backfill",
            &BTreeMap::new(),
            &names(&["region"]),
            &map(json!({"status": "open"})),
            false,
        )
        .unwrap();
        assert_eq!(job.set_back.clone().map(object), Some(json!({})));
        assert_eq!(job.from_items, names(&["region"]));
        assert_eq!(object(job.expect.clone()), json!({"status": "open"}));
        assert!(job.strip.is_empty());
        let again = revert_of(
            "backfill-back",
            &BTreeMap::new(),
            &job.from_items,
            &job.expect,
            false,
        )
        .unwrap();
        assert_eq!(again.from_items, names(&["region"]));
        assert_eq!(object(again.expect), json!({"status": "open"}));
    }

    #[test]
    fn a_column_set_without_a_value_known_before_is_refused_by_name() {
        let e = revert_of(
            "move",
            &map(json!({"plan": "standard", "status": "x"})),
            &[],
            &map(json!({"status": "y"})),
            false,
        )
        .err()
        .unwrap();
        let r = e.report();
        assert!(
            r.message.contains("the values of \"plan\" before"),
            "{}",
            r.message
        );
        assert!(!r.message.contains("status"), "{}", r.message);
        assert!(revert_of(
            "move",
            &map(json!({"plan": "standard"})),
            &[],
            &BTreeMap::new(),
            true
        )
        .is_ok());
    }
}
