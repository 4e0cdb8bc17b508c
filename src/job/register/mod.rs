//! register_job and register_job_from_query: check an approval against its target,
//! normalize it, and freeze it as rows of the job's own partition; or recognise the same
//! request, or name how a different one differs. Both end as the same kind of job.

//!
//! - `items_query` the SELECT register_job_from_query reads the items from.
//! - `freeze`      the frozen list written and read back a batch at a time, fingerprinted.
//! - `ordered`     approvals PostgreSQL puts in order (keys of several columns or of
//!   any type, digests of rows).
//! - `tables`      the job's own partitions of job_item and job_audit.

pub(crate) mod freeze;
pub(crate) mod items_query;
pub(crate) mod ordered;
pub(crate) mod tables;

use crate::access::{self, Of, Right};
use crate::error::{capitalize, non_empty, BatchError, Defaulted, Result};
use crate::installed;
use crate::job::change::{self, Asked};
use crate::job::definition::Definition;
use crate::job::register::freeze::{Frozen, ItemCursor, Writer};
use crate::job::register::items_query::ItemsQuery;
use crate::job::register::ordered::{Given, Recorded, SqlOrder};
use crate::job::register::tables::JobTables;
use crate::job::rules::approval::{
    canonical_object, expressions_text, first_difference, Action, Item, OnDrift, Terms,
};
use crate::job::rules::columns::{scalar_text, Kind};
use crate::job::rules::guard::Guard;
use crate::job::rules::key::{JobKey, KeyOrder};
use crate::job::rules::progress::chunk_count;
use crate::job::run::claim;
use crate::job::run::seal;
use crate::job::sql;
use crate::job::target::Target;
use crate::query;
use crate::roles::{as_role, current_user};
use crate::txn::subtransaction;
use pgrx::pg_sys;
use pgrx::prelude::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Approved items read one at a time, from wherever they come.
type ItemStream<'a> = Box<dyn Iterator<Item = Result<Item>> + 'a>;

/// An approved list as its caller holds it (a jsonb argument, api/types.rs): read an
/// element at a time, so that a list of a million items is never printed whole.
pub trait JsonList {
    /// How many elements it has, when it is a JSON array; None for any other value.
    fn array_len(&self) -> Option<usize>;
    /// Each element of the array, in order, as JSON text, for `visit`.
    fn each_element(&self, visit: &mut dyn FnMut(&str) -> Result<()>) -> Result<()>;
    /// The whole value as JSON text.
    fn text(&self) -> Result<String>;
}

/// Where the approved items come from.
pub enum Items {
    /// register_job: a jsonb array of item objects, read an element at a time.
    List(Box<dyn JsonList>),
    /// A list of item objects as JSON text (register_remainder's).
    Json(String),
    /// register_job_from_query: a SELECT whose rows are the items.
    Query(String),
}

pub struct Request {
    pub job_id: String,
    /// None: the job's scope is the whole table.
    pub tenant: Option<String>,
    pub target: pg_sys::Oid,
    pub items: Items,
    pub chunk_size: i32,
    pub set_values: Option<Value>,
    /// Columns set to an SQL expression over the row's own columns: column -> text.
    pub set_expressions: Option<Value>,
    pub expect: Value,
    /// The key, by one column or several; neither: the target's primary key.
    pub key_column: Option<String>,
    pub key_columns: Option<Vec<String>>,
    pub tenant_column: Option<String>,
    pub revision_column: Option<String>,
    /// revision, row or columns; None: the revision column if there is one, else row.
    pub guard: Option<String>,
    pub handler: Option<pg_sys::Oid>,
    /// Whether chunks may commit in any order, each claimed by one of many drainers.
    pub parallel: bool,
    pub on_drift: OnDrift,
    /// Record in each item's guards the values its row holds now in the columns the job
    /// sets: its values before the change.
    pub record_before: bool,
    /// Columns set to each item's own value, which it carries under their names with its
    /// guards (a revert's, of a job that recorded its values before).
    pub set_from_items: Vec<String>,
    /// What to do to each row: update it (set_values, a handler), delete it, or move it.
    pub(crate) action: Asked,
    /// Whether a delete's or a move's rows are kept with the audit.
    pub keep_deleted: bool,
}

