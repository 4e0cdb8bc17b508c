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
//! - `delete`      a guarded DELETE, the rows kept with the audit.
//! - `move_rows`   a guarded DELETE whose rows are inserted into an archive table, in the
//!   same statement, and kept with the audit as a delete's.
//! - `cascade`     the rows of other tables a delete reaches through foreign keys, which
//!   refuse a job that deletes rows (nothing would keep them).
//! - `restore`     the revert of those two: the rows kept inserted again where their key
//!   is free, a move's taken back from its archive in the same statement.

pub(crate) mod cascade;
pub(crate) mod delete;
pub(crate) mod handler;
pub(crate) mod item_values;
pub(crate) mod move_rows;
pub(crate) mod restore;
pub(crate) mod set_expressions;
pub(crate) mod set_values;

use crate::error::{BatchError, Result};
use crate::job::definition::{Definition, Deletion};
use crate::job::rules::approval::Action;
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
    Delete,
    Move,
    Restore,
}

/// What a registration asks to do to each row (its action, and a move's archive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    Update,
    Delete,
    Move(pg_sys::Oid),
    /// A revert's, of a delete or a move (from its archive): never given by a caller.
    Restore(Option<pg_sys::Oid>),
}

impl Asked {
    /// The action register_job is given, with its archive.
    pub(crate) fn parse(action: &str, archive: Option<pg_sys::Oid>) -> Result<Asked> {
        match (action, archive) {
            ("update", None) => Ok(Asked::Update),
            ("delete", None) => Ok(Asked::Delete),
            ("move", Some(archive)) => Ok(Asked::Move(archive)),
            ("move", None) => Err(BatchError::invalid_because(
                "action 'move' needs an archive",
                "Name the table the rows are moved to: archive => 'schema.table'.",
            )),
            ("update" | "delete", Some(_)) => Err(BatchError::invalid_because(
                format!("an archive is for action 'move', not '{action}'"),
                "A job moves its rows to an archive table with action => 'move', archive => 'schema.table'.",
            )),
            (other, _) => Err(BatchError::invalid_because(
                format!("unknown action \"{other}\""),
                "A job updates its rows (action => 'update', with set_values or a handler), deletes them ('delete'), or moves them to an archive table ('move').",
            )),
        }
    }
}

/// What a chunk's change did: the items it changed, each one's position and its guard
/// value now (a revision, a digest); and those a handler refused (returned NULL for), in
/// position order.
pub(crate) struct Ran {
    pub(crate) changed: Vec<(i32, Option<i64>)>,
    pub(crate) refused: Vec<i32>,
    /// For a job that deletes its rows and keeps them: each deleted row's position and
    /// content (delete::kept_row).
    pub(crate) kept: Vec<(i32, String)>,
}

