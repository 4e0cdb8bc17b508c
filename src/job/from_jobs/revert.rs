//! register_revert and revert_preview: what a job committed, set back by a new job.
//!
//! The revert is an approval like any other, frozen, guarded and audited: its items are
//! the job's committed items (not those it skipped, nor those it never reached), each
//! expected as the job's change left its row (at the revision, or the row digest, its
//! audit recorded; a job guarded by named columns: holding the values it set), and each
//! set back to the values it had before, which are the job's `expect` values of the
//! columns it set. A column set without one has no known value before, and the revert is
//! refused. An item whose row drifted since the job changed it, or is gone, is left out
//! of the approval, never overwritten, and named (etc_batch.job_left_out).
//!
//! A handler job's change is known only to its handler: its revert is a handler job of
//! the inverse the caller names, expected at the revisions the job left.
//!
//! The job reverted is stopped first, as register_remainder stops a job: its drainers
//! finish their chunk, and its status becomes reverted, so that nothing changes its
//! rows while the revert runs. A revert of a revert works the same way.

use crate::error::{BatchError, Result};
use crate::installed;
use crate::job::change::{
    handler, item_values, restore, set_expressions, Asked, KindOfChange, RevertTerms,
};
use crate::job::definition::Definition;
use crate::job::from_jobs::against_rows::{self, LeftOut, LeftOutBecause, Sorted};
use crate::job::lifecycle;
use crate::job::register::{self, Items, Registered, Request};
use crate::job::rules::guard::Guard;
use crate::job::sql;
use crate::job::target::{Constants, Target};
use crate::query;
use crate::roles::as_role;
use crate::status::JobStatus;
use pgrx::pg_sys;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub struct Revert {
    pub job_id: String,
    pub revert_job_id: String,
    pub chunk_size: Option<i32>,
    pub parallel: Option<bool>,
    /// For a handler job: the handler that undoes its change.
    pub inverse: Option<pg_sys::Oid>,
}

/// What a revert would do, before it is registered.
pub struct Preview {
    pub items: i32,
    pub drifted: i32,
    pub gone: i32,
    pub another_tenant: i32,
    /// For a revert of a job that deleted its rows: those whose key a row has again.
    pub taken: i32,
    pub set_back: Option<Value>,
    /// The columns set back to each row's own value, recorded before the change.
    pub set_back_per_item: Vec<String>,
    pub expected: Value,
    pub inverse: Option<String>,
}

pub fn preview(job_id: &str, inverse: Option<pg_sys::Oid>) -> Result<Preview> {
    let def = lifecycle::acted_on(job_id, "preview a revert of")?;
    let terms = revert_terms(&def, inverse)?;
    let target = def.target()?;
    let found = classify(&def, &target, &terms)?;
    Ok(Preview {
        items: found.approved.len() as i32,
        drifted: found.count(LeftOutBecause::Drifted),
        gone: found.count(LeftOutBecause::Gone),
        another_tenant: found.count(LeftOutBecause::AnotherTenant),
        taken: found.count(LeftOutBecause::Taken),
        set_back: terms.set_back.map(object),
        set_back_per_item: terms.from_items,
        expected: object(terms.expect),
        inverse: match terms.inverse {
            Some(oid) => Some(handler::name(oid)?),
            None => None,
        },
    })
}

/// The committed items of the job that a revert registered now would leave out, in
/// position order, with why: what revert_preview counts, one row an item.
pub fn preview_left_out(job_id: &str, inverse: Option<pg_sys::Oid>) -> Result<Vec<LeftOut>> {
    let def = lifecycle::acted_on(job_id, "preview a revert of")?;
    let terms = revert_terms(&def, inverse)?;
    let target = def.target()?;
    Ok(classify(&def, &target, &terms)?.left_out)
}

