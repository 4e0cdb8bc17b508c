//! register_job and register_job_from_query: check an approval against its target,
//! normalize it, and freeze it as rows of the job's own partition; or recognise the same
//! request, or name how a different one differs. Both end as the same kind of job.

use super::approval::{canonical_object, first_difference, Action, Item, Terms};
use super::claim;
use super::columns::{scalar_text, Kind};
use super::shape::Shape;
use super::definition::Definition;
use super::freeze::{Frozen, ItemCursor, Writer};
use super::guard::Guard;
use super::items_query::ItemsQuery;
use super::key::JobKey;
use super::progress::chunk_count;
use super::seal;
use super::sql;
use super::tables::JobTables;
use super::target::Target;
use crate::error::{capitalize, non_empty, BatchError, Result};
use crate::installed;
use crate::query;
use crate::roles::{as_role, current_user};
use crate::txn::subtransaction;
use pgrx::pg_sys;
use pgrx::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;

/// Where the approved items come from.
pub enum Items {
    /// register_job: a jsonb array of item objects, as JSON text.
    Json(String),
    /// register_job_from_query: a SELECT whose rows are the items.
    Query(String),
}

pub struct Request {
    pub job_id: String,
    pub tenant: String,
    pub target: pg_sys::Oid,
    pub items: Items,
    pub chunk_size: i32,
    pub set_values: Option<Value>,
    pub expect: Value,
    pub key: JobKey,
    pub tenant_column: String,
    pub guard: Guard,
    pub handler: Option<pg_sys::Oid>,
    /// Whether chunks may commit in any order, each claimed by one of many drainers.
    pub parallel: bool,
}

pub struct Registered {
    pub created: bool,
    pub items: i32,
    pub chunks: i32,
}

/// The approved items, checked, before they are frozen.
enum Source {
    /// Parsed and normalized in memory (a jsonb approval holds a few million at most).
    List(Vec<Item>),
    /// Read through a cursor, in key order, as the registering role.
    Query(ItemsQuery),
}

impl Source {
    /// The items in key order, one at a time.
    fn items(&self, key_kind: Kind) -> Result<Box<dyn Iterator<Item = Result<Item>> + '_>> {
        Ok(match self {
            Source::List(items) => Box::new(items.iter().cloned().map(Ok)),
            Source::Query(q) => Box::new(ItemCursor::query(&q.sql, key_kind)?),
        })
    }
}

pub fn register(mut req: Request) -> Result<Registered> {
    non_empty(&req.job_id, "job id")?;
    if req.chunk_size < 1 {
        return Err(BatchError::invalid_because(
            format!("chunk size {} is out of range", req.chunk_size),
            "A chunk holds at least one item.",
        ));
    }
    let target = Target::load(req.target, &req.key, &req.tenant_column, &req.guard)?;
    let shape = &target.shape;
    let source = match std::mem::replace(&mut req.items, Items::Json(String::new())) {
        // read an item at a time, and the text let go as soon as the normal form exists
        Items::Json(items) => Source::List(shape.normalize_json("items", &items)?),
        Items::Query(query) => Source::Query(ItemsQuery::plan(&target, &query)?),
    };
    let action = match (&req.set_values, req.handler) {
        (Some(values), None) => Action::Set(check_set_values(shape, values)?),
        (None, Some(handler)) => Action::Handler(check_handler(handler)?),
        _ => {
            return Err(BatchError::invalid_because(
                "a job needs either set_values or a handler",
                "Give set_values for a guarded UPDATE, or a handler function (item jsonb) RETURNS jsonb, not both.",
            ))
        }
    };
    let expect = shape.check_columns_object("expect", &req.expect)?;
    let listed: &[Item] = match &source {
        Source::List(items) => items,
        // an items query's values were cast to the columns' types as they were read
        Source::Query(_) => &[],
    };
    check_casts(&target, &req.tenant, listed, &action, &expect)?;
    let handler = match &action {
        Action::Handler(name) => req.handler.map(|oid| (oid, name.as_str())),
        Action::Set(_) => None,
    };
    check_privileges(req.target, &target.display, handler)?;

    let terms = Terms {
        tenant: req.tenant.clone(),
        target: target.sql_name.clone(),
        key: req.key.clone(),
        tenant_column: req.tenant_column.clone(),
        guard: req.guard.clone(),
        chunk_size: req.chunk_size,
        action,
        expect,
        parallel: req.parallel,
    };
    let key_kind = shape.key.kind(&shape.columns)?;
    let registrant = current_user();
    let owner = installed::owner()?;

    as_role(owner, || {
        query::run(sql::LOCK_JOB_ID, &[req.job_id.as_str().into()])
    })?;
    let registered = match as_role(owner, || Definition::load(&req.job_id))? {
        Some(stored) => same_request(&req.job_id, &stored, &terms, &source, key_kind, owner)?,
        None => {
            let number = as_role(owner, || query::one::<i64>(sql::NEXT_JOB_NUMBER, &[]))?
                .unwrap_or_default();
            let tables = JobTables::of(number);
            as_role(owner, || {
                tables.create(&req.job_id, registrant, req.parallel)
            })?;
            let mut writer = Writer::new(&req.job_id, &tables, &terms, owner);
            for item in source.items(key_kind)? {
                writer.push(&item?)?;
            }
            drop(source);
            let frozen = writer.finish()?;
            if frozen.count == 0 {
                return Err(BatchError::invalid_because(
                    "items must not be empty",
                    "The items query returned no rows.",
                ));
            }
            let chunks = chunk_count(frozen.count, req.chunk_size);
            as_role(owner, || {
                insert_job(&req, &terms, &frozen, registrant, number)?;
                if req.parallel {
                    claim::write_chunk_rows(&req.job_id, &tables, chunks)?;
                }
                tables.attach(&req.job_id)
            })?;
            Registered {
                created: true,
                items: frozen.count,
                chunks,
            }
        }
    };
    Ok(registered)
}