pub struct Registered {
    pub created: bool,
    pub items: i32,
    pub chunks: i32,
}

/// The longest job id, in bytes: a job id is a key of etc_batch's own indexes and names
/// its partitions' constraints, all far below PostgreSQL's limits at this length.
pub const MAX_JOB_ID: usize = 200;

/// The approved items, checked, before they are frozen.
enum Source {
    /// Parsed and normalized in memory (a jsonb approval holds a few million at most).
    List(Vec<Item>),
    /// Read through a cursor, in key order, as the registering role.
    Query(ItemsQuery),
}

impl Source {
    /// The items in key order, one at a time: ordered here, or by PostgreSQL
    /// (ordered.rs), which also takes a digest of each row for a job guarded by one.
    fn items<'s>(
        &'s self,
        target: &Target,
        tenant: Option<&str>,
        record: &Recorded,
    ) -> Result<Box<dyn Iterator<Item = Result<Item>> + 's>> {
        match (self.by_sql(target, record)?, self) {
            (None, Source::List(items)) => Ok(Box::new(items.iter().cloned().map(Ok))),
            (None, Source::Query(q)) => {
                let order = target.shape.key.order(&target.shape.columns)?;
                Ok(Box::new(ItemCursor::query(&q.ordered_sql(), order)?))
            }
            (Some(order), _) => Ok(Box::new(order.frozen(&self.given(), tenant)?)),
        }
    }

    /// The statements that order the items in PostgreSQL, where it orders them: a key
    /// of a type it orders, a digest of the row to take, values before the change in
    /// the columns `record` to record, or a target Citus distributes by a column of the
    /// key, whose items are frozen by shard.
    fn by_sql<'t>(&self, target: &'t Target, record: &'t Recorded) -> Result<Option<SqlOrder<'t>>> {
        let s = &target.shape;
        let here = matches!(s.key.order(&s.columns)?, KeyOrder::Here(_));
        // a distributed target's items are frozen by shard (distributed.rs)
        let by_shard = target
            .distributed
            .as_ref()
            .is_some_and(|d| d.spans_shards());
        Ok(
            (!here || s.guard.is_digest() || !record.is_empty() || by_shard)
                .then_some(SqlOrder { target, record }),
        )
    }

    fn given(&self) -> Given<'_> {
        match self {
            Source::List(items) => Given::Items(items),
            Source::Query(q) => Given::Query(q),
        }
    }

    /// The frozen list of job `stored` and these items, side by side in one order.
    fn compared<'a>(
        &'a self,
        target: &Target,
        stored: &JobTables,
        owner: pg_sys::Oid,
        record: &Recorded,
    ) -> Result<(ItemStream<'a>, ItemStream<'a>)> {
        if let Some(order) = self.by_sql(target, record)? {
            // the stored list is read as the owner, the items (a query's) as the registrant
            let (old, new) = as_role(owner, || order.compared(&self.given(), stored))?;
            return Ok((Box::new(old), Box::new(new)));
        }
        let key_order = target.shape.key.order(&target.shape.columns)?;
        let old = as_role(owner, || ItemCursor::stored(stored, key_order))?;
        Ok((Box::new(old), self.items(target, None, record)?))
    }
}

pub fn register(req: Request) -> Result<Registered> {
    match &req.items {
        // an error of the items query keeps its SQLSTATE and says where it ran
        Items::Query(_) => {
            let context = format!("while reading the items query of job \"{}\"", req.job_id);
            crate::txn::with_context(&context, || register_now(req))
        }
        _ => register_now(req),
    }
}

