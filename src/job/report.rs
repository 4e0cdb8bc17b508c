//! Reading a job back: job_report, job_summary, verify_job (which marks a pending job
//! that fails it corrupt).

use super::definition::Definition;
use super::progress::Progress;
use super::sql;
use crate::error::{BatchError, Result};
use crate::query;
use crate::roles::as_owner;
use crate::status::JobStatus;
use pgrx::prelude::*;

pub struct ReportRow {
    pub position: i32,
    pub item_key: String,
    pub state: String,
    pub revision_committed: Option<i64>,
    pub revision_now: Option<i64>,
}

/// Every approved item with its state, from one statement (one snapshot), read with
/// the caller's privileges.
pub fn report(job_id: &str) -> Result<Vec<ReportRow>> {
    let def = Definition::require(job_id)?;
    let target = def.target()?;
    let sql = target.report_sql();
    query::rows(&sql, &[job_id.into(), def.tenant.clone().into()], 0, |r| {
        Ok(ReportRow {
            position: r.get::<i32>(1)?.unwrap_or(0),
            item_key: r.get::<String>(2)?.unwrap_or_default(),
            state: r.get::<String>(3)?.unwrap_or_default(),
            revision_committed: r.get::<i64>(4)?,
            revision_now: r.get::<i64>(5)?,
        })
    })
}

pub struct Summary {
    pub status: String,
    pub approved: i32,
    pub committed: i32,
    pub unprocessed: i32,
    pub matching: i32,
    pub drifted: i32,
    pub missing: i32,
}

pub fn summary(job_id: &str) -> Result<Summary> {
    let status = query::row(sql::JOB_COUNTS, &[job_id.into()], |r| {
        Ok((
            r.get::<String>(1)?.unwrap_or_default(),
            r.get::<i32>(2)?.unwrap_or(0),
            r.get::<i32>(3)?.unwrap_or(0),
        ))
    })?
    .ok_or_else(|| BatchError::UnknownJob { job: job_id.into() })?;
    let rows = report(job_id)?;
    let count = |state: &str| rows.iter().filter(|r| r.state == state).count() as i32;
    Ok(Summary {
        status: status.0,
        approved: status.1,
        committed: status.2,
        unprocessed: count("unprocessed"),
        matching: count("matching"),
        drifted: count("drifted"),
        missing: count("missing"),
    })
}

pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// The full check: every audit row against every approved item, the counts, the
/// fingerprint of the frozen list. A pending job that fails it becomes corrupt.
pub fn verify(job_id: &str) -> Result<Vec<Check>> {
    as_owner(|| {
        let def = Definition::load(job_id)?
            .ok_or_else(|| BatchError::UnknownJob { job: job_id.into() })?;
        let (status, next_index, audit_changes, item_changes) =
            query::row(sql::JOB_CHECKPOINT, &[job_id.into()], |r| {
                Ok((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<i32>(2)?.unwrap_or(0),
                    r.get::<i64>(3)?.unwrap_or(0),
                    r.get::<i64>(4)?.unwrap_or(0),
                ))
            })?
            .unwrap_or_default();
        let p = Progress {
            next_index,
            item_count: def.item_count,
            chunk_size: def.chunk_size,
        };
        let mut checks = Vec::new();
        let mut check = |name, ok: bool, detail: String| checks.push(Check { name, ok, detail });

        let position = p.check_position();
        check(
            "checkpoint",
            position.is_ok(),
            position.err().unwrap_or_else(|| {
                format!(
                    "next_index {} of {} approved items, on a chunk boundary.",
                    p.next_index, p.item_count
                )
            }),
        );

        let (items, audits, beyond) =
            query::row(sql::FULL_COUNTS, &[job_id.into(), next_index.into()], |r| {
                Ok((
                    r.get::<i64>(1)?.unwrap_or(0),
                    r.get::<i64>(2)?.unwrap_or(0),
                    r.get::<i64>(3)?.unwrap_or(0),
                ))
            })?
            .unwrap_or_default();
        check(
            "approved items",
            items == def.item_count as i64,
            format!(
                "{items} approved items stored, {} registered.",
                def.item_count
            ),
        );
        let target = def.target()?;
        let fingerprint_ok = def.approval(&target.shape)?.fingerprint() == def.fingerprint;
        check(
            "approval fingerprint",
            fingerprint_ok,
            if fingerprint_ok {
                "The frozen list is the one registered.".into()
            } else {
                "The frozen list no longer hashes to the fingerprint taken at registration.".into()
            },
        );
        check(
            "audit rows",
            audits == next_index as i64 && beyond == 0,
            format!(
                "{audits} audit rows for a checkpoint of {next_index}; {beyond} at or beyond it."
            ),
        );
        let problems = audit_problems(job_id, &p, 0, 20)?;
        check(
            "audit matches approval",
            problems.is_empty(),
            if problems.is_empty() {
                format!("All {next_index} audit rows match their approved items.")
            } else {
                problems.join(" ")
            },
        );
        check(
            "changes outside etc_batch",
            audit_changes == 0 && item_changes == 0,
            format!("{audit_changes} change(s) to audit rows, {item_changes} to approved items."),
        );

        let failed: Vec<&Check> = checks.iter().filter(|c| !c.ok).collect();
        if status == JobStatus::Pending.as_str() && !failed.is_empty() {
            let reason = failed
                .iter()
                .map(|c| c.detail.as_str())
                .collect::<Vec<_>>()
                .join(" ");
            query::run(
                sql::SET_PROBLEM,
                &[
                    job_id.into(),
                    JobStatus::Corrupt.as_str().into(),
                    serde_json::json!({"reason": reason}).to_string().into(),
                    reason.into(),
                ],
            )?;
            warning!("job \"{job_id}\" failed verification and is now corrupt");
        }
        Ok(checks)
    })
}

/// Disagreements between the audit and the approved list for positions
/// [from, next_index), at most `limit` of them, plus any audit row at or beyond
/// next_index.
pub fn audit_problems(job_id: &str, p: &Progress, from: i32, limit: i64) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let beyond = query::row(
        sql::AUDIT_BEYOND,
        &[job_id.into(), p.next_index.into()],
        |r| {
            Ok((
                r.get::<i32>(1)?.unwrap_or(0),
                r.get::<String>(2)?.unwrap_or_default(),
            ))
        },
    )?;
    if let Some((position, key)) = beyond {
        problems.push(format!(
            "An audit row for key {key} exists at position {position}, at or beyond the checkpoint {}.",
            p.next_index
        ));
    }
    if p.next_index > from {
        let args = [
            job_id.into(),
            from.into(),
            p.next_index.into(),
            limit.into(),
        ];
        problems.extend(query::rows(sql::AUDIT_MISMATCHES, &args, 0, |r| {
            let position = r.get::<i32>(1)?.unwrap_or(0);
            let key = r.get::<String>(2)?.unwrap_or_default();
            Ok(match r.get::<String>(3)? {
                None => format!("The audit row of position {position} (key {key}) is missing."),
                Some(audited) if audited != key => format!(
                    "The audit row of position {position} names key {audited}, but the approved item there is key {key}."
                ),
                Some(_) if r.get::<i64>(4)? != r.get::<i64>(5)? => format!(
                    "The audit row of position {position} (key {key}) says revision {}, but the approval says {}.",
                    r.get::<i64>(5)?.unwrap_or_default(),
                    r.get::<i64>(4)?.unwrap_or_default()
                ),
                Some(_) => format!(
                    "The audit row of position {position} (key {key}) records guards {}, but the approval says {}.",
                    r.get::<String>(7)?.unwrap_or_default(),
                    r.get::<String>(6)?.unwrap_or_default()
                ),
            })
        })?);
    }
    Ok(problems)
}
