//! Reading a job back: job_report, job_summary, verify_job (which marks a pending job
//! that fails it corrupt).

use super::definition::Definition;
use super::sql;
use super::target::Through;
use crate::access::{self, Of, Right};
use crate::error::{BatchError, OrRaise, Result};
use crate::job::register::freeze::{ItemCursor, BATCH};
use crate::job::register::tables::JobTables;
use crate::job::rules::approval::Fingerprint;
use crate::job::rules::columns::Kind;
use crate::job::rules::key::KeyOrder;
use crate::job::rules::progress::Progress;
use crate::job::run::claim;
use crate::query::{self, Cursor};
use crate::roles::as_owner;
use crate::status::JobStatus;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use std::collections::VecDeque;

query::row_reader! {
    /// An item's state, as Target::report_sql gives it (or a left-out item's).
    pub struct ReportRow {
        /// NULL for an item a revert or a remainder left out of its approval (see
        /// `left_out`).
        pub position: Option<i32>,
        pub item_key: String = String::new(),
        pub state: String = String::new(),
        pub revision_committed: Option<i64>,
        pub revision_now: Option<i64>,
    }
}

/// Every approved item with its state, from one statement (one snapshot), read with
/// the caller's privileges, a batch at a time as the rows are asked for: a report of ten
/// million items takes the memory of one batch.
pub fn report(job_id: &str) -> Result<Report> {
    let (def, through) = readable(job_id)?;
    let target = def.target()?;
    let stable_output = target.shape.reads_rows_as_text();
    let cursor = crate::settings::stable_output_if(stable_output, || {
        Cursor::open(
            &target.report_sql(&def.set(), &through),
            &[job_id.into(), def.tenant_value().into()],
        )
    })?;
    Ok(Report {
        cursor: Some(cursor),
        batch: VecDeque::new(),
        stable_output,
        left_out: left_out(job_id)?,
    })
}

/// For a revert or a remainder, the items of the job it was made from that it left out
/// of its approval, as the last rows of its report: no position in it, the state "left
/// out, " and the reason (drifted, gone, another tenant), and for a drifted one approved
/// again later, by which job. Read as the owner, once the caller may read the job.
fn left_out(job_id: &str) -> Result<VecDeque<ReportRow>> {
    let rows = as_owner(|| {
        query::rows(sql::LEFT_OUT, &[job_id.into()], 0, |r| {
            let LeftOut {
                item_key,
                state: because,
                approved_again_as,
            } = LeftOut::read(r)?;
            Ok(ReportRow {
                position: None,
                item_key,
                state: match approved_again_as {
                    Some(again) => format!("left out, {because}; approved again as job {again}"),
                    None => format!("left out, {because}"),
                },
                revision_committed: None,
                revision_now: None,
            })
        })
    })?;
    Ok(rows.into())
}

query::row_reader! {
    /// An item left out, as LEFT_OUT reads it from etc_batch.job_left_out.
    struct LeftOut {
        item_key: String = String::new(),
        /// Why it was left out.
        state: String = String::new(),
        approved_again_as: Option<String>,
    }
}

/// A job's definition, read as the owner, once the caller is found to be one who may
/// read the job (access.rs); and the tables the caller reads its items and audit
/// through.
fn readable(job_id: &str) -> Result<(Definition, Through)> {
    access::require(Of::Job(job_id), Right::Read)?;
    let def = as_owner(|| Definition::require(job_id))?;
    let parents = query::one::<bool>(sql::MAY_READ_JOB_PARENTS, &[])?.unwrap_or(false);
    let through = if parents {
        Through {
            items: "etc_batch.job_item".into(),
            audit: "etc_batch.job_audit".into(),
        }
    } else {
        Through {
            items: def.tables.sql("{items}"),
            audit: def.tables.sql("{audit}"),
        }
    };
    Ok((def, through))
}

/// The rows of job_report, fetched as they are read.
pub struct Report {
    cursor: Option<Cursor>,
    batch: VecDeque<ReportRow>,
    /// The report takes digests of rows, printed the same in every session.
    stable_output: bool,
    /// What follows the approved items: a revert's items left out.
    left_out: VecDeque<ReportRow>,
}

query::row_reader! {
    /// The job's items counted by state, as Target::counts_sql gives them.
    struct Counts {
        unprocessed: i32 = 0,
        matching: i32 = 0,
        drifted: i32 = 0,
        missing: i32 = 0,
        skipped: i32 = 0,
    }
}