/// The same job id again: the same request when every term and every item is the same,
/// compared one item at a time against the frozen list; otherwise refused, naming the
/// first difference.
fn same_request(
    job_id: &str,
    stored: &Definition,
    terms: &Terms,
    source: &Source,
    key_kind: Kind,
    owner: pg_sys::Oid,
) -> Result<Registered> {
    let mismatch = |detail: String| BatchError::JobMismatch {
        job: job_id.to_string(),
        detail,
    };
    if let Some(detail) = stored.terms().difference(terms) {
        return Err(mismatch(detail));
    }
    stored.require_tables()?;
    let old = as_role(owner, || ItemCursor::stored(&stored.tables, key_kind))?;
    if let Some(detail) = first_difference(old, source.items(key_kind)?)? {
        return Err(mismatch(detail));
    }
    notice!("job \"{job_id}\" is already registered with the same approval; nothing changed");
    Ok(Registered {
        created: false,
        items: stored.item_count,
        chunks: chunk_count(stored.item_count, stored.chunk_size),
    })
}

fn check_set_values(shape: &Shape, values: &Value) -> Result<BTreeMap<String, Value>> {
    let values = shape.check_columns_object("set_values", values)?;
    if values.is_empty() {
        return Err(BatchError::invalid(
            "set_values must name at least one column",
        ));
    }
    for protected in shape.roles() {
        if values.contains_key(protected) {
            return Err(BatchError::invalid_because(
                format!("set_values must not assign column \"{protected}\""),
                "The key, tenant and revision columns identify the approved rows; the revision is incremented by etc_batch.",
            ));
        }
    }
    Ok(values)
}

/// A handler is a function (jsonb) RETURNS jsonb; returns its regprocedure text.
fn check_handler(handler: pg_sys::Oid) -> Result<String> {
    let row = query::row(sql::HANDLER, &[handler.into()], |r| {
        Ok((r.get::<String>(1)?, r.get::<bool>(2)?))
    })?;
    match row {
        Some((Some(name), Some(true))) => Ok(name),
        Some((Some(name), _)) => Err(BatchError::invalid_because(
            format!("handler {name} must take one jsonb argument and return jsonb"),
            "It is called once per item with the item as jsonb, and returns the new state of the row, or NULL for a conflict.",
        )),
        _ => Err(BatchError::UnknownFunction {
            oid: handler.to_u32(),
        }),
    }
}

/// Values of types Rust cannot check (dates, enums, numbers against the column's range,
/// precision and scale, the tenant as the tenant column's type) are cast by PostgreSQL
/// itself, in a subtransaction, before anything is stored.
fn check_casts(
    target: &Target,
    tenant: &str,
    items: &[Item],
    action: &Action,
    expect: &BTreeMap<String, Value>,
) -> Result<()> {
    let mut values: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    values
        .entry(&target.shape.tenant_column)
        .or_default()
        .push(tenant.to_string());
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
    for item in items {
        for (column, value) in item.guards.iter() {
            add(column, value);
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
            let role = if column == target.shape.tenant_column {
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

/// A job changes rows with the privileges of the role that registers it, so that role
/// needs them now: SELECT on the target, and UPDATE for a guarded UPDATE or EXECUTE on
/// the handler, whose own privileges then decide what it may change.
fn check_privileges(
    target: pg_sys::Oid,
    display: &str,
    handler: Option<(pg_sys::Oid, &str)>,
) -> Result<()> {
    let (select, update, execute) = query::row(
        sql::PRIVILEGES,
        &[target.into(), handler.map(|(oid, _)| oid).into()],
        |r| Ok((r.get::<bool>(1)?, r.get::<bool>(2)?, r.get::<bool>(3)?)),
    )?
    .unwrap_or_default();
    let denied = |message: String, detail: &str| {
        Err(BatchError::PermissionDenied {
            message,
            detail: detail.into(),
        })
    };
    if select != Some(true) || (handler.is_none() && update != Some(true)) {
        return denied(
            format!("permission denied for table {display}"),
            "A job changes rows with the privileges of the role that registers it, which needs SELECT and UPDATE on the target (SELECT for a handler job).",
        );
    }
    if let (Some((_, name)), false) = (handler, execute == Some(true)) {
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
        Action::Handler(_) => None,
    };
    query::run(
        sql::INSERT_JOB,
        &[
            req.job_id.as_str().into(),
            terms.tenant.as_str().into(),
            req.target.into(),
            terms.key.column().into(),
            terms.tenant_column.as_str().into(),
            terms.guard.field().into(),
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
        ],
    )
}
