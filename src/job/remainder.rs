//! register_remainder: what a job did not change, approved again as a new job in one
//! call, with the same change and chunking unless told otherwise; the job itself ends,
//! continued as the new one.
//!
//! Its items are the job's items without an audit row (unprocessed) and those it skipped
//! (on_drift => skip), each read against its row now: one that still matches its
//! approval is approved again as it was; one whose row drifted is left out, or, with
//! include_drifted, approved again at its row's current state (its revision and the
//! values of its guard columns now); one whose row is gone is left out.

use super::against_rows;
use super::approval::Action;
use super::claim;
use super::definition::Definition;
use super::register::{self, Items, Registered, Request};
use super::sql;
use super::target::{text_array_sql, Constants, Target};
use crate::access::{self, Of, Right};
use crate::error::{BatchError, Result};
use crate::installed;
use crate::query;
use crate::roles::as_role;
use crate::status::JobStatus;
use pgrx::spi::quote_literal;
use serde_json::Value;

pub struct Remainder {
    pub job_id: String,
    pub new_job_id: String,
    pub chunk_size: Option<i32>,
    pub include_drifted: bool,
    pub parallel: Option<bool>,
}

pub fn register_remainder(req: Remainder) -> Result<Registered> {
    super::require_read_committed("etc_batch.register_remainder")?;
    access::require(Of::Job(&req.job_id), Right::Act("continue"))?;
    let owner = installed::owner()?;
    let def = as_role(owner, || Definition::require(&req.job_id))?;
    def.require_tables()?;
    // the job's drainers finish their chunk first, and none starts another
    let status = as_role(owner, || {
        if def.parallel {
            claim::stop(&def.tables)?;
        }
        query::one::<String>(sql::LOCK_JOB_STATUS, &[req.job_id.as_str().into()])
    })?
    .ok_or_else(|| BatchError::UnknownJob {
        job: req.job_id.clone(),
    })?;
    match JobStatus::parse(&status)? {
        JobStatus::Pending | JobStatus::Conflict | JobStatus::Aborted => {}
        JobStatus::Done => return Err(BatchError::JobFinished { job: req.job_id }),
        JobStatus::Continued => {
            let successor = as_role(owner, || {
                query::one::<String>(sql::JOB_STATUS_REASON, &[req.job_id.as_str().into()])
            })?;
            return Err(BatchError::JobContinued {
                job: req.job_id,
                successor,
            });
        }
        JobStatus::Reverted => {
            let by = as_role(owner, || {
                query::one::<String>(sql::JOB_STATUS_REASON, &[req.job_id.as_str().into()])
            })?;
            return Err(BatchError::JobReverted {
                job: req.job_id,
                by,
            });
        }
        JobStatus::Corrupt => {
            return Err(BatchError::JobCorrupt {
                job: req.job_id,
                detail: "Its records cannot be trusted to tell what it changed.".into(),
            })
        }
    }
    let target = def.target()?;
    let items = remaining_items(&def, &target, req.include_drifted)?;
    if items.is_empty() {
        return Err(BatchError::invalid_because(
            format!("nothing of job \"{}\" remains to approve again", req.job_id),
            if req.include_drifted {
                "Every item it did not change names a row that is gone."
            } else {
                "Every item it did not change names a row that drifted or is gone; include_drifted => true approves the drifted ones at their state now."
            },
        ));
    }
    let (set_values, handler) = match def.terms().action {
        Action::Set(values) => (Some(Value::Object(values.into_iter().collect())), None),
        Action::Handler(_) => (None, def.handler_oid),
    };
    let registered = register::register(Request {
        job_id: req.new_job_id.clone(),
        tenant: def.tenant_value().map(str::to_string),
        target: def.target,
        items: Items::Json(format!("[{}]", items.join(",\n"))),
        chunk_size: req.chunk_size.unwrap_or(def.chunk_size),
        set_values,
        expect: Value::Object(def.expect.clone().into_iter().collect()),
        key_column: None,
        key_columns: Some(def.key.columns().to_vec()),
        tenant_column: def.tenant.as_ref().map(|(_, c)| c.clone()),
        revision_column: def.guard.column().map(str::to_string),
        guard: Some(def.guard.kind().to_string()),
        handler,
        parallel: req.parallel.unwrap_or(def.parallel),
        on_drift: def.on_drift,
        record_before: def.record_before,
        set_from_items: def.set_from_items.clone(),
    })?;
    as_role(owner, || {
        query::run(
            sql::CONTINUE_JOB,
            &[req.job_id.as_str().into(), req.new_job_id.as_str().into()],
        )
    })?;
    Ok(registered)
}