fn register_now(mut req: Request) -> Result<Registered> {
    non_empty(&req.job_id, "job id")?;
    if req.job_id.len() > MAX_JOB_ID {
        return Err(BatchError::invalid_because(
            format!("job id is too long ({} bytes)", req.job_id.len()),
            format!("A job id is at most {MAX_JOB_ID} bytes."),
        ));
    }
    if req.chunk_size < 1 {
        return Err(BatchError::invalid_because(
            format!("chunk size {} is out of range", req.chunk_size),
            "A chunk holds at least one item.",
        ));
    }
    let tenant = match (req.tenant.take(), req.tenant_column.take()) {
        (Some(tenant), Some(column)) => Some((tenant, column)),
        (Some(_), None) => {
            return Err(BatchError::invalid_because(
                "a tenant needs a tenant column",
                "Name the column the tenant is kept in with tenant_column, or give tenant => NULL for a job on the whole table.",
            ))
        }
        (None, _) => None,
    };
    let tenant_column = tenant.as_ref().map(|(_, c)| c.as_str());
    let key_named = req.key_column.is_some() || req.key_columns.is_some();
    let key = choose_key(
        req.target,
        req.key_column.take(),
        req.key_columns.take(),
        tenant_column,
    )?;
    let guard = Guard::of(req.revision_column.as_deref(), req.guard.as_deref())?;
    let target = Target::load(req.target, &key, tenant_column, &guard).map_err(|e| {
        name_the_argument(e, |column| {
            if key.columns().iter().any(|c| c == column) {
                Some(match (key_named, key.columns().len()) {
                    (false, _) => ("the key", Some(Defaulted::Key)),
                    (true, 1) => ("key_column", None),
                    (true, _) => ("key_columns", None),
                })
            } else if Some(column) == tenant_column {
                Some((
                    "tenant_column",
                    (column == "tenant").then_some(Defaulted::TenantColumn),
                ))
            } else if Some(column) == guard.column() {
                Some((
                    "revision_column",
                    (column == "revision").then_some(Defaulted::RevisionColumn),
                ))
            } else {
                None
            }
        })
    })?;
    let shape = &target.shape;
    let source = match std::mem::replace(&mut req.items, Items::Json(String::new())) {
        // read an item at a time, and the text let go as soon as the normal form exists
        Items::List(list) => Source::List(match list.array_len() {
            Some(count) => {
                shape.normalize_each("items", count, |visit| list.each_element(visit))?
            }
            // not an array: read whole, to say what it is
            None => shape.normalize_json("items", &list.text()?)?,
        }),
        Items::Json(items) => Source::List(shape.normalize_json("items", &items)?),
        Items::Query(query) => Source::Query(ItemsQuery::plan(&target, &query)?),
    };
    let (action, expressions) = change::approve(
        &target,
        req.target,
        req.action,
        req.set_values.as_ref(),
        req.set_expressions.as_ref(),
        req.handler,
        &req.set_from_items,
        req.keep_deleted,
    )?;
    let expect = shape.check_columns_object("expect", &req.expect)?;
    // the columns whose values before the change are recorded
    let record = Recorded {
        guards: change::recorded(&action, &expressions, req.record_before)?,
        set_from_items: req.set_from_items.clone(),
    };
    if let Some((column, position)) = misses_item_values(&source, &req.set_from_items) {
        return Err(BatchError::invalid_because(
            match position {
                Some(key) => format!("the item of key {key} gives no value for column \"{column}\""),
                None => format!("the items query gives no column \"{column}\""),
            },
            "A column named in set_from_query is set to each item's own value, which every item gives (a member of each item of register_job, a column of the items query of register_job_from_query).",
        ));
    }
    if let Some(column) = names_recorded(&source, &record.guards) {
        return Err(BatchError::invalid_because(
            format!("items must not name column \"{column}\", whose values record_before records"),
            "With record_before => true, the value of each column the job sets is read from the item's row when the job is registered; an item does not give it.",
        ));
    }
    let listed: &[Item] = match &source {
        Source::List(items) => items,
        // an items query's values were cast to the columns' types as they were read
        Source::Query(_) => &[],
    };
    check_casts(&target, tenant.as_ref(), listed, &action, &expect)?;
    check_keys(&target, listed)?;
    change::check_constraints(&target, req.target, &action)?;
    let handler = match &action {
        Action::Handler(name) => req.handler.map(|oid| (oid, name.as_str())),
        Action::Set(_) | Action::Delete { .. } | Action::Move { .. } | Action::Restore { .. } => {
            None
        }
    };
    let archive = match req.action {
        Asked::Move(archive) => Some(archive),
        Asked::Restore(archive) => archive,
        Asked::Update | Asked::Delete => None,
    };
    let assigned = change::updated_columns(&action, &expressions, &req.set_from_items);
    check_privileges(req.target, &target, handler, &action, assigned, archive)?;

    let terms = Terms {
        tenant,
        target: target.sql_name.clone(),
        key,
        guard,
        chunk_size: req.chunk_size,
        action,
        expect,
        parallel: req.parallel,
        on_drift: req.on_drift,
        record_before: req.record_before,
        set_from_items: req.set_from_items.clone(),
        set_expressions: expressions,
    };
    let registrant = current_user();
    let owner = installed::owner()?;

    as_role(owner, || {
        query::run(sql::LOCK_JOB_ID, &[req.job_id.as_str().into()])
    })?;
    let registered = match as_role(owner, || Definition::load(&req.job_id))? {
        Some(stored) => {
            // the comparison names the stored job's terms and items
            access::require(Of::Job(&req.job_id), Right::Read)?;
            same_request(
                &req.job_id,
                &stored,
                &terms,
                &source,
                &target,
                owner,
                &record,
            )?
        }
        None => {
            let number = as_role(owner, || query::one::<i64>(sql::NEXT_JOB_NUMBER, &[]))?
                .unwrap_or_default();
            let tables = JobTables::of(number);
            as_role(owner, || {
                tables.create(&req.job_id, registrant, req.parallel)
            })?;
            let mut writer = Writer::new(&req.job_id, &tables, &terms, owner)?;
            let tenant = terms.tenant.as_ref().map(|(v, _)| v.as_str());
            let ordered_here = source.by_sql(&target, &record)?.is_none();
            match source {
                // a list ordered here is handed over item by item, never copied
                Source::List(items) if ordered_here => {
                    for item in items {
                        writer.push(item)?;
                    }
                }
                source => {
                    for item in source.items(&target, tenant, &record)? {
                        writer.push(item?)?;
                    }
                }
            }
            let mut frozen = writer.finish()?;
            // what an item carries to set is no guard
            frozen
                .guard_columns
                .retain(|c| !req.set_from_items.contains(c));
            refuse_unguarded_deletes(&terms, &frozen.guard_columns)?;
            let chunks = chunk_count(frozen.count, req.chunk_size);
            as_role(owner, || {
                insert_job(&req, &terms, &frozen, registrant, number)?;
                if req.parallel {
                    claim::write_chunk_rows(&req.job_id, &tables, chunks)?;
                }
                // on a distributed target, its chunks by shard (distributed.rs)
                let by_shard = target
                    .distributed
                    .as_ref()
                    .and_then(|d| d.shards_sql(terms.key.columns().len(), &tables.items_relname()));
                if let Some(sql) = by_shard {
                    query::run(&sql, &[req.job_id.as_str().into()])?;
                }
                tables.attach(&req.job_id)?;
                if frozen.count == 0 {
                    finish_empty(&req.job_id)?;
                }
                Ok::<(), BatchError>(())
            })?;
            crate::events::job(
                number,
                &req.job_id,
                "registered",
                serde_json::json!({"items": frozen.count, "chunks": chunks,
                                   "by": crate::pauses::role_name(registrant)}),
            );
            if frozen.count == 0 {
                crate::events::job(number, &req.job_id, "done", serde_json::json!({"items": 0}));
                approved_nothing(&req.job_id);
            }
            Registered {
                created: true,
                items: frozen.count,
                chunks,
            }
        }
    };
    Ok(registered)
}