impl Iterator for Report {
    type Item = ReportRow;

    fn next(&mut self) -> Option<ReportRow> {
        if self.batch.is_empty() {
            let Some(cursor) = self.cursor.as_ref() else {
                return self.left_out.pop_front();
            };
            let rows = crate::settings::stable_output_if(self.stable_output, || {
                cursor.fetch(BATCH as i64, ReportRow::read)
            })
            .or_raise();
            if rows.is_empty() {
                if let Some(cursor) = self.cursor.take() {
                    cursor.close();
                }
                return self.left_out.pop_front();
            }
            self.batch.extend(rows);
        }
        self.batch.pop_front()
    }
}

#[derive(Default)]
pub struct Summary {
    pub status: String,
    pub approved: i32,
    pub committed: i32,
    pub unprocessed: i32,
    pub matching: i32,
    pub drifted: i32,
    pub missing: i32,
    pub parallel: bool,
    /// Items left unchanged because their rows had drifted (on_drift => skip).
    pub skipped: i32,
    /// When a drain of the job last failed for a reason other than a conflict, and how.
    pub failed_at: Option<TimestampWithTimeZone>,
    pub failure_sqlstate: Option<String>,
    pub failure_message: Option<String>,
}

query::row_reader! {
    /// A job's row as JOB_SUMMARY reads it.
    struct SummaryRow {
        status: String = String::new(),
        approved: i32 = 0,
        committed: i32 = 0,
        parallel: bool = false,
        failed_at: Option<TimestampWithTimeZone>,
        failure_sqlstate: Option<String>,
        failure_message: Option<String>,
    }
}

/// The job's status and its items counted by state: the report's rows counted where
/// they are read, and what the job's row says, read as the owner. Both statements run
/// in the snapshot of the query that called job_summary, so they see one state.
pub fn summary(job_id: &str) -> Result<Summary> {
    let (def, through) = readable(job_id)?;
    let target = def.target()?;
    query::in_callers_snapshot(|| {
        let job = as_owner(|| {
            query::row(sql::JOB_SUMMARY, &[job_id.into()], |r| {
                let r = SummaryRow::read(r)?;
                Ok(Summary {
                    status: r.status,
                    approved: r.approved,
                    committed: r.committed,
                    parallel: r.parallel,
                    failed_at: r.failed_at,
                    failure_sqlstate: r.failure_sqlstate,
                    failure_message: r.failure_message,
                    ..Summary::default()
                })
            })
        })?
        .ok_or_else(|| BatchError::UnknownJob { job: job_id.into() })?;
        crate::settings::stable_output_if(target.shape.reads_rows_as_text(), || {
            query::row(
                &target.counts_sql(&def.set(), &through),
                &[job_id.into(), def.tenant_value().into()],
                |r| {
                    let counts = Counts::read(r)?;
                    Ok(Summary {
                        unprocessed: counts.unprocessed,
                        matching: counts.matching,
                        drifted: counts.drifted,
                        missing: counts.missing,
                        skipped: counts.skipped,
                        ..job
                    })
                },
            )
        })?
        .ok_or_else(|| BatchError::Internal("the counts of a job did not come back".into()))
    })
}

pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

query::row_reader! {
    /// A job's checkpoint and its changes made outside etc_batch, as JOB_CHECKPOINT
    /// reads them.
    #[derive(Default)]
    struct Checkpoint {
        status: String = String::new(),
        next_index: i32 = 0,
        audit_changes: i64 = 0,
        item_changes: i64 = 0,
    }
}

