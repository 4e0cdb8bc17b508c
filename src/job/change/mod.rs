//! A job's kind of change: what it does to the row of each approved item. One module per
//! kind, each owning what the kind owns: what registration checks for it, the set-based
//! statement a chunk runs and how its rows are read, and how the change is reverted.
//! The rest of job/ asks the kind (`KindOfChange`, chosen here, once), never which one
//! it is.
//!
//! - `set_values`  a guarded UPDATE to the values the approval names.
//! - `item_values` a guarded UPDATE to each item's own values, recorded in its guards (a
//!   revert's set_from_items), with set_values' if it has any.
//! - `handler`     a function called once per item, returning the row's new state.

pub(crate) mod handler;
pub(crate) mod item_values;
pub(crate) mod set_values;

use crate::error::{BatchError, Result};
use crate::job::definition::Definition;
use crate::job::rules::approval::Action;
use crate::job::rules::shape::Shape;
use crate::job::target::{Constants, Target};
use crate::query;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use serde_json::Value;
use std::collections::BTreeMap;

/// The statements a chunk runs: its change, and what reads each changed row's guard
/// value after a change that does not return it (a handler's).
pub(crate) struct ChunkSql {
    pub(crate) change: String,
    pub(crate) guard_after: Option<String>,
}

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
/// approval's action (set_values, or a handler's name).
pub(crate) fn approve(
    shape: &Shape,
    set_values: Option<&Value>,
    handler: Option<pg_sys::Oid>,
    from_items: &[String],
) -> Result<Action> {
    match (set_values, handler) {
        (Some(values), None) => Ok(Action::Set(set_values::check(shape, values, from_items)?)),
        (None, Some(handler)) => Ok(Action::Handler(handler::check(handler)?)),
        _ => Err(BatchError::invalid_because(
            "a job needs either set_values or a handler",
            "Give set_values for a guarded UPDATE, or a handler function (item jsonb) RETURNS jsonb, not both.",
        )),
    }
}

/// The columns whose values before the change registration records (record_before).
pub(crate) fn recorded(action: &Action, record_before: bool) -> Result<Vec<String>> {
    match (action, record_before) {
        (_, false) => Ok(Vec::new()),
        (Action::Set(values), true) => Ok(values.keys().cloned().collect()),
        (Action::Handler(_), true) => Err(handler::records_nothing()),
    }
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

/// The columns the registering role must be allowed to UPDATE: those set, and those set
/// from each item (a handler's own change asks EXECUTE on it instead).
pub(crate) fn updated_columns(action: &Action, from_items: &[String]) -> Vec<String> {
    let set = match action {
        Action::Set(values) => values.keys().cloned().collect(),
        Action::Handler(_) => Vec::new(),
    };
    set.into_iter().chain(from_items.iter().cloned()).collect()
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

    /// The statements a chunk of `def` runs on `target`: $1 and $2 the chunk's
    /// positions, $3 the tenant, then the constants; for a guarded UPDATE
    /// (`is_guarded_update`), then the chunk's key bounds and its arrays.
    pub(crate) fn chunk_sql(
        self,
        def: &Definition,
        target: &Target,
        constants: &Constants,
        key_bounds: bool,
    ) -> ChunkSql {
        match self {
            KindOfChange::SetValues | KindOfChange::ItemValues => ChunkSql {
                change: set_values::chunk_sql(target, &def.guard_columns, constants, key_bounds),
                guard_after: None,
            },
            KindOfChange::Handler => ChunkSql {
                change: handler::chunk_sql(
                    target,
                    def.tables.items(),
                    def.chunk_size,
                    def.handler.as_deref().unwrap_or_default(),
                    &def.guard_columns,
                    constants,
                ),
                guard_after: handler::guard_after_sql(target, def.tables.items(), def.chunk_size),
            },
        }
    }

    /// Whether the chunk's statement is etc_batch's own guarded UPDATE, planned as a
    /// chunk is best run and bound with the chunk's values; a handler reads the chunk's
    /// items itself, and its own statements are planned as it plans them.
    pub(crate) fn is_guarded_update(self) -> bool {
        self != KindOfChange::Handler
    }

    /// Runs a chunk's statements `sql` with `args` and reads what it changed.
    pub(crate) fn run(
        self,
        sql: &ChunkSql,
        args: &[DatumWithOid],
        planning: query::Planning,
        items: usize,
    ) -> Result<Ran> {
        match self {
            KindOfChange::SetValues | KindOfChange::ItemValues => {
                set_values::run(&sql.change, args, planning, items)
            }
            KindOfChange::Handler => handler::run(sql, args, items),
        }
    }

    /// What the revert of `def` sets and expects (`inverse`: the handler that undoes a
    /// handler's change); refused when the values before the change are not known.
    pub(crate) fn reverted(
        self,
        def: &Definition,
        inverse: Option<pg_sys::Oid>,
    ) -> Result<RevertTerms> {
        match self {
            KindOfChange::SetValues | KindOfChange::ItemValues => {
                set_values::reverted(def, inverse)
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