/// A job that deletes its rows (a delete, a move) guarded by named columns, where the
/// items name none and expect is empty: a purge that would delete each approved key's
/// row whatever it holds when its chunk comes. Refused once the items are read (the
/// error undoes the partitions made for them), since only they tell what they name.
fn refuse_unguarded_deletes(terms: &Terms, guard_columns: &BTreeSet<String>) -> Result<()> {
    let deletes = matches!(terms.action, Action::Delete { .. } | Action::Move { .. });
    if deletes
        && terms.guard == Guard::Columns
        && guard_columns.is_empty()
        && terms.expect.is_empty()
    {
        return Err(BatchError::invalid_because(
            "a job that deletes its rows guarded by named columns needs a column to check",
            "No item names a column besides its key and expect is empty, so each approved key's row would be deleted whatever it holds when its chunk comes. Name the values each row must still hold in expect (or in each item), or leave guard out: a job without a revision column is then guarded by a digest of each row, and deletes only rows unchanged since registration.",
        ));
    }
    Ok(())
}

/// An approval of no items (a quiet night's items query): a job done at once, so that
/// whatever waits for it (a chain's next step, a nightly run) goes on.
fn finish_empty(job_id: &str) -> Result<()> {
    query::run(
        sql::FINISH,
        &[
            job_id.into(),
            0i32.into(),
            seal::checkpoint(job_id, 0, 0).into(),
        ],
    )
}

