//! The commit loop behind `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! One transaction per chunk:
//!   lock the job's row -> check the progress -> take the next chunk of the frozen list
//!   by next_index -> the guarded change, in a subtransaction, as the registering role ->
//!   one audit row per item -> advance next_index -> COMMIT.
//! The change, the audit rows and the checkpoint commit together or not at all; a chunk
//! in which any item no longer matches is rolled back whole and the job stops in
//! `conflict`. Conflicts and corrupt progress are recorded and raised, never retried.

use super::conflict::{self, Expected};
use super::crash::{self, Point};
use super::definition::Definition;
use super::progress::Progress;
use super::sql;
use crate::activity::Activity;
use crate::chain::step::{classify_failure, FailureKind};
use crate::error::{BatchError, Result};
use crate::lease::Fence;
use crate::query;
use crate::roles::{as_role, extension_owner};
use crate::txn::{subtransaction_unless, TxnLoop};
use pgrx::datum::JsonB;
use pgrx::pg_sys;
use pgrx::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;

/// What one CALL did: the keys and chunks it committed, and the job's status after it.
#[derive(Debug, Default)]
pub struct Drained {
    pub keys: Vec<String>,
    pub chunks: i32,
    pub status: String,
}

/// The statements of one job, built once per call.
struct Job {
    activity: Activity,
    def: Definition,
    /// The lease this drainer works under, checked again in every chunk's transaction.
    fence: Option<Fence>,
    change_sql: String,
    row_sql: String,
    bookkeeper: pg_sys::Oid,
}

enum Chunk {
    Committed(Vec<String>),
    /// Nothing left to do: the job is done.
    Finished,
}

/// The chunk's approved items, as the business statement takes them.
struct Items {
    positions: Vec<i32>,
    keys: Vec<String>,
    revisions: Vec<i64>,
    guards: Vec<String>,
}

pub fn drain(
    tx: &mut TxnLoop,
    job_id: &str,
    max_chunks: Option<i32>,
    fence: Option<Fence>,
) -> Result<Drained> {
    if let Some(max) = max_chunks.filter(|m| *m < 0) {
        return Err(BatchError::InvalidArgument {
            message: format!("max_chunks {max} is out of range"),
            detail: Some("Give the number of chunks to attempt, or NULL for all of them.".into()),
        });
    }
    let bookkeeper = extension_owner()?;
    let def = as_role(bookkeeper, || Definition::require(job_id))?;
    let target = def.target()?;
    let change_sql = match &def.handler {
        Some(handler) => target.handler_sql(handler),
        None => {
            let set: Vec<String> = def
                .set_values
                .iter()
                .flat_map(|m| m.keys().cloned())
                .collect();
            let expect: Vec<String> = def.expect.keys().cloned().collect();
            target.update_sql(&set, &def.guard_columns, &expect)
        }
    };
    let row_sql = target.current_row_sql();
    let job = Job {
        activity: Activity::begin(),
        def,
        fence,
        change_sql,
        row_sql,
        bookkeeper,
    };

    let mut drained = Drained::default();
    while max_chunks.is_none_or(|max| drained.chunks < max) {
        match tx.item(|tx| job.next_chunk(tx))? {
            Chunk::Committed(keys) => {
                drained.keys.extend(keys);
                drained.chunks += 1;
            }
            Chunk::Finished => break,
        }
    }
    drained.status = as_role(bookkeeper, || {
        query::one::<String>(
            "SELECT j.status FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1",
            &[job_id.into()],
        )
    })?
    .unwrap_or_default();
    Ok(drained)
}

impl Job {
    fn owner<R>(&self, work: impl FnOnce() -> Result<R>) -> Result<R> {
        as_role(self.bookkeeper, work)
    }

    fn id(&self) -> &str {
        &self.def.job_id
    }

