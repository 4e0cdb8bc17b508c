//! A chunk's audit rows, written into the job's audit partition by a `RowWriter`: one
//! per changed item, in the chunk's own transaction.

use crate::error::Result;
use crate::own_rows::{Columns, RowWriter};
use crate::txn::txid_current;
use pgrx::pg_sys;
use pgrx::IntoDatum;

/// The columns of a job's audit partition (sql/jobs.sql).
const COLUMNS: Columns = &[
    ("job_id", pg_sys::TEXTOID),
    ("position", pg_sys::INT4OID),
    ("revision_after", pg_sys::INT8OID),
    ("chunk", pg_sys::INT4OID),
    ("txid", pg_sys::INT8OID),
    ("committed_at", pg_sys::TIMESTAMPTZOID),
    ("skipped", pg_sys::BOOLOID),
    ("found", pg_sys::JSONBOID),
];

/// What a chunk's audit rows say.
pub struct ChunkAudit<'a> {
    pub job_id: &'a str,
    pub chunk: i32,
    /// Each changed item's position, and the revision (or digest) its row has now.
    pub changed: &'a [(i32, Option<i64>)],
    /// Each item left unchanged because its row drifted, and the row found, as jsonb
    /// text (`null`: gone).
    pub skipped: &'a [(i32, String)],
}

/// A jsonb datum of the JSON text `text`, as jsonb_in reads it.
fn jsonb(text: &str) -> Result<Option<pg_sys::Datum>> {
    let text = std::ffi::CString::new(text).map_err(|_| {
        crate::error::BatchError::Internal("a row's text contains a zero byte".into())
    })?;
    // SAFETY: jsonb_in reads the NUL-terminated text and returns a jsonb datum in the
    // current memory context, which lives until the audit rows are written.
    Ok(unsafe {
        pgrx::direct_function_call_as_datum(
            pg_sys::jsonb_in,
            &[Some(pg_sys::Datum::from(text.as_ptr()))],
        )
    })
}

/// Writes the audit rows of one job's chunks, one drain call long.
pub struct AuditWriter(RowWriter);

impl AuditWriter {
    /// For the job whose audit partition is etc_batch.`partition`.
    pub fn new(partition: &str) -> Result<AuditWriter> {
        Ok(AuditWriter(RowWriter::new(partition, COLUMNS)?))
    }

    /// Writes the chunk's audit rows in the current transaction. An audit row already at
    /// one of the positions fails with unique_violation.
    pub fn write(&mut self, audit: &ChunkAudit) -> Result<()> {
        let job_id = audit.job_id.into_datum();
        let chunk = audit.chunk.into_datum();
        let txid = txid_current().into_datum();
        // the time of the commit, as near as it can be known before it
        let committed_at = pgrx::datum::clock_timestamp().into_datum();
        let changed = audit.changed.len();
        // jsonb datums of the rows found, made before the rows are written
        let found: Vec<Option<pg_sys::Datum>> = audit
            .skipped
            .iter()
            .map(|(_, row)| jsonb(row))
            .collect::<Result<_>>()?;
        self.0.write(changed + audit.skipped.len(), |i, values| {
            let (position, revision, skipped, found) = match i.checked_sub(changed) {
                None => (audit.changed[i].0, audit.changed[i].1, false, None),
                Some(s) => (audit.skipped[s].0, None, true, found[s]),
            };
            values.copy_from_slice(&[
                job_id,
                position.into_datum(),
                revision.into_datum(),
                chunk,
                txid,
                committed_at,
                skipped.into_datum(),
                found,
            ]);
        })
    }
}
