//! The commit loop behind `CALL etc_batch.drain_job(job_id, max_chunks)`.
//!
//! One transaction per chunk:
//!   lock the job's row -> check the progress -> take the next chunk of the frozen list
//!   by next_index -> the guarded change, in a subtransaction, as the registering role ->
//!   one audit row per item -> advance next_index -> COMMIT.
//! The change, the audit rows and the checkpoint commit together or not at all; a chunk
//! in which any item no longer matches is rolled back whole and the job stops in
//! `conflict`. Conflicts and corrupt progress are recorded and raised, never retried.

use super::approval::{self, parse_object};
use super::conflict::{self, Expected};
use super::crash::{self, Point};
use super::definition::Definition;
use super::progress::Progress;
use super::sql;
use super::target::Target;
use crate::activity::Activity;
use crate::error::{BatchError, Result};
use crate::installed;
use crate::lease::Fence;
use crate::query;
use crate::roles::{as_author, as_role};
use crate::status::JobStatus;
use crate::txn::{subtransaction_unless, FailureKind, TxnLoop};
use pgrx::datum::JsonB;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::quote_literal;
use serde_json::Value;
use std::collections::BTreeMap;

/// What one CALL did: the keys and chunks it committed, and the job's status after it.
#[derive(Debug)]
pub struct Drained {
    pub keys: Vec<String>,
    pub chunks: i32,
    pub status: JobStatus,
}

/// The statements of one job, built once per call.
struct Job {
    /// The statement that reads a chunk's items (it depends on the guard columns).
    items_sql: String,
    activity: Activity,
    def: Definition,
    /// The lease this drainer works under, checked again in every chunk's transaction.
    fence: Option<Fence>,
    change_sql: String,
    row_sql: String,
    bookkeeper: pg_sys::Oid,
    /// Who called drain_job: the job's SQL runs restricted when it is not the registrant.
    caller: pg_sys::Oid,
}

enum Chunk {
    /// The keys it committed, and whether it was the job's last chunk.
    Committed { keys: Vec<String>, last: bool },
    /// Nothing left to do: the job is done.
    Finished,
}

/// The chunk's approved items, as the business statement takes them: arrays in
/// position order, passed on without being read into Rust.
struct Items {
    count: i32,
    keys: Option<query::Opaque>,
    revisions: Option<query::Opaque>,
    guards: Option<query::Opaque>,
    first_key: String,
    last_key: String,
    /// For each guard column: whether each item has it (bool[]), its values (text[]).
    guard_arrays: Vec<Option<query::Opaque>>,
}

impl Items {
    fn arg(&self, array: &Option<query::Opaque>) -> pgrx::datum::DatumWithOid<'static> {
        match array {
            Some(array) => array.arg(),
            None => pgrx::datum::DatumWithOid::null_oid(pg_sys::TEXTARRAYOID),
        }
    }
}

/// What the business change of a chunk did, in position order.
struct Changed {
    keys: Vec<String>,
    revisions: Vec<i64>,
}

/// The job's row, locked, as the chunk's transaction found it.
struct Locked {
    status: JobStatus,
    progress: Progress,
    audit_changes: i64,
    item_changes: i64,
    sealed: bool,
    audit_beyond: Option<i32>,
}

impl Locked {
    /// The cheap, exact check (see progress.rs): why the checkpoint cannot be trusted.
    fn untrusted(&self) -> Option<String> {
        let p = &self.progress;
        if let Err(reason) = p.check_position() {
            return Some(reason);
        }
        if !self.sealed {
            return Some(format!(
                "The checkpoint (next_index {}) does not match its seal: it was changed outside etc_batch.",
                p.next_index
            ));
        }
        if self.audit_changes != 0 || self.item_changes != 0 {
            return Some(format!(
                "Since they were written, {} change(s) to the job's audit rows and {} change(s) to \
                 its approved items were made outside etc_batch.",
                self.audit_changes, self.item_changes
            ));
        }
        self.audit_beyond.map(|position| {
            format!(
                "An audit row exists at position {position}, at or beyond the checkpoint {}.",
                p.next_index
            )
        })
    }
}