/// The kind of change a registration asks for, checked against the target (`table`):
/// the approval's action (set_values, a handler's name, a delete, a move and its
/// archive), and the columns set by an expression, each as PostgreSQL prints it back
/// (set_expressions.rs); `keep`: whether a delete's or a move's rows are kept with the
/// audit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn approve(
    target: &Target,
    table: pg_sys::Oid,
    asked: Asked,
    set_values: Option<&Value>,
    set_expressions: Option<&Value>,
    handler: Option<pg_sys::Oid>,
    from_items: &[String],
    keep: bool,
) -> Result<(Action, BTreeMap<String, String>)> {
    if !keep && asked == Asked::Update {
        return Err(BatchError::invalid_because(
            "keep_deleted is for a job that deletes its rows",
            "keep_deleted => false says not to keep the rows a job with action 'delete' or 'move' deletes.",
        ));
    }
    let given = match set_expressions {
        Some(expressions) => set_expressions::given(expressions)?,
        None => BTreeMap::new(),
    };
    item_values::check_named_once(from_items)?;
    if handler.is_some() && !from_items.is_empty() && asked == Asked::Update {
        return Err(BatchError::invalid_because(
            "a job with a handler sets no values from its items",
            "A handler makes its own change; set_from_query is for a guarded UPDATE without one.",
        ));
    }
    let deletes = |action: &str| {
        match (handler, given.is_empty(), from_items.is_empty()) {
        (Some(_), ..) => Err(BatchError::invalid_because(
            "a job that deletes its rows has no handler",
            "A handler makes its own change, with action 'update' (the default).",
        )),
        (None, false, _) | (None, _, false) => Err(BatchError::invalid_because(
            format!(
                "a job with action '{action}' sets no {}",
                if given.is_empty() { "values from its items" } else { "expressions" }
            ),
            "set_expressions and set_from_query are for action 'update'; a job that deletes or moves its rows changes nothing in them.",
        )),
        (None, true, true) => Ok(()),
    }
    };
    match (asked, set_values, handler) {
        (Asked::Restore(archive), None, None) if given.is_empty() && from_items.is_empty() => {
            Ok((restore::check(target, archive)?, BTreeMap::new()))
        }
        (Asked::Restore(_), ..) => Err(BatchError::Internal(
            "a restore sets nothing and has no handler".into(),
        )),
        (Asked::Delete, ..) => {
            deletes("delete")?;
            cascade::refuse(table, &target.display)?;
            Ok((delete::check(set_values, keep)?, BTreeMap::new()))
        }
        (Asked::Move(archive), ..) => {
            deletes("move")?;
            cascade::refuse(table, &target.display)?;
            Ok((
                move_rows::check(target, table, set_values, archive, keep)?,
                BTreeMap::new(),
            ))
        }
        (Asked::Update, None, Some(handler)) if given.is_empty() && from_items.is_empty() => {
            Ok((Action::Handler(handler::check(handler)?), BTreeMap::new()))
        }
        (Asked::Update, values, None)
            if values.is_some() || !given.is_empty() || !from_items.is_empty() =>
        {
            let columns: Vec<String> = given.keys().cloned().collect();
            let values = set_values::check(&target.shape, values, &columns, from_items)?;
            let expressions = set_expressions::check(target, table, &given)?;
            Ok((Action::Set(values), expressions))
        }
        (Asked::Update, ..) => Err(BatchError::invalid_because(
            "a job needs set_values, set_expressions or set_from_query, or a handler",
            "Give set_values (constants), set_expressions (computed from each row) or set_from_query (each item's own values) for a guarded UPDATE, or a handler function (item jsonb) RETURNS jsonb, not both; or action => 'delete' or 'move' for a job that deletes its rows.",
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
        (Action::Delete { .. } | Action::Move { .. } | Action::Restore { .. }, true) => {
            return Err(BatchError::invalid_because(
                "record_before is for a job that sets values",
                "A job that deletes its rows keeps each row whole with its chunk's audit (keep_deleted).",
            ))
        }
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
        Action::Handler(_)
        | Action::Delete { .. }
        | Action::Move { .. }
        | Action::Restore { .. } => Ok(()),
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
        Action::Handler(_)
        | Action::Delete { .. }
        | Action::Move { .. }
        | Action::Restore { .. } => Vec::new(),
    };
    set.into_iter()
        .chain(expressions.keys().cloned())
        .chain(from_items.iter().cloned())
        .collect()
}

/// The search_path the change of `def` runs with: the registering session's, with
/// pg_catalog first for a job that sets expressions, as they were printed
/// (set_expressions::search_path).
pub(crate) fn search_path(def: &Definition) -> String {
    if def.set_expressions.is_empty() {
        def.search_path.clone()
    } else {
        set_expressions::search_path(&def.search_path)
    }
}

/// The columns whose values before the change each item of `def` holds in its guards,
/// recorded at registration (recorded).
pub(crate) fn recorded_by(def: &Definition) -> Vec<String> {
    recorded(&def.terms().action, &def.set_expressions, def.record_before).unwrap_or_default()
}

impl KindOfChange {
    /// The kind of change of a registered job.
    pub(crate) fn of(def: &Definition) -> KindOfChange {
        if def.restores.is_some() {
            return KindOfChange::Restore;
        }
        match (&def.deletes, &def.handler, def.set_from_items.is_empty()) {
            (Some(Deletion { archive: None, .. }), ..) => KindOfChange::Delete,
            (
                Some(Deletion {
                    archive: Some(_), ..
                }),
                ..,
            ) => KindOfChange::Move,
            (None, Some(_), _) => KindOfChange::Handler,
            (None, None, false) => KindOfChange::ItemValues,
            (None, None, true) => KindOfChange::SetValues,
        }
    }

    /// Whether a chunk keeps the rows it deletes, in their text form: read under
    /// settings that print a value the same in every session.
    pub(crate) fn keeps_rows(self, def: &Definition) -> bool {
        def.deletes.as_ref().is_some_and(|d| d.keep)
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
                change: set_values::chunk_sql(
                    target,
                    &def.guard_columns,
                    constants,
                    &def.set_expressions,
                    key_bounds,
                ),
                guard_after: None,
            },
            KindOfChange::Delete => ChunkSql {
                change: delete::chunk_sql(
                    target,
                    &def.guard_columns,
                    constants,
                    key_bounds,
                    self.keeps_rows(def),
                ),
                guard_after: None,
            },
            KindOfChange::Move => ChunkSql {
                change: move_rows::chunk_sql(
                    target,
                    &def.guard_columns,
                    constants,
                    key_bounds,
                    def.deletes
                        .as_ref()
                        .and_then(|d| d.archive.as_deref())
                        .unwrap_or_default(),
                    self.keeps_rows(def),
                ),
                guard_after: None,
            },
            KindOfChange::Restore => ChunkSql {
                change: restore::chunk_sql(target, constants, key_bounds, restored_from(def)),
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

    /// Whether the chunk's statement reads the target by its key, joined to the chunk's
    /// items, and is planned to (run/drainer.rs, `changing`): a restore inserts, and
    /// reads an archive that may have no index at all.
    pub(crate) fn reads_the_target_by_key(self) -> bool {
        self.is_guarded_update() && self != KindOfChange::Restore
    }

    /// Whether a chunk deletes rows of the target (a delete, a move), which foreign keys
    /// made since registration may carry to other tables (cascade.rs).
    pub(crate) fn deletes_rows(self) -> bool {
        matches!(self, KindOfChange::Delete | KindOfChange::Move)
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
            KindOfChange::SetValues
            | KindOfChange::ItemValues
            | KindOfChange::Delete
            | KindOfChange::Move
            | KindOfChange::Restore => run_set_based(&sql.change, args, planning, items),
            KindOfChange::Handler => handler::run(sql, args, items),
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
            // a revert puts back the rows a job deleted; without them there is nothing to
            // put back, whatever register_revert learns to do with the rows kept
            KindOfChange::Delete | KindOfChange::Move if !self.keeps_rows(def) => {
                Err(BatchError::Unsupported {
                    message: format!(
                        "job \"{}\" cannot be reverted: it kept no rows",
                        def.job_id
                    ),
                    detail: "The job was registered with keep_deleted => false, so the rows it deleted were not kept and cannot be put back.".into(),
                })
            }
            KindOfChange::Delete | KindOfChange::Move => {
                no_inverse(def, inverse)?;
                Ok(restore::of_deleted(archive_of(def)?))
            }
            KindOfChange::Restore => {
                no_inverse(def, inverse)?;
                Ok(restore::reverted(archive_of(def)?))
            }
        }
    }

    /// The statement that finds the items of a chunk it did not change, first (a
    /// conflict) or all (skipped), with the row each names now.
    pub(crate) fn mismatches_sql(
        self,
        def: &Definition,
        target: &Target,
        constants: &Constants,
    ) -> String {
        match self {
            KindOfChange::Restore => restore::mismatches_sql(
                target,
                def.tables.items(),
                def.chunk_size,
                restored_from(def),
            ),
            _ => target.mismatches_sql(
                def.tables.items(),
                def.chunk_size,
                &def.guard_columns,
                constants,
            ),
        }
    }
}

/// The archive a move of `def` put its rows in, or a restore of `def` takes them back
/// from, by its name.
fn restored_from(def: &Definition) -> Option<&str> {
    match (&def.deletes, &def.restores) {
        (Some(deletion), _) => deletion.archive.as_deref(),
        (None, Some(restoring)) => restoring.archive.as_deref(),
        (None, None) => None,
    }
}

/// The archive of `def` (restored_from), found by its name.
fn archive_of(def: &Definition) -> Result<Option<pg_sys::Oid>> {
    restored_from(def).map(move_rows::archive_oid).transpose()
}

/// A revert that puts rows back, or deletes them again, is etc_batch's own: refused with
/// an inverse.
fn no_inverse(def: &Definition, inverse: Option<pg_sys::Oid>) -> Result<()> {
    match inverse {
        Some(_) => Err(BatchError::invalid_because(
            "an inverse is for a handler job",
            format!(
                "Job \"{}\" deleted or put back its rows, which its revert undoes by itself.",
                def.job_id
            ),
        )),
        None => Ok(()),
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
    /// What the revert does to each row: an update, or, for a job that deleted its rows,
    /// a restore of them (and for a restore, a delete or a move again).
    pub(crate) action: Asked,
}

impl RevertTerms {
    /// The columns the revert sets back to values the job recorded with each item under
    /// item_values::BEFORE: those it set from each item.
    pub(crate) fn recorded_with_items(&self, def: &Definition) -> Vec<String> {
        self.from_items
            .iter()
            .filter(|c| def.set_from_items.contains(c))
            .cloned()
            .collect()
    }

    /// The columns of an item's guards its row must still hold for the revert: the job's
    /// guards (and the values a revert set from each item, which it expects back), less
    /// those taken out and those that are values to set.
    pub(crate) fn guard_columns(&self, def: &Definition) -> Vec<String> {
        // a column the revert sets back from a value recorded in the job's guards is no
        // guard; one set from each item still holds the item's value, what the job set
        let mut columns: Vec<String> = def
            .guard_columns
            .iter()
            .filter(|c| !self.from_items.contains(c))
            .chain(&def.set_from_items)
            .filter(|c| !self.strip.contains(c))
            .cloned()
            .collect();
        columns.sort();
        columns.dedup();
        columns
    }
}

/// The chunk's approved items bound from its arrays, and what a row `t` of the target
/// must hold to be changed: the FROM item and the WHERE of every guarded, set-based chunk
/// statement (set_values' chunk_sql says which parameters they read; on a target Citus
/// distributes by a column of the key, the chunk's values of that column come last).
pub(crate) fn guarded_rows(
    target: &Target,
    guard_columns: &[String],
    constants: &Constants,
    key_bounds: bool,
) -> (String, String) {
    let s = &target.shape;
    let mut conditions = target.item_matches(guard_columns, constants);
    let mut arrays = constants.after();
    if key_bounds {
        conditions.push_str("\n     AND ");
        conditions.push_str(&s.key.between(constants.after(), &s.columns));
        arrays += 2;
    }
    // on a distributed target, the chunk's distribution values after its arrays
    if let Some(prunes) = target
        .distributed
        .as_ref()
        .and_then(|d| d.prunes(s, arrays + 3))
    {
        conditions.push_str("\n     AND ");
        conditions.push_str(&prunes);
    }
    (Target::bound_items(arrays), conditions)
}

/// Runs a chunk's one set-based statement (an UPDATE, a DELETE, a move) and reads, for
/// the audit, each item it changed: its position, its guard value now, and the row kept
/// (a deleted row's content, delete::kept_row; NULL for a change that keeps none).
fn run_set_based(
    sql: &str,
    args: &[DatumWithOid],
    planning: query::Planning,
    items: usize,
) -> Result<Ran> {
    query::row_reader! {
        /// An item changed, as the chunk's statement returns it.
        struct Changed {
            position: i32 = -1,
            guard_now: Option<i64>,
            kept: Option<String>,
        }
    }
    let mut changed = Vec::with_capacity(items);
    let mut kept = Vec::new();
    query::rows_planned(sql, args, planning, 0, |r| {
        let row = Changed::read(r)?;
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