/// The full check: every audit row against every approved item, the counts, the
/// fingerprint of the frozen list. A pending job that fails it becomes corrupt.
pub fn verify(job_id: &str) -> Result<Vec<Check>> {
    access::require(Of::Job(job_id), Right::Act("verify"))?;
    as_owner(|| {
        let def = Definition::load(job_id)?
            .ok_or_else(|| BatchError::UnknownJob { job: job_id.into() })?;
        let Checkpoint {
            status,
            next_index,
            audit_changes,
            item_changes,
        } = query::row(sql::JOB_CHECKPOINT, &[job_id.into()], Checkpoint::read)?
            .unwrap_or_default();
        let p = Progress {
            next_index,
            item_count: def.item_count,
            chunk_size: def.chunk_size,
        };
        let mut checks = Vec::new();
        let mut check = |name, ok: bool, detail: String| checks.push(Check { name, ok, detail });

        def.require_tables()?;
        let fingerprint_ok = fingerprint(&def)? == def.fingerprint;
        if def.parallel {
            verify_chunks(&def, fingerprint_ok, &mut check)?;
        } else {
            verify_checkpoint(&def, &p, fingerprint_ok, &mut check)?;
        }
        if def.deletes.as_ref().is_some_and(|d| d.keep) {
            rows_kept(&def, &mut check)?;
        }
        check(
            "changes outside etc_batch",
            audit_changes == 0 && item_changes == 0,
            format!("{audit_changes} change(s) to audit rows, {item_changes} to approved items."),
        );

        let failed: Vec<&Check> = checks.iter().filter(|c| !c.ok).collect();
        if status == JobStatus::Pending.as_str() && !failed.is_empty() {
            if def.parallel {
                claim::stop(&def.tables)?;
            }
            let reason = failed
                .iter()
                .map(|c| c.detail.as_str())
                .collect::<Vec<_>>()
                .join(" ");
            let stopped = query::one::<bool>(
                sql::SET_PROBLEM,
                &[
                    job_id.into(),
                    JobStatus::Corrupt.as_str().into(),
                    serde_json::json!({"reason": reason}).to_string().into(),
                    reason.as_str().into(),
                ],
            )?;
            if stopped == Some(true) {
                crate::events::job(
                    def.tables.number,
                    job_id,
                    "corrupt",
                    serde_json::json!({"reason": reason}),
                );
            }
            warning!("job \"{job_id}\" failed verification and is now corrupt");
        }
        Ok(checks)
    })
}