    fn next_chunk(&self, tx: &mut TxnLoop) -> Result<Chunk> {
        if let Some(fence) = &self.fence {
            self.owner(|| fence.check())?;
        }
        let locked = self.owner(|| {
            query::row(sql::LOCK_JOB, &[self.id().into()], |r| {
                Ok((
                    r.get::<String>(1)?.unwrap_or_default(),
                    Progress {
                        next_index: r.get::<i32>(2)?.unwrap_or(0),
                        item_count: r.get::<i32>(5)?.unwrap_or(0),
                        chunk_size: r.get::<i32>(6)?.unwrap_or(1),
                    },
                    r.get::<i64>(3)?.unwrap_or(0),
                    r.get::<i64>(4)?.unwrap_or(0),
                ))
            })
        })?;
        let Some((status, progress, audit_changes, item_changes)) = locked else {
            return Err(BatchError::UnknownJob {
                job: self.id().to_string(),
            });
        };
        match status.as_str() {
            "pending" => {}
            "done" => return Ok(Chunk::Finished),
            _ => return Err(self.stopped(&status)?),
        }
        if let Some(reason) = self.check_progress(progress, audit_changes, item_changes)? {
            return Err(self.record_problem(tx, "corrupt", &reason, Value::Null)?);
        }
        let Some(range) = progress.next_chunk() else {
            let reason = format!(
                "The checkpoint is at the end of the {} approved items, but the job is not done.",
                progress.item_count
            );
            return Err(self.record_problem(tx, "corrupt", &reason, Value::Null)?);
        };
        let items = self.items(range.start, range.end)?;
        if items.positions.len() != range.len() {
            let reason = format!(
                "Positions {} to {} should hold {} approved items, but {} were found.",
                range.start,
                range.end - 1,
                range.len(),
                items.positions.len()
            );
            return Err(self.record_problem(tx, "corrupt", &reason, Value::Null)?);
        }
        let (number, total) = progress.chunk_number();
        self.activity.report(&format!(
            "job \"{}\": chunk {number} of {total}, keys {} to {}",
            self.id(),
            items.keys.first().map(String::as_str).unwrap_or(""),
            items.keys.last().map(String::as_str).unwrap_or("")
        ));

        let changed =
            subtransaction_unless(|| as_role(self.def.registered_by, || self.change(&items)));
        let revisions_after = match changed {
            Ok(Ok(revisions)) => revisions,
            Ok(Err(index)) => return Err(self.conflict(tx, &items, index, progress.item_count)?),
            Err(failure) => {
                let interrupted = classify_failure(failure.code) == FailureKind::Interrupted;
                let detail = format!(
                    "Chunk {number} of job \"{}\" was rolled back{}; the job is still pending.",
                    self.id(),
                    if interrupted {
                        " when the call was interrupted"
                    } else {
                        ""
                    }
                );
                let hint = format!(
                    "Fix the cause and call etc_batch.drain_job('{}') again.",
                    self.id()
                );
                failure.into_report(detail, hint).report(PgLogLevel::ERROR);
                unreachable!()
            }
        };
        crash::reached(Point::AfterChange);

        self.owner(|| {
            query::run(
                sql::INSERT_AUDIT,
                &[
                    self.id().into(),
                    items.positions.clone().into(),
                    items.keys.clone().into(),
                    items.revisions.clone().into(),
                    revisions_after.into(),
                    items.guards.clone().into(),
                    number.into(),
                    crate::clock::now().into(),
                ],
            )
        })?;
        crash::reached(Point::AfterAudit);
        self.owner(|| query::run(sql::ADVANCE, &[self.id().into(), range.end.into()]))?;
        crash::reached(Point::AfterCheckpoint);
        tx.commit();
        crash::reached(Point::AfterCommit);

        notice!(
            "chunk {number} of {total} committed: {} item{}, keys {} to {}",
            items.keys.len(),
            if items.keys.len() == 1 { "" } else { "s" },
            items.keys.first().map(String::as_str).unwrap_or(""),
            items.keys.last().map(String::as_str).unwrap_or("")
        );
        Ok(Chunk::Committed(items.keys))
    }

    fn items(&self, start: i32, end: i32) -> Result<Items> {
        let row = self.owner(|| {
            query::row(
                sql::CHUNK_ITEMS,
                &[self.id().into(), start.into(), end.into()],
                |r| {
                    Ok(Items {
                        positions: r.get::<Vec<i32>>(1)?.unwrap_or_default(),
                        keys: r.get::<Vec<String>>(2)?.unwrap_or_default(),
                        revisions: r.get::<Vec<i64>>(3)?.unwrap_or_default(),
                        guards: r.get::<Vec<String>>(4)?.unwrap_or_default(),
                    })
                },
            )
        })?;
        Ok(row.unwrap_or(Items {
            positions: vec![],
            keys: vec![],
            revisions: vec![],
            guards: vec![],
        }))
    }

