//! A step's audit row (etc_batch.step_audit), one per attempt and per skip, written by a
//! `RowWriter` in the step's own transaction.

use super::sql;
use crate::error::{BatchError, Result};
use crate::own_rows::{nextval, Columns, RowWriter};
use crate::query;
use crate::status::{AttemptOutcome, StepStatus};
use crate::txn::txid_current;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::IntoDatum;

/// The columns of etc_batch.step_audit (sql/chains.sql), audit_id from its identity.
const COLUMNS: Columns = &[
    ("audit_id", pg_sys::INT8OID),
    ("step_id", pg_sys::INT8OID),
    ("batch", pg_sys::TEXTOID),
    ("attempt", pg_sys::INT4OID),
    ("pid", pg_sys::INT4OID),
    ("run_by", pg_sys::REGROLEOID),
    ("ran_as", pg_sys::REGROLEOID),
    ("lock_requested_at", pg_sys::TIMESTAMPTZOID),
    ("lock_acquired_at", pg_sys::TIMESTAMPTZOID),
    ("status_seen", pg_sys::TEXTOID),
    ("outcome", pg_sys::TEXTOID),
    ("started_at", pg_sys::TIMESTAMPTZOID),
    ("finished_at", pg_sys::TIMESTAMPTZOID),
    ("error", pg_sys::TEXTOID),
    ("sqlstate", pg_sys::TEXTOID),
    ("txid", pg_sys::INT8OID),
];

/// One attempt to run a step, or one skip of a step found done.
pub struct Attempt<'a> {
    pub step_id: i64,
    pub batch: &'a str,
    pub attempt: i32,
    pub run_by: pg_sys::Oid,
    pub ran_as: pg_sys::Oid,
    pub lock_requested: TimestampWithTimeZone,
    pub lock_acquired: TimestampWithTimeZone,
    /// The status read once the lock was granted.
    pub status_seen: StepStatus,
    pub outcome: AttemptOutcome,
    /// When the step's command started and finished; None for a skip.
    pub ran: Option<(TimestampWithTimeZone, TimestampWithTimeZone)>,
    /// The error and its SQLSTATE, for a failure.
    pub error: Option<(&'a str, &'a str)>,
}

/// Writes the audit rows of one runner's steps, one CALL long. Run as etc_batch's owner.
pub struct StepAuditWriter {
    writer: RowWriter,
    sequence: pg_sys::Oid,
}

impl StepAuditWriter {
    pub fn new() -> Result<StepAuditWriter> {
        let sequence = query::one::<pg_sys::Oid>(sql::STEP_AUDIT_SEQUENCE, &[])?
            .ok_or_else(|| BatchError::Internal("step_audit has no identity sequence".into()))?;
        Ok(StepAuditWriter {
            writer: RowWriter::new("step_audit", COLUMNS)?,
            sequence,
        })
    }

    pub fn write(&mut self, a: &Attempt) -> Result<()> {
        let id = nextval(self.sequence);
        // SAFETY: reads the backend's pid.
        let pid = unsafe { pg_sys::MyProcPid };
        let values = [
            id.into_datum(),
            a.step_id.into_datum(),
            a.batch.into_datum(),
            a.attempt.into_datum(),
            pid.into_datum(),
            a.run_by.into_datum(),
            a.ran_as.into_datum(),
            a.lock_requested.into_datum(),
            a.lock_acquired.into_datum(),
            a.status_seen.as_str().into_datum(),
            a.outcome.as_str().into_datum(),
            a.ran.and_then(|(started, _)| started.into_datum()),
            a.ran.and_then(|(_, finished)| finished.into_datum()),
            a.error.and_then(|(message, _)| message.into_datum()),
            a.error.and_then(|(_, sqlstate)| sqlstate.into_datum()),
            txid_current().into_datum(),
        ];
        self.writer.write(1, |_, row| row.copy_from_slice(&values))
    }
}