/// Tells the caller that the approval named nothing to do.
fn approved_nothing(job_id: &str) {
    pgrx::pg_sys::panic::ErrorReport::new(
        pgrx::PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!("job \"{job_id}\" approved no items: it is done"),
        "etc_batch",
    )
    .set_detail("Its approval is kept, empty; drain_job and launch_job find nothing to do.")
    .report(pgrx::PgLogLevel::NOTICE);
}

/// A column of the target's that is not there, named as the argument that named it
/// (`argument` gives it, and the default taken, for a column of the key, the tenant or
/// the revision), so that a default the caller never wrote is said to be one.
fn name_the_argument(
    e: BatchError,
    argument: impl Fn(&str) -> Option<(&'static str, Option<Defaulted>)>,
) -> BatchError {
    match e {
        BatchError::UndefinedColumn {
            column,
            named_by: None,
            ..
        } => match argument(&column) {
            Some((by, default)) => BatchError::UndefinedColumn {
                column,
                named_by: Some(by.to_string()),
                default,
            },
            None => BatchError::UndefinedColumn {
                column,
                named_by: None,
                default: None,
            },
        },
        other => other,
    }
}

/// The first column set from each item (`from_items`) that an item does not give, with
/// the item's key (None: the items query has no such column).
fn misses_item_values(source: &Source, from_items: &[String]) -> Option<(String, Option<String>)> {
    if from_items.is_empty() {
        return None;
    }
    match source {
        Source::List(items) => items.iter().find_map(|item| {
            let mut given = Vec::with_capacity(from_items.len());
            item.guards.for_each_column(|c| {
                if from_items.iter().any(|f| f == c) {
                    given.push(c.to_string());
                }
            });
            from_items
                .iter()
                .find(|f| !given.contains(f))
                .map(|f| (f.clone(), Some(item.key.text())))
        }),
        Source::Query(query) => from_items
            .iter()
            .find(|f| !query.guard_columns.contains(f))
            .map(|f| (f.clone(), None)),
    }
}

/// The first of the columns `record` that an item names as a guard, if any.
fn names_recorded(source: &Source, record: &[String]) -> Option<String> {
    if record.is_empty() {
        return None;
    }
    match source {
        Source::List(items) => items.iter().find_map(|item| {
            let mut named = None;
            item.guards.for_each_column(|c| {
                if named.is_none() && record.iter().any(|r| r == c) {
                    named = Some(c.to_string());
                }
            });
            named
        }),
        Source::Query(query) => query
            .guard_columns
            .iter()
            .find(|c| record.contains(c))
            .cloned(),
    }
}

/// The job's key: the columns given (key_columns, or key_column), or the target's
/// primary key less the tenant column; a table without one keys by its column "id",
/// as jobs of 0.3.0 did by default.
fn choose_key(
    target: pg_sys::Oid,
    key_column: Option<String>,
    key_columns: Option<Vec<String>>,
    tenant_column: Option<&str>,
) -> Result<JobKey> {
    let columns = match (key_column, key_columns) {
        (Some(_), Some(_)) => {
            return Err(BatchError::invalid_because(
                "give key_column or key_columns, not both",
                "key_column names a key of one column; key_columns one of any number.",
            ))
        }
        (Some(one), None) => vec![one],
        (None, Some(many)) if many.is_empty() => {
            return Err(BatchError::invalid_because(
                "key_columns must name at least one column",
                "Give the columns of the primary key or of a unique index, or leave it out for the primary key.",
            ))
        }
        (None, Some(many)) => many,
        (None, None) => {
            let primary: Vec<String> = crate::job::target::primary_key(target)?
                .into_iter()
                .filter(|c| Some(c.as_str()) != tenant_column)
                .collect();
            if primary.is_empty() {
                vec!["id".to_string()]
            } else {
                primary
            }
        }
    };
    Ok(JobKey::of(columns))
}

/// The same job id again: the same request when every term and every item is the same,
/// compared one item at a time against the frozen list; otherwise refused, naming the
/// first difference. A job guarded by a digest of the row took its digests when it was
/// registered: they are not part of the request, and not compared.
fn same_request(
    job_id: &str,
    stored: &Definition,
    terms: &Terms,
    source: &Source,
    target: &Target,
    owner: pg_sys::Oid,
    record: &Recorded,
) -> Result<Registered> {
    let mismatch = |detail: String| BatchError::JobMismatch {
        job: job_id.to_string(),
        detail,
    };
    if let Some(detail) = stored.terms().difference(terms) {
        return Err(mismatch(detail));
    }
    stored.require_tables()?;
    let (old, new) = source.compared(target, &stored.tables, owner, record)?;
    let revisions = terms.guard.column().is_some();
    if let Some(detail) = first_difference(old, new, revisions)? {
        return Err(mismatch(detail));
    }
    notice!("job \"{job_id}\" is already registered with the same approval; nothing changed");
    Ok(Registered {
        created: false,
        items: stored.item_count,
        chunks: chunk_count(stored.item_count, stored.chunk_size),
    })
}

/// Values of types Rust cannot check (dates, enums, numbers against the column's range,
/// precision and scale, the tenant as the tenant column's type) are cast by PostgreSQL
/// itself, in a subtransaction, before anything is stored.
fn check_casts(
    target: &Target,
    tenant: Option<&(String, String)>,
    items: &[Item],
    action: &Action,
    expect: &BTreeMap<String, Value>,
) -> Result<()> {
    let mut values: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    if let Some((tenant, column)) = tenant {
        let column = target.shape.column(column)?;
        values.entry(&column.name).or_default().push(tenant.clone());
    }
    let mut add = |column: &str, value: &Value| {
        let kind = target.shape.columns.get(column).map(|c| c.kind);
        // numbers too: a float column's range and a numeric column's precision and
        // scale are PostgreSQL's to judge, now rather than at every chunk
        if matches!(kind, Some(Kind::Other | Kind::Numeric)) {
            if let Some(text) = scalar_text(value) {
                values
                    .entry(target.shape.columns.get_key_value(column).unwrap().0)
                    .or_default()
                    .push(text);
            }
        }
    };
    // an item's values are read back from its guards' text only where a column needs it
    let checked = |column: &str| {
        let kind = target.shape.columns.get(column).map(|c| c.kind);
        matches!(kind, Some(Kind::Other | Kind::Numeric))
    };
    for item in items {
        let mut any = false;
        item.guards.for_each_column(|column| any |= checked(column));
        if any {
            for (column, value) in item.guards.entries() {
                add(&column, &value);
            }
        }
    }
    if let Action::Set(set) = action {
        for (column, value) in set {
            add(column, value);
        }
    }
    for (column, value) in expect {
        add(column, value);
    }
    for (column, texts) in values {
        let checked = subtransaction(|| {
            query::run(
                &target.read_values_sql(column),
                &[texts.clone().into(), column.into()],
            )
        });
        if let Err(failure) = checked
            .map_err(|f| f.message)
            .and_then(|r| r.map_err(|e| e.message()))
        {
            let role = if Some(column) == tenant.map(|(_, c)| c.as_str()) {
                "the tenant"
            } else {
                "a value"
            };
            return Err(BatchError::invalid_because(
                format!(
                    "{role} for column \"{column}\" is not a valid {}",
                    target.shape.columns[column].type_name
                ),
                format!("{}.", capitalize(&failure)),
            ));
        }
    }
    Ok(())
}

/// The keys of a jsonb approval that PostgreSQL reads as their columns' types (dates,
/// numerics, any type but the ones read here), read so before they are ordered: a key
/// that is not a valid value raises PostgreSQL's own error, with its SQLSTATE, saying
/// which item and which key column. Only a list that fails is searched, by halves.
fn check_keys(target: &Target, items: &[Item]) -> Result<()> {
    let shape = &target.shape;
    for (i, name) in shape.key.columns().iter().enumerate() {
        let column = &shape.columns[name];
        if !matches!(column.kind, Kind::Other | Kind::Numeric) {
            continue;
        }
        let texts: Vec<String> = items.iter().map(|item| item.key.part(i)).collect();
        let sql = target.read_values_sql(name);
        let read = |n: usize| {
            subtransaction(|| query::run(&sql, &[texts[..n].to_vec().into(), name.as_str().into()]))
                .and_then(|r| r.map_err(crate::txn::Failure::from))
        };
        let Err(mut failure) = read(texts.len()) else {
            continue;
        };
        // the first n items read, the first n + 1 do not: (good, bad] holds it
        let (mut good, mut bad) = (0, texts.len());
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            match read(mid) {
                Ok(()) => good = mid,
                Err(f) => {
                    failure = f;
                    bad = mid;
                }
            }
        }
        // items are counted from 1, as every message of an approval counts them
        let item = &items[bad - 1];
        failure.raise(
            format!(
                "Item {bad} (key {}) has a value for key column \"{name}\" that is not a valid {}.",
                item.key.text(),
                column.type_name
            ),
            "Correct the item's key in the approved list and register it again.".into(),
        )
    }
    Ok(())
}

