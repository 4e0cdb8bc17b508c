//! register_job: check an approval against its target, normalize it, and freeze it as
//! rows; or recognise the same request, or name how a different one differs.

use super::approval::{canonical_object, Action, Approval, Item};
use super::columns::{Kind, Shape};
use super::definition::Definition;
use super::progress::chunk_count;
use super::sql;
use super::target::Target;
use crate::error::{capitalize, non_empty, BatchError, Result};
use crate::query;
use crate::roles::{as_owner, current_user};
use crate::txn::subtransaction;
use pgrx::pg_sys;
use pgrx::prelude::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

pub struct Request {
    pub job_id: String,
    pub tenant: String,
    pub target: pg_sys::Oid,
    pub items: Value,
    pub chunk_size: i32,
    pub set_values: Option<Value>,
    pub expect: Value,
    pub key_column: String,
    pub tenant_column: String,
    pub revision_column: String,
    pub handler: Option<pg_sys::Oid>,
}

pub struct Registered {
    pub created: bool,
    pub items: i32,
    pub chunks: i32,
}

pub fn register(mut req: Request) -> Result<Registered> {
    non_empty(&req.job_id, "job id")?;
    if req.chunk_size < 1 {
        return Err(BatchError::invalid_because(
            format!("chunk size {} is out of range", req.chunk_size),
            "A chunk holds at least one item.",
        ));
    }
    let target = Target::load(
        req.target,
        &req.key_column,
        &req.tenant_column,
        &req.revision_column,
    )?;
    let shape = &target.shape;
    // The parsed JSON of a large approval weighs more than its normal form: let it go
    // as soon as the normal form exists.
    let items = shape.normalize(&std::mem::take(&mut req.items))?;
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
    check_casts(&target, &req.tenant, &items, &action, &expect)?;
    let handler = match &action {
        Action::Handler(name) => req.handler.map(|oid| (oid, name.as_str())),
        Action::Set(_) => None,
    };
    check_privileges(req.target, &target.display, handler)?;

    let approval = Approval {
        tenant: req.tenant.clone(),
        target: target.sql_name.clone(),
        key_column: req.key_column.clone(),
        tenant_column: req.tenant_column.clone(),
        revision_column: req.revision_column.clone(),
        chunk_size: req.chunk_size,
        action,
        expect,
        items,
    };
    let fingerprint = approval.fingerprint();
    let item_count = approval.items.len() as i32;
    let chunks = chunk_count(item_count, req.chunk_size);
    let registrant = current_user();

    let registered = as_owner(|| {
        query::run(sql::LOCK_JOB_ID, &[req.job_id.clone().into()])?;
        if let Some(stored) = Definition::load(&req.job_id)? {
            if stored.fingerprint == fingerprint {
                notice!(
                    "job \"{}\" is already registered with the same approval; nothing changed",
                    req.job_id
                );
                return Ok(Registered {
                    created: false,
                    items: item_count,
                    chunks,
                });
            }
            let detail = stored.approval(shape)?.difference(&approval).unwrap_or_else(|| {
                "The approval differs from the registered one, though no single field names how.".into()
            });
            return Err(BatchError::JobMismatch {
                job: req.job_id.clone(),
                detail,
            });
        }
        insert(
            &req.job_id,
            &approval,
            &fingerprint,
            registrant,
            req.target,
            req.handler,
        )?;
        Ok(Registered {
            created: true,
            items: item_count,
            chunks,
        })
    });
    drop(approval);
    release_free_memory();
    registered
}

/// Hands memory freed by a large registration back to the operating system, instead of
/// keeping it in the backend for as long as the connection lives.
fn release_free_memory() {
    // SAFETY: malloc_trim only returns free heap pages; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn check_set_values(shape: &Shape, values: &Value) -> Result<BTreeMap<String, Value>> {
    let values = shape.check_columns_object("set_values", values)?;
    if values.is_empty() {
        return Err(BatchError::invalid(
            "set_values must name at least one column",
        ));
    }
    for protected in [
        &shape.key_column,
        &shape.tenant_column,
        &shape.revision_column,
    ] {
        if values.contains_key(protected.as_str()) {
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
        for (column, value) in &item.guards {
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

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
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

fn insert(
    job_id: &str,
    a: &Approval,
    fingerprint: &str,
    registrant: pg_sys::Oid,
    target_oid: pg_sys::Oid,
    handler_oid: Option<pg_sys::Oid>,
) -> Result<()> {
    let guard_columns: BTreeSet<String> = a
        .items
        .iter()
        .flat_map(|i| i.guards.keys().cloned())
        .collect();
    let set_values = match &a.action {
        Action::Set(values) => Some(canonical_object(values)),
        Action::Handler(_) => None,
    };
    query::run(
        sql::INSERT_JOB,
        &[
            job_id.into(),
            a.tenant.clone().into(),
            target_oid.into(),
            a.key_column.clone().into(),
            a.tenant_column.clone().into(),
            a.revision_column.clone().into(),
            a.chunk_size.into(),
            set_values.into(),
            handler_oid.into(),
            canonical_object(&a.expect).into(),
            guard_columns.into_iter().collect::<Vec<_>>().into(),
            (a.items.len() as i32).into(),
            fingerprint.into(),
            registrant.into(),
        ],
    )?;
    let keys: Vec<String> = a.items.iter().map(|i| i.key.text()).collect();
    let revisions: Vec<i64> = a.items.iter().map(|i| i.revision).collect();
    let guards: Vec<String> = a
        .items
        .iter()
        .map(|i| canonical_object(&i.guards))
        .collect();
    query::run(
        sql::INSERT_ITEMS,
        &[job_id.into(), keys.into(), revisions.into(), guards.into()],
    )
}