pub fn drain(
    tx: &mut TxnLoop,
    job_id: &str,
    max_chunks: Option<i32>,
    fence: Option<Fence>,
) -> Result<Drained> {
    if let Some(max) = max_chunks.filter(|m| *m < 0) {
        return Err(BatchError::invalid_because(
            format!("max_chunks {max} is out of range"),
            "Give the number of chunks to attempt, or NULL for all of them.",
        ));
    }
    let bookkeeper = installed::owner()?;
    let def = as_role(bookkeeper, || Definition::require(job_id))?;
    if def.handler_dropped {
        return Err(BatchError::HandlerMissing {
            job: job_id.to_string(),
        });
    }
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
    let items_sql = Target::chunk_items_sql(&def.guard_columns);
    let job = Job {
        items_sql,
        activity: Activity::begin(),
        def,
        fence,
        change_sql,
        row_sql,
        bookkeeper,
        caller: crate::roles::current_user(),
    };

    let mut drained = Drained {
        keys: Vec::new(),
        chunks: 0,
        status: JobStatus::Pending,
    };
    let mut finished = false;
    while !finished && max_chunks.is_none_or(|max| drained.chunks < max) {
        match tx.item(|tx| job.next_chunk(tx))? {
            Chunk::Committed { keys, last } => {
                drained.keys.extend(keys);
                drained.chunks += 1;
                finished = last;
            }
            Chunk::Finished => finished = true,
        }
    }
    drained.status = if finished {
        JobStatus::Done
    } else if drained.chunks > 0 {
        // the loop stopped at max_chunks, after a chunk that was not the last
        JobStatus::Pending
    } else {
        // max_chunks 0: the job was not even looked at
        let status = as_role(bookkeeper, || {
            query::one::<String>(sql::JOB_STATUS, &[job_id.into()])
        })?
        .ok_or_else(|| BatchError::UnknownJob {
            job: job_id.to_string(),
        })?;
        JobStatus::parse(&status)?
    };
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
                Ok(Locked {
                    status: JobStatus::parse(&r.get::<String>(1)?.unwrap_or_default())?,
                    progress: Progress {
                        next_index: r.get::<i32>(2)?.unwrap_or(0),
                        item_count: r.get::<i32>(5)?.unwrap_or(0),
                        chunk_size: r.get::<i32>(6)?.unwrap_or(1),
                    },
                    audit_changes: r.get::<i64>(3)?.unwrap_or(0),
                    item_changes: r.get::<i64>(4)?.unwrap_or(0),
                    sealed: r.get::<bool>(7)?.unwrap_or(false),
                    audit_beyond: r.get::<i32>(8)?,
                })
            })
        })?;
        let Some(locked) = locked else {
            return Err(BatchError::UnknownJob {
                job: self.id().to_string(),
            });
        };
        match locked.status {
            JobStatus::Pending => {}
            JobStatus::Done => return Ok(Chunk::Finished),
            stopped => return Err(self.stopped(stopped)?),
        }
        if let Some(reason) = locked.untrusted() {
            return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?);
        }
        let progress = locked.progress;
        let Some(range) = progress.next_chunk() else {
            let reason = format!(
                "The checkpoint is at the end of the {} approved items, but the job is not done.",
                progress.item_count
            );
            return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?);
        };
        let items = self.items(range.start, range.end)?;
        if items.count as usize != range.len() {
            let reason = format!(
                "Positions {} to {} should hold {} approved items, but {} were found.",
                range.start,
                range.end - 1,
                range.len(),
                items.count
            );
            return Err(self.record_problem(tx, JobStatus::Corrupt, &reason, Value::Null)?);
        }
        let (number, total) = progress.chunk_number();
        self.activity.report(&format!(
            "job \"{}\": chunk {number} of {total}, keys {} to {}",
            self.id(),
            items.first_key,
            items.last_key
        ));

        let changed = subtransaction_unless(|| {
            as_author(
                self.def.registered_by,
                &self.def.search_path,
                self.caller,
                || self.change(&items, range.start, range.len()),
            )
        });
        let changed = match changed {
            Ok(Ok(changed)) => changed,
            Ok(Err(position)) => return Err(self.conflict(tx, position, progress.item_count)?),
            Err(failure) => {
                let interrupted = failure.kind() == FailureKind::Interrupted;
                let detail = format!(
                    "Chunk {number} of job \"{}\" was rolled back{}; the job is still pending.",
                    self.id(),
                    if interrupted {
                        " when the call was interrupted"
                    } else {
                        ""
                    }
                );
                // A literal a person can paste, whatever characters the job id holds.
                let hint = format!(
                    "Fix the cause and call etc_batch.drain_job({}) again.",
                    quote_literal(self.id())
                );
                failure.raise(detail, hint)
            }
        };
        crash::reached(Point::AfterChange);

        self.owner(|| {
            query::run(
                sql::INSERT_AUDIT,
                &[
                    self.id().into(),
                    items.arg(&items.keys),
                    items.arg(&items.revisions),
                    items.arg(&items.guards),
                    changed.revisions.into(),
                    range.start.into(),
                    number.into(),
                    pgrx::datum::clock_timestamp().into(),
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
            range.len(),
            if range.len() == 1 { "" } else { "s" },
            items.first_key,
            items.last_key
        );
        Ok(Chunk::Committed {
            keys: changed.keys,
            last: range.end == progress.item_count,
        })
    }

    fn items(&self, start: i32, end: i32) -> Result<Items> {
        let row = self.owner(|| {
            query::row(
                &self.items_sql,
                &[self.id().into(), start.into(), end.into()],
                |r| {
                    Ok(Items {
                        count: r.get::<i32>(1)?.unwrap_or(0),
                        keys: r.opaque(2)?,
                        revisions: r.opaque(3)?,
                        guards: r.opaque(4)?,
                        first_key: r.get::<String>(5)?.unwrap_or_default(),
                        last_key: r.get::<String>(6)?.unwrap_or_default(),
                        guard_arrays: (0..2 * self.def.guard_columns.len())
                            .map(|k| r.opaque(7 + k))
                            .collect::<Result<Vec<_>>>()?,
                    })
                },
            )
        })?;
        row.ok_or_else(|| BatchError::Internal("an aggregate returned no row".into()))
    }

    /// The business change of one chunk, run as the registering role. Ok: each item's
    /// key and revision after the change, in position order. Err(position): that item
    /// did not match, so the chunk must be rolled back.
    fn change(&self, items: &Items, first: i32, len: usize) -> std::result::Result<Changed, i32> {
        let mut args = vec![
            items.arg(&items.keys),
            items.arg(&items.revisions),
            items.arg(&items.guards),
            first.into(),
            self.def.tenant.clone().into(),
        ];
        if self.def.handler.is_none() {
            let set = self.def.set_values.clone().unwrap_or_default();
            args.push(JsonB(Value::Object(set.into_iter().collect())).into());
            args.push(JsonB(Value::Object(self.def.expect.clone().into_iter().collect())).into());
            for (k, array) in items.guard_arrays.iter().enumerate() {
                args.push(match array {
                    Some(array) => array.arg(),
                    None if k % 2 == 0 => pgrx::datum::DatumWithOid::null_oid(pg_sys::BOOLARRAYOID),
                    None => pgrx::datum::DatumWithOid::null_oid(pg_sys::TEXTARRAYOID),
                });
            }
        }
        let handler = self.def.handler.is_some();
        let rows: Vec<(i32, Option<i64>, bool, String)> =
            query::rows(&self.change_sql, &args, 0, |row| {
                let position = row.get::<i32>(1)?.unwrap_or(-1);
                let key = row.get::<String>(3)?.unwrap_or_default();
                if !handler {
                    return Ok((position, row.get::<i64>(2)?, true, key));
                }
                // read as text: jsonb that serde_json cannot hold is a clear error here,
                // not an internal one
                let result = row
                    .get::<String>(2)?
                    .map(|text| {
                        approval::read_json(&format!("the handler's result for item {key}"), &text)
                    })
                    .transpose()?;
                let revision = result
                    .as_ref()
                    .and_then(|j| j.get(&self.def.revision_column))
                    .and_then(Value::as_i64);
                Ok((position, revision, result.is_some(), key))
            })
            .unwrap_or_else(|e| e.raise());

        let mut by_position: BTreeMap<i32, (Option<i64>, bool, String)> = rows
            .into_iter()
            .map(|(p, rev, ok, key)| (p, (rev, ok, key)))
            .collect();
        let mut changed = Changed {
            keys: Vec::with_capacity(len),
            revisions: Vec::with_capacity(len),
        };
        for position in first..first + len as i32 {
            match by_position.remove(&position) {
                Some((revision, true, key)) => {
                    let Some(revision) = revision else {
                        BatchError::invalid_because(
                            format!(
                                "handler result for item {key} has no integer \"{}\"",
                                self.def.revision_column
                            ),
                            "A handler returns the new state of the row, revision included, or NULL for a conflict.",
                        )
                        .raise();
                    };
                    changed.keys.push(key);
                    changed.revisions.push(revision);
                }
                _ => return Err(position),
            }
        }
        Ok(changed)
    }

    /// Records and returns the conflict of the item at `position`.
    fn conflict(&self, tx: &mut TxnLoop, position: i32, item_count: i32) -> Result<BatchError> {
        let (key, revision, guards) = self
            .owner(|| {
                query::row(sql::ITEM, &[self.id().into(), position.into()], |r| {
                    Ok((
                        r.get::<String>(1)?.unwrap_or_default(),
                        r.get::<i64>(2)?.unwrap_or_default(),
                        r.get::<String>(3)?.unwrap_or_default(),
                    ))
                })
            })?
            .ok_or_else(|| {
                BatchError::Internal(format!("no approved item at position {position}"))
            })?;
        let row = as_author(
            self.def.registered_by,
            &self.def.search_path,
            self.caller,
            || {
                query::one::<String>(
                    &self.row_sql,
                    &[self.def.tenant.clone().into(), key.clone().into()],
                )
            },
        )?;
        let guards = parse_object(&guards);
        let expected = Expected {
            key: &key,
            position,
            item_count,
            tenant: &self.def.tenant,
            revision_column: &self.def.revision_column,
            revision,
            guards: &guards,
            expect: &self.def.expect,
        };
        // A row serde_json cannot read (a jsonb column nested deeper than it reads) is
        // reported as its text, so that the conflict is still recorded.
        let row = row.map(|text| serde_json::from_str(&text).unwrap_or(Value::String(text)));
        let (detail, problem) = conflict::describe(&expected, row.as_ref());
        self.record_problem(tx, JobStatus::Conflict, &detail, problem)
    }

    /// Puts the job into `status` with `reason`, commits that, and returns the error to
    /// raise. If another drainer already stopped the job, its record stands.
    fn record_problem(
        &self,
        tx: &mut TxnLoop,
        status: JobStatus,
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
                    status.as_str().into(),
                    problem.to_string().into(),
                    reason.into(),
                ],
            )
        })?;
        tx.commit();
        Ok(stopped_error(self.id(), status, Some(reason.to_string())))
    }

    /// The error for a job that is stopped for good.
    fn stopped(&self, status: JobStatus) -> Result<BatchError> {
        let reason =
            self.owner(|| query::one::<String>(sql::JOB_STATUS_REASON, &[self.id().into()]))?;
        Ok(stopped_error(self.id(), status, reason))
    }
}

/// The error a call raises for a job stopped in `status`, with the reason recorded.
fn stopped_error(job: &str, status: JobStatus, reason: Option<String>) -> BatchError {
    let job = job.to_string();
    match status {
        JobStatus::Conflict => BatchError::JobConflict {
            job,
            detail: reason.unwrap_or_default(),
        },
        JobStatus::Corrupt => BatchError::JobCorrupt {
            job,
            detail: reason.unwrap_or_default(),
        },
        _ => BatchError::JobAborted { job, reason },
    }
}
