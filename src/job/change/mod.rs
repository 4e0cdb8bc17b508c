//! A job's kind of change: what it does to the row of each approved item. One module per
//! kind, each owning what the kind owns: what registration checks for it, the set-based
//! statement a chunk runs and how its rows are read, and how the change is reverted.
//! The rest of job/ asks the kind (`KindOfChange`, chosen here, once), never which one
//! it is.
//!
//! - `set_values`  a guarded UPDATE to the values the approval names.
//! - `set_expressions` columns of that UPDATE set to an expression over the row's own
//!   columns, checked and printed back at registration; their values before recorded.
//! - `item_values` a guarded UPDATE to each item's own values, recorded in its guards (a
//!   revert's set_from_items), with set_values' if it has any.
//! - `handler`     a function called once per item, returning the row's new state.

pub(crate) mod handler;
pub(crate) mod item_values;
pub(crate) mod set_expressions;
pub(crate) mod set_values;

use crate::error::{BatchError, Result};
use crate::job::definition::Definition;
use crate::job::rules::approval::Action;
use crate::job::rules::guard::Guard;
use crate::job::target::{Constants, Target};
use crate::query;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use serde_json::Value;
use std::collections::BTreeMap;

/// A job's kind of change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KindOfChange {
    SetValues,
    ItemValues,
    Handler,
}

/// What a chunk's change did: the items it changed, each one's position and its guard
/// value now (a revision, a digest); and those a handler refused (returned NULL for), in
/// position order.
pub(crate) struct Ran {
    pub(crate) changed: Vec<(i32, Option<i64>)>,
    pub(crate) refused: Vec<i32>,
}

/// The kind of change a registration asks for, checked against the target: the
/// approval's action (set_values, or a handler's name), and the columns set by an
/// expression, each as PostgreSQL prints it back (set_expressions.rs).
pub(crate) fn approve(
    target: &Target,
    table: pg_sys::Oid,
    guard: &Guard,
    set_values: Option<&Value>,
    set_expressions: Option<&Value>,
    handler: Option<pg_sys::Oid>,
    from_items: &[String],
) -> Result<(Action, BTreeMap<String, String>)> {
    let given = match set_expressions {
        Some(expressions) => set_expressions::given(expressions)?,
        None => BTreeMap::new(),
    };
    match (set_values, handler) {
        (None, Some(handler)) if given.is_empty() => Ok((
            Action::Handler(handler::check(guard, handler)?),
            BTreeMap::new(),
        )),
        (values, None) if values.is_some() || !given.is_empty() => {
            let columns: Vec<String> = given.keys().cloned().collect();
            let values = set_values::check(&target.shape, values, &columns, from_items)?;
            let expressions = set_expressions::check(target, table, &given)?;
            Ok((Action::Set(values), expressions))
        }
        _ => Err(BatchError::invalid_because(
            "a job needs set_values or set_expressions, or a handler",
            "Give set_values (constants) or set_expressions (computed from each row) for a guarded UPDATE, or a handler function (item jsonb) RETURNS jsonb, not both.",
        )),
    }
}

/// The columns whose values before the change registration records: those set by an
/// expression always (nothing else knows them), and with record_before those set to
/// values too.
pub(crate) fn recorded(
    action: &Action,
    expressions: &BTreeMap<String, String>,
    record_before: bool,
) -> Result<Vec<String>> {
    let mut columns: Vec<String> = match (action, record_before) {
        (_, false) => Vec::new(),
        (Action::Set(values), true) => values.keys().cloned().collect(),
        (Action::Handler(_), true) => return Err(handler::records_nothing()),
    };
    columns.extend(expressions.keys().cloned());
    columns.sort();
    Ok(columns)
}

/// What registration asks of the target's constraints before anything is stored: a
/// value to set that a CHECK constraint refuses, found now rather than at every chunk.
pub(crate) fn check_constraints(
    target: &Target,
    table: pg_sys::Oid,
    action: &Action,
) -> Result<()> {
    match action {
        Action::Set(values) => set_values::check_constraints(target, table, values),
        Action::Handler(_) => Ok(()),
    }
}

/// The columns the registering role must be allowed to UPDATE: those set, by a value
/// or an expression, and those set from each item (a handler's own change asks EXECUTE
/// on it instead).
pub(crate) fn updated_columns(
    action: &Action,
    expressions: &BTreeMap<String, String>,
    from_items: &[String],
) -> Vec<String> {
    let set = match action {
        Action::Set(values) => values.keys().cloned().collect(),
        Action::Handler(_) => Vec::new(),
    };
    set.into_iter()
        .chain(expressions.keys().cloned())
        .chain(from_items.iter().cloned())
        .collect()
}

