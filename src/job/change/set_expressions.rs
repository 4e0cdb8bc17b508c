//! Columns set to an SQL expression over the row's own columns (set_expressions): each
//! one expression, checked when the job is registered and kept as PostgreSQL prints it
//! back, evaluated in the chunk's one guarded UPDATE (set_values.rs builds it) on the
//! rows that still match their items. Nothing else knows what such a column held
//! before, so the job records it in each item (record_before), and its revert sets it
//! back item by item.
//!
//! What registration asks of each expression, in order:
//! - the text is one expression: parsed as the one value of `SELECT (...)`, nothing may
//!   close the parenthesis and go on (a second statement, a FROM, a second value);
//! - analyzed as the one value of `SELECT ... FROM ONLY <target> AS t`, as the
//!   registering role with its search_path: it names columns of the target alone (any
//!   other name fails as PostgreSQL fails it), and has no subquery, aggregate, window
//!   function, set-returning or volatile function;
//! - its type is one UPDATE assigns to the column (an assignment cast);
//! - printed back with every object outside pg_catalog schema-qualified, and run as
//!   the registering role on no row, which asks EXECUTE on every function it calls.
//!
//! Only the printed text is kept, compared when the job id comes again, and spliced
//! into the chunk's UPDATE; the caller's text never is. A chunk runs with pg_catalog
//! first in its search_path (`search_path`), so the text means what it meant here.

use crate::error::{BatchError, Result};
use crate::job::target::Target;
use crate::parse::{self, Expression};
use crate::query;
use pgrx::pg_sys;
use pgrx::spi::quote_identifier;
use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::CStr;

/// The alias of the target in the chunk's UPDATE, which prefixes every column an
/// expression reads.
const ALIAS: &CStr = c"t";

/// The search_path an expression is printed under: what it names outside pg_catalog
/// comes out schema-qualified.
const PRINTED_WITH: &str = "pg_catalog";

/// The expressions as the caller gives them: an object of column -> expression text.
pub(crate) fn given(value: &Value) -> Result<BTreeMap<String, String>> {
    let object = value.as_object().ok_or_else(|| {
        BatchError::invalid_because(
            "set_expressions must be a JSON object",
            format!("It is {}.", crate::job::rules::columns::json_kind(value)),
        )
    })?;
    object
        .iter()
        .map(|(column, expression)| match expression.as_str() {
            Some(text) if !text.trim().is_empty() => Ok((column.clone(), text.to_string())),
            _ => Err(BatchError::invalid_because(
                format!(
                    "set_expressions for column \"{column}\" must be the text of an SQL expression"
                ),
                format!(
                    "It is {}.",
                    crate::job::rules::columns::json_kind(expression)
                ),
            )),
        })
        .collect()
}

/// Expressions kept by a job, as set_expressions takes them again (for its remainder,
/// or a revert that sets them again); None for none.
pub(crate) fn as_argument(expressions: &BTreeMap<String, String>) -> Option<Value> {
    (!expressions.is_empty()).then(|| {
        expressions
            .iter()
            .map(|(c, e)| (c.clone(), Value::String(e.clone())))
            .collect::<serde_json::Map<_, _>>()
            .into()
    })
}

/// Each expression checked against the target (the module's rules), as PostgreSQL
/// prints it back: what the job keeps and runs. The columns were checked already
/// (set_values::check).
pub(crate) fn check(
    target: &Target,
    table: pg_sys::Oid,
    given: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    given
        .iter()
        .map(|(column, text)| Ok((column.clone(), check_one(target, table, column, text)?)))
        .collect()
}