pub fn register_revert(req: Revert) -> Result<Registered> {
    crate::job::require_read_committed("etc_batch.register_revert")?;
    let owner = installed::owner()?;
    let def = lifecycle::acted_on(&req.job_id, "revert")?;
    def.require_tables()?;
    // the job's drainers finish their chunk first, and none starts another
    match lifecycle::hold(&def)? {
        JobStatus::Pending
        | JobStatus::Conflict
        | JobStatus::Aborted
        | JobStatus::Done
        | JobStatus::Continued => {}
        JobStatus::Reverted => {
            let by = lifecycle::reason(&req.job_id)?;
            if by.as_deref() == Some(req.revert_job_id.as_str()) {
                return registered_again(&req, owner);
            }
            return Err(lifecycle::stopped(&req.job_id, JobStatus::Reverted, by));
        }
        JobStatus::Corrupt => return Err(lifecycle::untrusted(&req.job_id)),
    }
    let terms = revert_terms(&def, req.inverse)?;
    let target = def.target()?;
    let found = classify(&def, &target, &terms)?;
    if found.approved.is_empty() {
        return Err(BatchError::invalid_because(
            format!("nothing of job \"{}\" remains to revert", req.job_id),
            if found.left_out.is_empty() {
                "It has committed no change yet.".to_string()
            } else {
                match terms.action {
                    Asked::Restore(_) => format!(
                        "Every row it deleted has its key taken again ({}), or is no longer in the archive as it was moved ({}).",
                        found.count(LeftOutBecause::Taken),
                        found.count(LeftOutBecause::Drifted)
                    ),
                    _ => format!(
                        "Every item it changed names a row that drifted since ({}), is gone ({}) or is another tenant's ({}).",
                        found.count(LeftOutBecause::Drifted),
                        found.count(LeftOutBecause::Gone),
                        found.count(LeftOutBecause::AnotherTenant)
                    ),
                }
            },
        ));
    }
    let set_back = terms.recorded_with_items(&def);
    let registered = register::register(Request {
        job_id: req.revert_job_id.clone(),
        tenant: def.tenant_value().map(str::to_string),
        target: def.target,
        items: Items::Json(format!(
            "[{}]",
            found
                .approved
                .iter()
                .map(|(_, item)| item.as_str())
                .collect::<Vec<_>>()
                .join(",\n")
        )),
        chunk_size: req.chunk_size.unwrap_or(def.chunk_size),
        set_values: terms.set_back.map(object),
        expect: object(terms.expect),
        key_column: None,
        key_columns: Some(def.key.columns().to_vec()),
        tenant_column: def.tenant.as_ref().map(|(_, c)| c.clone()),
        // a restore is guarded by every column of the rows it puts back, which no revision
        // or digest of a row gone names
        revision_column: match terms.action {
            Asked::Restore(_) => None,
            _ => def.guard.column().map(str::to_string),
        },
        guard: Some(match terms.action {
            Asked::Restore(_) => "columns".to_string(),
            _ => def.guard.kind().to_string(),
        }),
        handler: terms.inverse,
        parallel: req.parallel.unwrap_or(def.parallel),
        on_drift: def.on_drift,
        record_before: false,
        set_from_items: terms.from_items,
        action: terms.action,
        keep_deleted: true,
        set_expressions: set_expressions::as_argument(&terms.expressions),
    })?;
    if def.guard == Guard::Row && !matches!(terms.action, Asked::Restore(_)) {
        // the revert took its digests in a statement of its own, after the rows were read
        // against the audit: a row changed in between is not the one the job left
        let moved = as_role(owner, || {
            let revert = Definition::require(&req.revert_job_id)?;
            query::one::<i64>(
                &def.tables.sql(
                    &sql::DIGESTS_MOVED.replace("{revert_items}", &revert.tables.sql("{items}")),
                ),
                &[],
            )
        })?
        .unwrap_or(0);
        if moved > 0 {
            return Err(BatchError::SerializationFailure);
        }
    }
    if !set_back.is_empty() {
        // the revert recorded what its rows held in the columns it sets back, after they
        // were read against the job's items: a row changed in between is not the one the
        // job left
        let moved = as_role(owner, || {
            let revert = Definition::require(&req.revert_job_id)?;
            query::one::<i64>(
                &def.tables.sql(&item_values::recorded_since_sql(
                    &target,
                    &revert.tables.sql("{items}"),
                    &set_back,
                )),
                &[],
            )
        })?
        .unwrap_or(0);
        if moved > 0 {
            return Err(BatchError::SerializationFailure);
        }
    }
    as_role(owner, || {
        query::run(
            sql::REVERT_JOB,
            &[
                req.job_id.as_str().into(),
                req.revert_job_id.as_str().into(),
            ],
        )?;
        query::run(
            sql::MARK_REVERT,
            &[
                req.job_id.as_str().into(),
                req.revert_job_id.as_str().into(),
            ],
        )
    })?;
    let left_out = found.left_out.len();
    against_rows::leave_out(&req.revert_job_id, &req.job_id, &found.left_out, None)?;
    crate::events::job(
        def.tables.number,
        &req.job_id,
        "reverted",
        serde_json::json!({"by_job": req.revert_job_id, "items": registered.items,
                           "left_out": left_out}),
    );
    Ok(registered)
}