impl KindOfChange {
    /// The kind of change of a registered job.
    pub(crate) fn of(def: &Definition) -> KindOfChange {
        match (&def.handler, def.set_from_items.is_empty()) {
            (Some(_), _) => KindOfChange::Handler,
            (None, false) => KindOfChange::ItemValues,
            (None, true) => KindOfChange::SetValues,
        }
    }

    /// The one statement a chunk of `def` runs on `target`: $1 and $2 the chunk's
    /// positions, $3 the tenant; then, for a guarded UPDATE (`binds_chunk`), the
    /// constants, the chunk's key bounds and its arrays.
    pub(crate) fn chunk_sql(
        self,
        def: &Definition,
        target: &Target,
        constants: &Constants,
        key_bounds: bool,
    ) -> String {
        match self {
            KindOfChange::SetValues | KindOfChange::ItemValues => set_values::chunk_sql(
                target,
                &def.guard_columns,
                constants,
                &def.set_expressions,
                key_bounds,
            ),
            KindOfChange::Handler => handler::chunk_sql(
                target,
                def.tables.items(),
                def.chunk_size,
                def.handler.as_deref().unwrap_or_default(),
            ),
        }
    }

    /// Whether the chunk's statement is etc_batch's own guarded UPDATE, planned as a
    /// chunk is best run and bound with the chunk's values; a handler reads the chunk's
    /// items itself, and its own statements are planned as it plans them.
    pub(crate) fn is_guarded_update(self) -> bool {
        self != KindOfChange::Handler
    }

    /// Runs a chunk's statement `sql` with `args` and reads what it changed.
    pub(crate) fn run(
        self,
        def: &Definition,
        sql: &str,
        args: &[DatumWithOid],
        planning: query::Planning,
        items: usize,
    ) -> Result<Ran> {
        match self {
            KindOfChange::SetValues | KindOfChange::ItemValues => {
                set_values::run(sql, args, planning, items)
            }
            KindOfChange::Handler => handler::run(def, sql, args, items),
        }
    }

    /// What the revert of `def` sets and expects (`inverse`: the handler that undoes a
    /// handler's change); refused when the values before the change are not known.
    /// `reverted_expressions`: for a revert, the expressions of the job it reverts, which
    /// its own revert sets again.
    pub(crate) fn reverted(
        self,
        def: &Definition,
        inverse: Option<pg_sys::Oid>,
        reverted_expressions: &BTreeMap<String, String>,
    ) -> Result<RevertTerms> {
        match self {
            KindOfChange::SetValues | KindOfChange::ItemValues => {
                set_values::reverted(def, inverse, reverted_expressions)
            }
            KindOfChange::Handler => handler::reverted(def, inverse),
        }
    }
}

/// What a revert of a job sets and expects, as the job's kind of change knows it.
#[derive(Debug)]
pub(crate) struct RevertTerms {
    /// The values the columns the job set had before it, where one value held for every
    /// row (the job's expect): what the revert sets them to. None for a handler job.
    pub(crate) set_back: Option<BTreeMap<String, Value>>,
    /// The columns set back to each item's own value before the change, recorded in its
    /// guards (record_before): the revert's set_from_items.
    pub(crate) from_items: Vec<String>,
    /// A handler job's inverse.
    pub(crate) inverse: Option<pg_sys::Oid>,
    /// The columns the revert sets by an expression again: a revert of a revert of a
    /// job that set them so.
    pub(crate) expressions: BTreeMap<String, String>,
    /// What every row must still hold: the values the job set, and the other values it
    /// expected (which its change left as they were).
    pub(crate) expect: BTreeMap<String, Value>,
    /// The columns taken out of each item's guards: values that held before the change
    /// and no longer do, which the revert expects and sets as the job's terms say.
    pub(crate) strip: Vec<String>,
}

impl RevertTerms {
    /// The columns of an item's guards its row must still hold for the revert: the job's
    /// guards (and the values a revert set from each item, which it expects back), less
    /// those taken out and those that are values to set.
    pub(crate) fn guard_columns(&self, def: &Definition) -> Vec<String> {
        let mut columns: Vec<String> = def
            .guard_columns
            .iter()
            .chain(&def.set_from_items)
            .filter(|c| !self.strip.contains(c) && !self.from_items.contains(c))
            .cloned()
            .collect();
        columns.sort();
        columns.dedup();
        columns
    }
}