    /// The business change of one chunk. Ok: each item's revision after the change, in
    /// position order. Err(i): item i did not match, so the chunk must be rolled back.
    fn change(&self, items: &Items) -> std::result::Result<Vec<i64>, usize> {
        let args = || -> Vec<pgrx::datum::DatumWithOid<'static>> {
            let mut args: Vec<pgrx::datum::DatumWithOid<'static>> = vec![
                items.positions.clone().into(),
                items.keys.clone().into(),
                items.revisions.clone().into(),
                items.guards.clone().into(),
                self.def.tenant.clone().into(),
            ];
            if self.def.handler.is_none() {
                let set = self.def.set_values.clone().unwrap_or_default();
                args.push(JsonB(Value::Object(set.into_iter().collect())).into());
                args.push(
                    JsonB(Value::Object(self.def.expect.clone().into_iter().collect())).into(),
                );
            }
            args
        };
        let handler = self.def.handler.is_some();
        let rows: Vec<(i32, Option<i64>, bool)> =
            query::rows(&self.change_sql, &args(), 0, |row| {
                let position = row.get::<i32>(1)?.unwrap_or(-1);
                if !handler {
                    return Ok((position, row.get::<i64>(2)?, true));
                }
                let result = row.get::<JsonB>(2)?;
                let revision = result
                    .as_ref()
                    .and_then(|j| j.0.get(&self.def.revision_column))
                    .and_then(Value::as_i64);
                Ok((position, revision, result.is_some()))
            })
            .unwrap_or_else(|e| e.raise());

        let by_position: BTreeMap<i32, (Option<i64>, bool)> = rows
            .into_iter()
            .map(|(p, rev, ok)| (p, (rev, ok)))
            .collect();
        let mut revisions = Vec::with_capacity(items.positions.len());
        for (index, position) in items.positions.iter().enumerate() {
            match by_position.get(position) {
                Some((revision, true)) => {
                    if self.def.handler.is_some() && revision.is_none() {
                        BatchError::InvalidArgument {
                            message: format!(
                                "handler result for item {} has no integer \"{}\"",
                                items.keys[index], self.def.revision_column
                            ),
                            detail: Some("A handler returns the new state of the row, revision included, or NULL for a conflict.".into()),
                        }
                        .raise();
                    }
                    revisions.push(revision.unwrap_or_default());
                }
                _ => return Err(index),
            }
        }
        Ok(revisions)
    }

    /// Records and returns the conflict of item `index` of the chunk.
    fn conflict(
        &self,
        tx: &mut TxnLoop,
        items: &Items,
        index: usize,
        item_count: i32,
    ) -> Result<BatchError> {
        let key = &items.keys[index];
        let row = as_role(self.def.registered_by, || {
            query::one::<JsonB>(
                &self.row_sql,
                &[self.def.tenant.clone().into(), key.clone().into()],
            )
        })?;
        let guards = super::register::parse_object(&items.guards[index]);
        let expected = Expected {
            key,
            position: items.positions[index],
            item_count,
            tenant: &self.def.tenant,
            revision_column: &self.def.revision_column,
            revision: items.revisions[index],
            guards: &guards,
            expect: &self.def.expect,
        };
        let (detail, problem) = conflict::describe(&expected, row.as_ref().map(|j| &j.0));
        self.record_problem(tx, "conflict", &detail, problem)
    }

    /// Puts the job into `status` with `reason`, commits that, and returns the error to
    /// raise. If another drainer already stopped the job, its record stands.
    fn record_problem(
        &self,
        tx: &mut TxnLoop,
        status: &str,
        reason: &str,
        problem: Value,
    ) -> Result<BatchError> {
        let problem = if problem.is_null() {
            serde_json::json!({"reason": reason})
        } else {
            problem
        };
        self.owner(|| {
            query::run(
                sql::SET_PROBLEM,
                &[
                    self.id().into(),
                    status.into(),
                    problem.to_string().into(),
                    reason.into(),
                ],
            )
        })?;
        tx.commit();
        Ok(match status {
            "conflict" => BatchError::JobConflict {
                job: self.id().to_string(),
                detail: reason.to_string(),
            },
            _ => BatchError::JobCorrupt {
                job: self.id().to_string(),
                detail: reason.to_string(),
            },
        })
    }

    /// The error for a job that is stopped for good.
    fn stopped(&self, status: &str) -> Result<BatchError> {
        let reason = self.owner(|| {
            query::one::<String>(
                "SELECT j.status_reason FROM etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1",
                &[self.id().into()],
            )
        })?;
        let job = self.id().to_string();
        let detail = reason.clone().unwrap_or_default();
        Ok(match status {
            "conflict" => BatchError::JobConflict { job, detail },
            "corrupt" => BatchError::JobCorrupt { job, detail },
            _ => BatchError::JobAborted { job, reason },
        })
    }

    /// The cheap, exact check of section "Progress is verified before it is trusted"
    /// (see progress.rs). Some(reason) when the progress cannot be trusted.
    fn check_progress(
        &self,
        p: Progress,
        audit_changes: i64,
        item_changes: i64,
    ) -> Result<Option<String>> {
        if let Err(reason) = p.check_position() {
            return Ok(Some(reason));
        }
        if audit_changes != 0 || item_changes != 0 {
            return Ok(Some(format!(
                "Since they were written, {audit_changes} change(s) to the job's audit rows and \
                 {item_changes} change(s) to its approved items were made outside etc_batch."
            )));
        }
        self.owner(|| {
            audit_problems(
                self.id(),
                &p,
                p.last_chunk().map(|r| r.start).unwrap_or(0),
                1,
            )
        })
        .map(|problems| problems.into_iter().next())
    }
}

/// Disagreements between the audit and the approved list for positions
/// [from, next_index), at most `limit` of them, plus any audit row at or beyond
/// next_index. Used per chunk (from = the last chunk) and by verify_job (from = 0).
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
