//! register_remainder: what a job did not change, approved again as a new job in one
//! call, with the same change and chunking unless told otherwise; the job itself ends,
//! continued as the new one.
//!
//! Its items are the job's items without an audit row (unprocessed) and those it skipped
//! (on_drift => skip), each read against its row now: one that still matches its
//! approval is approved again as it was; one whose row drifted is left out, or, with
//! include_drifted, approved again at its row's current state (its revision and the
//! values of its guard columns now); one whose row is gone, or whose key now names
//! another tenant's row, is left out. Every item left out is named in
//! etc_batch.job_left_out, with its reason, and counted in a NOTICE: the job's approved
//! items are its committed and skipped ones, its remainder's and those left out.
//!
//! The drifted items a remainder left out can be approved later, at their rows' state
//! then: register_remainder on the continued job with include_drifted registers them as a
//! job of their own, and job_left_out says which job approved each again.

use crate::error::{BatchError, Result};
use crate::installed;
use crate::job::change::{self, item_values, move_rows, restore, set_expressions, Asked};
use crate::job::definition::Definition;
use crate::job::from_jobs::against_rows::{self, LeftOut, LeftOutBecause, Sorted};
use crate::job::lifecycle;
use crate::job::register::{self, Items, Registered, Request};
use crate::job::rules::approval::Action;
use crate::job::sql;
use crate::job::target::{text_array_sql, Constants, Target};
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
    crate::job::require_read_committed("etc_batch.register_remainder")?;
    let def = lifecycle::acted_on(&req.job_id, "continue")?;
    let owner = installed::owner()?;
    def.require_tables()?;
    // the job's drainers finish their chunk first, and none starts another
    match lifecycle::hold(&def)? {
        JobStatus::Pending | JobStatus::Conflict | JobStatus::Aborted => {}
        JobStatus::Continued if req.include_drifted => {
            if let Some(successor) = lifecycle::reason(&req.job_id)? {
                if let Some(registered) = approve_drifted_again(&req, &def, &successor)? {
                    return Ok(registered);
                }
            }
            return Err(lifecycle::refusal(&req.job_id, JobStatus::Continued)?);
        }
        JobStatus::Corrupt => return Err(lifecycle::untrusted(&req.job_id)),
        stopped => return Err(lifecycle::refusal(&req.job_id, stopped)?),
    }
    let target = def.target()?;
    let found = remaining_items(
        &def,
        &target,
        sql::REMAINING_ITEMS,
        Vec::new(),
        req.include_drifted,
    )?;
    if found.approved.is_empty() {
        return Err(nothing_remains(
            &req.job_id,
            &found.left_out,
            req.include_drifted,
        ));
    }
    let registered = register_items(&req, &def, &found)?;
    as_role(owner, || {
        query::run(
            sql::CONTINUE_JOB,
            &[req.job_id.as_str().into(), req.new_job_id.as_str().into()],
        )
    })?;
    let drifted = against_rows::count(&found.left_out, LeftOutBecause::Drifted);
    against_rows::leave_out(
        &req.new_job_id,
        &req.job_id,
        &found.left_out,
        // a restore's drifted items are rows changed in the archive, which no state now
        // approves
        (drifted > 0 && def.restores.is_none()).then(|| {
            format!(
                "etc_batch.register_remainder({}, 'new job id', include_drifted => true) approves the drifted ones at their rows' state now.",
                quote_literal(&req.job_id)
            )
        }),
    )?;
    Ok(registered)
}

/// The drifted items that `successor`, the job's remainder, left out and no later call
/// approved again, approved now as job `req.new_job_id` at their rows' state: None when
/// there are none. The items whose rows are gone since stay left out, for that reason.
fn approve_drifted_again(
    req: &Remainder,
    def: &Definition,
    successor: &str,
) -> Result<Option<Registered>> {
    let owner = installed::owner()?;
    let target = def.target()?;
    let found = remaining_items(
        def,
        &target,
        sql::LEFT_OUT_DRIFTED,
        vec![successor.into()],
        true,
    )?;
    if found.approved.is_empty() && found.left_out.is_empty() {
        return Ok(None);
    }
    if found.approved.is_empty() {
        return Err(nothing_remains(&req.job_id, &found.left_out, true));
    }
    let registered = register_items(req, def, &found)?;
    let positions: Vec<i32> = found.approved.iter().map(|(p, _)| *p).collect();
    as_role(owner, || {
        query::run(
            sql::APPROVED_AGAIN,
            &[
                successor.into(),
                req.new_job_id.as_str().into(),
                positions.into(),
            ],
        )?;
        query::run(
            sql::LEFT_OUT_NOW,
            &[
                successor.into(),
                found
                    .left_out
                    .iter()
                    .map(|l| l.position)
                    .collect::<Vec<_>>()
                    .into(),
                found
                    .left_out
                    .iter()
                    .map(|l| l.because.as_str().to_string())
                    .collect::<Vec<_>>()
                    .into(),
            ],
        )
    })?;
    Ok(Some(registered))
}