/// The items the job did not change that are to be approved again, as JSON objects of
/// register_job's items, in position order.
fn remaining_items(
    def: &Definition,
    target: &Target,
    include_drifted: bool,
) -> Result<Vec<String>> {
    let constants = Constants::new(def.set_values.as_ref(), &def.expect).args(target)?;
    let mut out = Vec::new();
    against_rows::each_batch(
        def,
        target,
        sql::REMAINING_ITEMS,
        Vec::new(),
        &against_rows_sql(def, target),
        &constants,
        &[include_drifted],
        |r| r.get::<String>(1),
        |_, rows| out.extend(rows.into_iter().flatten()),
    )?;
    Ok(out)
}

/// SQL: the items of a batch (bound as arrays after the job's constants) against their
/// rows now, as the caller: each one's item object to approve again, or NULL to leave it
/// out. Its parameters are the chunk's ($3 the tenant, the constants), then the keys,
/// revisions and guards of the batch, and whether drifted items are approved again.
fn against_rows_sql(def: &Definition, target: &Target) -> String {
    let s = &target.shape;
    let constants = Constants::new(def.set_values.as_ref(), &def.expect);
    let first = constants.after();
    let (keys, revisions, guards, drifted) = (first, first + 1, first + 2, first + 3);
    let key_object = target.key_object_sql();
    let revision = |from: &str| match s.guard.column() {
        Some(column) => format!(
            " OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object({}, {from})",
            quote_literal(column)
        ),
        None => String::new(),
    };
    // a drifted item's guards as its row holds them now; but the values a revert sets
    // (set_from_items) are not the row's: kept as approved
    let current_guards = format!(
        "COALESCE((SELECT pg_catalog.jsonb_object_agg(g.k, CASE WHEN g.k OPERATOR(pg_catalog.=) ANY({kept}) \
         THEN it.guards ELSE pg_catalog.to_jsonb(t) END OPERATOR(pg_catalog.->) g.k) \
         FROM pg_catalog.jsonb_object_keys(it.guards) AS g(k)), '{{}}'::pg_catalog.jsonb)",
        kept = text_array_sql(&def.set_from_items)
    );
    // the values a job recorded before its change are recorded again, as the rows hold
    // them when the rest is approved (register refuses items that give them)
    let recorded = match (&def.set_values, def.record_before) {
        (Some(set), true) => format!(
            " OPERATOR(pg_catalog.-) {}",
            text_array_sql(&set.keys().cloned().collect::<Vec<_>>())
        ),
        _ => String::new(),
    };
    let mut names: Vec<String> = target.tenant_condition("$3").into_iter().collect();
    names.push(s.key.matches("it.item_key", &s.columns));
    let present = format!("t.{}", pgrx::spi::quote_identifier(&s.key.columns()[0]));
    format!(
        "SELECT (CASE WHEN {present} IS NULL THEN NULL
             WHEN {matches} THEN {key_object}{approved} OPERATOR(pg_catalog.||) (it.guards{recorded})
             WHEN ${drifted} THEN {key_object}{now} OPERATOR(pg_catalog.||) ({current_guards}{recorded})
        END)::pg_catalog.text
  FROM ROWS FROM (pg_catalog.unnest(${keys}::pg_catalog.text[]),
                  pg_catalog.unnest(${revisions}::pg_catalog.int8[]),
                  pg_catalog.unnest(${guards}::pg_catalog.text[]::pg_catalog.jsonb[]))
       WITH ORDINALITY AS it(item_key, revision, guards, n)
  LEFT JOIN {name} AS t ON {names}
 ORDER BY it.n",
        matches = target.matches_item(&def.guard_columns, &constants),
        approved = revision("it.revision"),
        now = revision(&s.guard_now()),
        name = target.sql_name,
        names = names.join(" AND "),
    )
}