/// A job changes rows with the privileges of the role that registers it, so that role
/// needs them now: SELECT on the target, and UPDATE of every column a guarded UPDATE
/// assigns (the revision column included), or, for a handler job, EXECUTE on the
/// handler, whose own privileges then decide what it may change, and UPDATE of some
/// column, which locking each item's row before the call asks.
fn check_privileges(
    oid: pg_sys::Oid,
    target: &Target,
    handler: Option<(pg_sys::Oid, &str)>,
    action: &Action,
    mut assigned: Vec<String>,
    archive: Option<pg_sys::Oid>,
) -> Result<()> {
    assigned.extend(
        target
            .shape
            .guard
            .column()
            .map(str::to_string)
            .filter(|_| matches!(action, Action::Set(_))),
    );
    let deletes = matches!(action, Action::Delete { .. } | Action::Move { .. });
    let restores = matches!(action, Action::Restore { .. });
    query::row_reader! {
        struct Privileges {
            may_select: bool = false,
            not_updatable: Vec<String> = Vec::new(),
            may_execute: bool = false,
            may_lock: bool = false,
            may_delete: bool = false,
            may_archive: bool = false,
            may_insert: bool = false,
            may_take_back: bool = false,
        }
    }
    let Privileges {
        may_select,
        not_updatable,
        may_execute,
        may_lock,
        may_delete,
        may_archive,
        may_insert,
        may_take_back,
    } = query::row(
        sql::PRIVILEGES,
        &[
            oid.into(),
            handler.map(|(oid, _)| oid).into(),
            assigned.into(),
            archive.into(),
        ],
        Privileges::read,
    )?
    .unwrap_or(Privileges {
        may_select: false,
        not_updatable: Vec::new(),
        may_execute: false,
        may_lock: false,
        may_delete: false,
        may_archive: false,
        may_insert: false,
        may_take_back: false,
    });
    let denied = |message: String, detail: &str| {
        Err(BatchError::PermissionDenied {
            message,
            detail: detail.into(),
        })
    };
    let display = &target.display;
    if !may_select {
        return denied(
            format!("permission denied for table {display}"),
            "A job changes rows with the privileges of the role that registers it, which needs SELECT and UPDATE on the target.",
        );
    }
    if deletes && !may_delete {
        return denied(
            format!("permission denied for table {display}"),
            "A job that deletes or moves its rows does so with the privileges of the role that registers it, which needs DELETE on the target.",
        );
    }
    if let (Some(Action::Move { archive, .. }), false) =
        (Some(action).filter(|_| deletes), may_archive)
    {
        return denied(
            format!("permission denied for table {archive}"),
            "A job that moves its rows inserts them into the archive with the privileges of the role that registers it, which needs INSERT on the archive.",
        );
    }
    if restores && !may_insert {
        return denied(
            format!("permission denied for table {display}"),
            "A revert of a job that deleted its rows inserts them again with the privileges of the role that registers it, which needs INSERT on the target.",
        );
    }
    if let (
        Action::Restore {
            archive: Some(archive),
        },
        false,
    ) = (action, may_take_back)
    {
        return denied(
            format!("permission denied for table {archive}"),
            "A revert of a move takes its rows back from the archive with the privileges of the role that registers it, which needs SELECT and DELETE on the archive.",
        );
    }
    if handler.is_some() && !may_lock {
        return denied(
            format!("permission denied for table {display}"),
            "A handler job locks each item's row and checks its guard before its handler is called, which needs UPDATE on the target (of one column at least).",
        );
    }
    if let Some(column) = not_updatable.first() {
        return denied(
            format!("permission denied to update column \"{column}\" of table {display}"),
            "A job changes rows with the privileges of the role that registers it, which needs UPDATE on every column the job assigns (and on the revision column, which it increments).",
        );
    }
    if let (Some((_, name)), false) = (handler, may_execute) {
        return denied(
            format!("permission denied for function {name}"),
            "A handler runs with the privileges of the role that registers the job, which must be allowed to execute it.",
        );
    }
    Ok(())
}