/// What the revert of `def` sets and expects, as its kind of change knows it; a revert
/// of a revert sets again what the first job set by an expression.
fn revert_terms(def: &Definition, inverse: Option<pg_sys::Oid>) -> Result<RevertTerms> {
    let reverted = match &def.reverts {
        Some(job_id) => as_role(installed::owner()?, || Definition::load(job_id))?
            .map(|job| job.set_expressions)
            .unwrap_or_default(),
        None => BTreeMap::new(),
    };
    KindOfChange::of(def).reverted(def, inverse, &reverted)
}

/// The revert registered before under the same id, asked for again: the same request
/// unless it names another chunk size or parallel option.
fn registered_again(req: &Revert, owner: pg_sys::Oid) -> Result<Registered> {
    let stored = as_role(owner, || Definition::require(&req.revert_job_id))?;
    let differs = |what: &str, stored: String, asked: String| BatchError::JobMismatch {
        job: req.revert_job_id.clone(),
        detail: format!("Its {what} is {stored}; this request has {asked}."),
    };
    if let Some(size) = req.chunk_size.filter(|s| *s != stored.chunk_size) {
        return Err(differs(
            "chunk size",
            stored.chunk_size.to_string(),
            size.to_string(),
        ));
    }
    if req.inverse != stored.handler_oid {
        let name = |oid: Option<pg_sys::Oid>| match oid {
            Some(oid) => handler::name(oid).unwrap_or_else(|_| oid.to_u32().to_string()),
            None => "none".to_string(),
        };
        return Err(differs(
            "inverse",
            name(stored.handler_oid),
            name(req.inverse),
        ));
    }
    if let Some(parallel) = req.parallel.filter(|p| *p != stored.parallel) {
        return Err(differs(
            "parallel option",
            stored.parallel.to_string(),
            parallel.to_string(),
        ));
    }
    pgrx::notice!(
        "job \"{}\" is already reverted by job \"{}\"; nothing changed",
        req.job_id,
        req.revert_job_id
    );
    Ok(Registered {
        created: false,
        items: stored.item_count,
        chunks: crate::job::rules::progress::chunk_count(stored.item_count, stored.chunk_size),
    })
}

/// The job's committed items, each read against its row now as the revert would expect
/// it: approved again, or left out as drifted or gone.
fn classify(def: &Definition, target: &Target, terms: &RevertTerms) -> Result<Sorted> {
    if let Asked::Restore(_) = terms.action {
        // the rows the job deleted, kept with its audit, against their keys now
        let archive = def.deletes.as_ref().and_then(|d| d.archive.as_deref());
        return crate::settings::stable_output_if(true, || {
            against_rows::sort(
                def,
                target,
                restore::KEPT_ITEMS,
                Vec::new(),
                &restore::against_rows_sql(target, archive, restore::RowsFrom::Kept),
                &[],
                &[],
            )
        });
    }
    let constants = Constants::new(None, &terms.expect);
    let against = against_rows_sql(
        def,
        target,
        &terms.guard_columns(def),
        &constants,
        &terms.recorded_with_items(def),
    );
    against_rows::sort(
        def,
        target,
        sql::COMMITTED_ITEMS,
        vec![terms.strip.clone().into()],
        &against,
        &constants.args(target)?,
        &[],
    )
}

/// SQL: a batch of committed items (bound as arrays after the revert's constants)
/// against their rows now, as the caller: for each, in order, its state
/// (against_rows::state_sql) and, to revert, its item object of the revert's approval. Its
/// parameters are a chunk's ($3 the tenant, the expected values), then the keys,
/// the revisions the job left and the guards that still hold. `set_back`: the columns
/// set from each item, whose values recorded before the job's change (under
/// item_values::BEFORE) take their place in the revert's item, to be set back.
fn against_rows_sql(
    def: &Definition,
    target: &Target,
    guard_columns: &[String],
    constants: &Constants,
    set_back: &[String],
) -> String {
    let revision = match def.guard.column() {
        Some(column) => format!(
            " OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object({}, it.revision)",
            pgrx::spi::quote_literal(column)
        ),
        None => String::new(),
    };
    against_rows::batch_sql(
        target,
        constants.after(),
        &target.matches_item(guard_columns, constants),
        &format!(
            "CASE WHEN m.state OPERATOR(pg_catalog.=) 'again'
            THEN ({}{revision} OPERATOR(pg_catalog.||) {guards})::pg_catalog.text END",
            target.key_object_sql(),
            guards = item_values::recorded_in_place("it.guards", set_back),
        ),
    )
}

fn object(values: BTreeMap<String, Value>) -> Value {
    Value::Object(values.into_iter().collect::<Map<String, Value>>())
}