fn check_one(target: &Target, table: pg_sys::Oid, column: &str, text: &str) -> Result<String> {
    let refused = |what: &str, detail: &str| {
        Err(BatchError::invalid_because(
            format!("set_expressions for column \"{column}\" {what}"),
            detail.to_string(),
        ))
    };
    match parse::expression(text) {
        Err(failure) => failure.raise(
            format!("The expression for column \"{column}\" of set_expressions does not parse."),
            "Give one SQL expression over the target's columns.".into(),
        ),
        Ok(Expression::NotOne { what }) => {
            return refused(
                "must be one expression",
                &format!("The text goes on past one expression: it is {what}."),
            )
        }
        Ok(Expression::One) => {}
    }
    let sql = format!(
        "SELECT (\n{text}\n) FROM ONLY {} AS {}",
        target.sql_name,
        ALIAS.to_str().unwrap_or("t")
    );
    let context = format!("while checking set_expressions for column \"{column}\"");
    let analyzed =
        crate::txn::with_context(&context, || query::expression(&sql, ALIAS, PRINTED_WITH))?;
    let row_alone = "An expression is evaluated in the chunk's one UPDATE, once for each row it changes, from that row's own columns alone.";
    if analyzed.has_subquery {
        return refused("must not contain a subquery", row_alone);
    }
    if analyzed.has_aggregate {
        return refused("must not contain an aggregate", row_alone);
    }
    if analyzed.has_window_function {
        return refused("must not contain a window function", row_alone);
    }
    if analyzed.returns_set {
        return refused("must not call a set-returning function", row_alone);
    }
    if analyzed.one_value_of != Some(table) {
        return refused(
            "must be one expression",
            "It must read the target's own columns alone, as one value.",
        );
    }
    if analyzed.volatile {
        return refused(
            "must not call a volatile function",
            "A volatile function (random(), clock_timestamp(), nextval()) gives another value each time it runs: a chunk run again, or a revert of a revert, would not set what was approved.",
        );
    }
    let column_type = target.shape.columns[column].type_oid;
    if !assignable(analyzed.type_oid, column_type) {
        return Err(BatchError::TypeMismatch {
            message: format!(
                "column \"{column}\" is of type {} but its expression is of type {}",
                type_name(column_type),
                type_name(analyzed.type_oid)
            ),
            detail: "An expression's value is assigned to its column as UPDATE assigns it, with an assignment cast at most; cast it in the expression.".into(),
        });
    }
    // executor startup asks EXECUTE on every function the expression calls, and SELECT
    // on the columns it reads, of the registering role: on no row, nothing runs
    let asked = format!(
        "SELECT {} FROM ONLY {} AS {} WHERE false",
        analyzed.text,
        target.sql_name,
        ALIAS.to_str().unwrap_or("t")
    );
    let path = search_path(&crate::settings::current(c"search_path").unwrap_or_default());
    crate::txn::with_context(&context, || {
        crate::settings::with(&[(c"search_path", path.as_str())], || {
            query::run(&asked, &[])
        })
    })?;
    Ok(analyzed.text)
}

/// Whether UPDATE assigns a value of type `from` to a column of type `to`.
fn assignable(from: pg_sys::Oid, to: pg_sys::Oid) -> bool {
    // SAFETY: reads the catalogs about two type OIDs, both of types that exist.
    unsafe { pg_sys::can_coerce_type(1, &from, &to, pg_sys::CoercionContext::COERCION_ASSIGNMENT) }
}

/// A type's name as PostgreSQL prints it in messages.
fn type_name(oid: pg_sys::Oid) -> String {
    // SAFETY: format_type_be returns a palloc'd string for any OID.
    unsafe {
        CStr::from_ptr(pg_sys::format_type_be(oid))
            .to_string_lossy()
            .into_owned()
    }
}

/// The assignments of the columns set by an expression, in the chunk's UPDATE of the
/// target aliased `t`.
pub(crate) fn assignments(
    expressions: &BTreeMap<String, String>,
) -> impl Iterator<Item = String> + '_ {
    expressions
        .iter()
        .map(|(column, text)| format!("{} = {text}", quote_identifier(column)))
}

/// The search_path a job that sets expressions changes rows with: pg_catalog first, as
/// its expressions were printed, so that a name they leave bare is pg_catalog's, then
/// the temporary schema (searched for relations and types only, and otherwise first),
/// then the registering session's own.
pub(crate) fn search_path(registrant: &str) -> String {
    if registrant.trim().is_empty() {
        return "pg_catalog, pg_temp".to_string();
    }
    format!("pg_catalog, pg_temp, {registrant}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn expressions_are_an_object_of_texts() {
        let given = given(&json!({"total_cents": "round(total * 100)::bigint"})).unwrap();
        assert_eq!(given["total_cents"], "round(total * 100)::bigint");
        for bad in [
            json!(["lower(email)"]),
            json!({"email": 1}),
            json!({"email": " "}),
        ] {
            assert!(super::given(&bad).is_err(), "{bad}");
        }
        let e = super::given(&json!({"email": null})).err().unwrap();
        assert!(
            e.report().message.contains("column \"email\""),
            "{}",
            e.report().message
        );
    }

    #[test]
    fn a_chunk_searches_pg_catalog_first_then_the_registrants_path() {
        assert_eq!(
            search_path("\"$user\", public"),
            "pg_catalog, pg_temp, \"$user\", public"
        );
        assert_eq!(search_path(""), "pg_catalog, pg_temp");
    }
}