/// A sequential job's checks: the checkpoint on a boundary, the approved items all there,
/// an audit row for every item below the checkpoint and none at or beyond it.
fn verify_checkpoint(
    def: &Definition,
    p: &Progress,
    fingerprint_ok: bool,
    check: &mut impl FnMut(&'static str, bool, String),
) -> Result<()> {
    let next_index = p.next_index;
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
    let FullCounts {
        items,
        audits,
        beyond,
    } = query::row(
        &def.tables.sql(sql::FULL_COUNTS),
        &[next_index.into()],
        FullCounts::read,
    )?
    .unwrap_or_default();
    approval(def, items, fingerprint_ok, check);
    check(
        "audit rows",
        audits == next_index as i64 && beyond == 0,
        format!("{audits} audit rows for a checkpoint of {next_index}; {beyond} at or beyond it."),
    );
    let problems = audit_problems(&def.tables, p, 0, 20)?;
    items_audited(
        check,
        problems,
        format!("All {next_index} approved items below the checkpoint have their audit row."),
    );
    Ok(())
}

query::row_reader! {
    /// A job's rows kept, as ROWS_KEPT counts them.
    #[derive(Default)]
    struct RowsKept {
        changed: i64 = 0,
        kept: i64 = 0,
    }
}

/// A job that deletes its rows and keeps them: one row kept for every item its audit says
/// it changed.
fn rows_kept(def: &Definition, check: &mut impl FnMut(&'static str, bool, String)) -> Result<()> {
    let RowsKept { changed, kept } =
        query::row(&def.tables.sql(sql::ROWS_KEPT), &[], RowsKept::read)?.unwrap_or_default();
    check(
        "rows kept",
        changed == kept,
        format!("{kept} rows kept for {changed} items deleted."),
    );
    Ok(())
}

query::row_reader! {
    /// A sequential job's records counted, as FULL_COUNTS reads them.
    #[derive(Default)]
    struct FullCounts {
        items: i64 = 0,
        audits: i64 = 0,
        /// Audit rows at or beyond the checkpoint.
        beyond: i64 = 0,
    }
}

/// The check that every item committed has its audit row: `problems`, what is not so.
fn items_audited(
    check: &mut impl FnMut(&'static str, bool, String),
    problems: Vec<String>,
    all_there: String,
) {
    let ok = problems.is_empty();
    check(
        "items audited",
        ok,
        if ok { all_there } else { problems.join(" ") },
    );
}

query::row_reader! {
    /// A parallel job's records counted, as PARALLEL_COUNTS reads them.
    struct ParallelCounts {
        items: i64 = 0,
        audits: i64 = 0,
        /// Audit rows in chunks not committed.
        outside: i64 = 0,
        /// The items of the committed chunks.
        committed_items: i64 = 0,
    }
}

/// A parallel job's checks: a sealed row for every chunk, the approved items all there,
/// an audit row for every item of a committed chunk and none in any other.
fn verify_chunks(
    def: &Definition,
    fingerprint_ok: bool,
    check: &mut impl FnMut(&'static str, bool, String),
) -> Result<()> {
    let ParallelCounts {
        items,
        audits,
        outside,
        committed_items,
    } = query::row(
        &def.tables.sql(sql::PARALLEL_COUNTS),
        &[def.chunk_size.into(), def.item_count.into()],
        ParallelCounts::read,
    )?
    .ok_or_else(|| BatchError::Internal("the chunk counts did not come back".into()))?;
    let claim::ChunkRows {
        rows,
        committed,
        unsealed,
    } = claim::chunk_rows(&def.job_id, &def.tables)?;
    let chunks = crate::job::rules::progress::chunk_count(def.item_count, def.chunk_size) as i64;
    check(
        "chunks",
        rows == chunks && unsealed == 0,
        format!(
            "{rows} chunk rows for {chunks} chunks, {committed} of them committed; {unsealed} do not match their seal."
        ),
    );
    approval(def, items, fingerprint_ok, check);
    check(
        "audit rows",
        audits == committed_items && outside == 0,
        format!(
            "{audits} audit rows for the {committed_items} items of the committed chunks; {outside} in chunks not committed."
        ),
    );
    let missing = query::rows(
        &def.tables.sql(sql::PARALLEL_AUDIT_MISSING),
        &[def.chunk_size.into(), 20_i64.into()],
        0,
        |r| Ok(Positioned::read(r)?.missing()),
    )?;
    items_audited(
        check,
        missing,
        format!(
            "All {committed_items} approved items of the committed chunks have their audit row."
        ),
    );
    Ok(())
}

/// The frozen list: all of its items there, and the fingerprint it had when registered.
fn approval(
    def: &Definition,
    items: i64,
    fingerprint_ok: bool,
    check: &mut impl FnMut(&'static str, bool, String),
) {
    check(
        "approved items",
        items == def.item_count as i64,
        format!(
            "{items} approved items stored, {} registered.",
            def.item_count
        ),
    );
    check(
        "approval fingerprint",
        fingerprint_ok,
        if fingerprint_ok {
            "The frozen list is the one registered.".into()
        } else {
            "The frozen list no longer hashes to the fingerprint taken at registration.".into()
        },
    );
}

query::row_reader! {
    /// A position and the key approved there (None: none is), as AUDIT_BEYOND,
    /// AUDIT_MISSING and PARALLEL_AUDIT_MISSING read them.
    struct Positioned {
        position: i32 = 0,
        item_key: Option<String>,
    }
}

impl Positioned {
    /// The problem of an approved item without its audit row.
    fn missing(self) -> String {
        format!(
            "The audit row of position {} (key {}) is missing.",
            self.position,
            self.item_key.unwrap_or_default()
        )
    }
}

/// Disagreements between the audit and the approved list: approved items of positions
/// [from, next_index) without their audit row, at most `limit` of them, and any audit
/// row at or beyond next_index.
pub fn audit_problems(
    tables: &JobTables,
    p: &Progress,
    from: i32,
    limit: i64,
) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let beyond = query::by_index(|| {
        query::row(
            &tables.sql(sql::AUDIT_BEYOND),
            &[p.next_index.into()],
            Positioned::read,
        )
    })?;
    if let Some(Positioned { position, item_key }) = beyond {
        let approved = match item_key {
            Some(key) => format!("for key {key}"),
            None => "where no item is approved".to_string(),
        };
        problems.push(format!(
            "An audit row {approved} exists at position {position}, at or beyond the checkpoint {}.",
            p.next_index
        ));
    }
    if p.next_index > from {
        let args = [from.into(), p.next_index.into(), limit.into()];
        problems.extend(query::rows(
            &tables.sql(sql::AUDIT_MISSING),
            &args,
            0,
            |r| Ok(Positioned::read(r)?.missing()),
        )?);
    }
    Ok(problems)
}

/// The fingerprint of the frozen list as it is stored now, taken a batch at a time.
fn fingerprint(def: &Definition) -> Result<String> {
    let mut f = Fingerprint::begin(&def.terms());
    // the keys as stored: only their text is hashed
    for item in ItemCursor::stored(&def.tables, KeyOrder::Here(Kind::Text))? {
        let item = item?;
        f.item(&item.key.text(), item.revision, item.guards.canonical());
    }
    Ok(f.finish())
}
