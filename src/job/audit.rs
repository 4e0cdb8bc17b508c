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
];

/// What a chunk's audit rows say.
pub struct ChunkAudit<'a> {
    pub job_id: &'a str,
    pub chunk: i32,
    /// Each changed item's position, and the revision its row has now.
    pub changed: &'a [(i32, i64)],
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
        self.0.write(audit.changed.len(), |i, values| {
            let (position, revision) = audit.changed[i];
            values.copy_from_slice(&[
                job_id,
                position.into_datum(),
                revision.into_datum(),
                chunk,
                txid,
                committed_at,
            ]);
        })
    }
}