/// The refusal of a remainder that would approve nothing: every item it read is left
/// out, and the job stays as it is.
fn nothing_remains(job_id: &str, left_out: &[LeftOut], include_drifted: bool) -> BatchError {
    let drifted = against_rows::count(left_out, LeftOutBecause::Drifted);
    let gone = left_out.len() as i32 - drifted;
    BatchError::invalid_because(
        format!("nothing of job \"{job_id}\" remains to approve again"),
        if include_drifted || drifted == 0 {
            format!("Every item it did not change names a row that is gone or another tenant's ({gone}).")
        } else {
            format!("Every item it did not change names a row that drifted ({drifted}) or is gone or another tenant's ({gone}); include_drifted => true approves the drifted ones at their state now.")
        },
    )
}

/// Registers `found`'s items as the job `req.new_job_id`, with the job's change.
fn register_items(req: &Remainder, def: &Definition, found: &Sorted) -> Result<Registered> {
    let (set_values, handler, action, keep_deleted) = match def.terms().action {
        Action::Set(values) => (
            Some(Value::Object(values.into_iter().collect())),
            None,
            Asked::Update,
            true,
        ),
        Action::Handler(_) => (None, def.handler_oid, Asked::Update, true),
        Action::Delete { keep } => (None, None, Asked::Delete, keep),
        Action::Move { archive, keep } => (
            None,
            None,
            Asked::Move(move_rows::archive_oid(&archive)?),
            keep,
        ),
        Action::Restore { archive } => (
            None,
            None,
            Asked::Restore(archive.as_deref().map(move_rows::archive_oid).transpose()?),
            true,
        ),
    };
    let items: Vec<&str> = found.approved.iter().map(|(_, i)| i.as_str()).collect();
    register::register(Request {
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
        action,
        keep_deleted,
        set_expressions: set_expressions::as_argument(&def.set_expressions),
    })
}

/// The items `listing` gives (see against_rows::sort), each approved again or left
/// out.
fn remaining_items(
    def: &Definition,
    target: &Target,
    listing: &str,
    listing_args: Vec<pgrx::datum::DatumWithOid<'static>>,
    include_drifted: bool,
) -> Result<Sorted> {
    if let Some(restoring) = &def.restores {
        // the rows still to put back, against their keys now (a key taken is left out,
        // whatever include_drifted says: the row in the way is not the job's)
        let against = restore::against_rows_sql(
            target,
            restoring.archive.as_deref(),
            restore::RowsFrom::Items,
        );
        return crate::settings::stable_output_if(true, || {
            against_rows::sort(def, target, listing, listing_args, &against, &[], &[])
        });
    }
    let constants = Constants::new(def.set_values.as_ref(), &def.expect).args(target)?;
    against_rows::sort(
        def,
        target,
        listing,
        listing_args,
        &against_rows_sql(def, target),
        &constants,
        &[include_drifted],
    )
}

/// SQL: the items of a batch (bound as arrays after the job's constants) against their
/// rows now, as the caller: each one's state (against_rows::state_sql) and its item
/// object to approve again, or NULL to leave it out. Its parameters are the chunk's ($3 the tenant, the constants), then the keys,
/// revisions and guards of the batch, and whether drifted items are approved again.
fn against_rows_sql(def: &Definition, target: &Target) -> String {
    let s = &target.shape;
    // a column set from each item expected to hold still what was recorded before
    let constants =
        Constants::new(def.set_values.as_ref(), &def.expect).with_item_values(&def.set_from_items);
    let first = constants.after();
    // after the batch's keys, revisions and guards
    let drifted = first + 3;
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
    let mut recorded = change::recorded_by(def);
    if !def.set_from_items.is_empty() {
        recorded.push(item_values::BEFORE.to_string());
    }
    let recorded = match recorded {
        columns if columns.is_empty() => String::new(),
        columns => format!(" OPERATOR(pg_catalog.-) {}", text_array_sql(&columns)),
    };
    against_rows::batch_sql(
        target,
        first,
        &target.matches_item(&def.guard_columns, &constants),
        &format!(
            "(CASE WHEN m.state OPERATOR(pg_catalog.=) 'again'
             THEN {key_object}{approved} OPERATOR(pg_catalog.||) (it.guards{recorded})
             WHEN m.state OPERATOR(pg_catalog.=) 'drifted' AND ${drifted}
             THEN {key_object}{now} OPERATOR(pg_catalog.||) ({current_guards}{recorded})
        END)::pg_catalog.text",
            approved = revision("it.revision"),
            now = revision(&s.guard_now()),
        ),
    )
}