fn insert_job(
    req: &Request,
    terms: &Terms,
    frozen: &Frozen,
    registrant: pg_sys::Oid,
    number: i64,
) -> Result<()> {
    let set_values = match &terms.action {
        Action::Set(values) => Some(canonical_object(values)),
        Action::Handler(_)
        | Action::Delete { .. }
        | Action::Move { .. }
        | Action::Restore { .. } => None,
    };
    let (action, archive, keep) = match &terms.action {
        Action::Set(_) | Action::Handler(_) => ("update", None, true),
        Action::Delete { keep } => ("delete", None, *keep),
        Action::Move { archive, keep } => ("move", Some(archive.as_str()), *keep),
        Action::Restore { archive } => ("restore", archive.as_deref(), true),
    };
    query::run(
        sql::INSERT_JOB,
        &[
            req.job_id.as_str().into(),
            terms.tenant.as_ref().map(|(v, _)| v.as_str()).into(),
            req.target.into(),
            terms.key.columns().to_vec().into(),
            terms.tenant.as_ref().map(|(_, c)| c.as_str()).into(),
            terms.guard.column().into(),
            terms.chunk_size.into(),
            set_values.into(),
            req.handler.into(),
            canonical_object(&terms.expect).into(),
            frozen
                .guard_columns
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .into(),
            frozen.count.into(),
            frozen.fingerprint.as_str().into(),
            registrant.into(),
            number.into(),
            terms.parallel.into(),
            seal::checkpoint(&req.job_id, 0, 0).into(),
            terms.guard.kind().into(),
            terms.on_drift.as_str().into(),
            terms.target.as_str().into(),
            terms.record_before.into(),
            terms.set_from_items.clone().into(),
            (!terms.set_expressions.is_empty())
                .then(|| expressions_text(&terms.set_expressions))
                .into(),
            action.into(),
            archive.into(),
            keep.into(),
        ],
    )
}
