//! A chunk's audit row, written into the job's audit partition by a `RowWriter`: one
//! per committed chunk, in the chunk's own transaction, holding what the change left
//! each of its items at (see sql/jobs.sql, job_audit_chunk).

use crate::error::{BatchError, Result};
use crate::own_rows::{Columns, RowWriter};
use crate::txn::txid_current;
use pgrx::pg_sys;
use pgrx::IntoDatum;
use std::ops::Range;

/// The columns of a job's audit partition (sql/jobs.sql).
const COLUMNS: Columns = &[
    ("job_id", pg_sys::TEXTOID),
    ("first_position", pg_sys::INT4OID),
    ("last_position", pg_sys::INT4OID),
    ("chunk", pg_sys::INT4OID),
    ("txid", pg_sys::INT8OID),
    ("committed_at", pg_sys::TIMESTAMPTZOID),
    ("revisions_after", pg_sys::INT8ARRAYOID),
    ("skipped", pg_sys::INT4ARRAYOID),
    ("found", pg_sys::JSONBOID),
    ("kept", pg_sys::TEXTARRAYOID),
];

/// What a chunk's audit row says.
pub struct ChunkAudit<'a> {
    pub job_id: &'a str,
    pub chunk: i32,
    /// The chunk's positions in the frozen list: every one of them changed or skipped.
    pub range: Range<i32>,
    /// Each changed item's position, and the revision (or digest) its row has now.
    pub changed: &'a [(i32, Option<i64>)],
    /// Each item left unchanged because its row drifted, and the row found, as jsonb
    /// text (`null`: gone).
    pub skipped: &'a [(i32, String)],
    /// For a job that deletes its rows and keeps them: each changed item's row as it was
    /// deleted, in its row type's text form.
    pub kept: &'a [(i32, String)],
}

/// A chunk's audit row's arrays.
#[derive(Debug)]
struct Arrays {
    /// The revision each position of the chunk was left at, in position order (None for
    /// an item skipped, or guarded by named columns).
    revisions: Vec<Option<i64>>,
    /// The positions skipped, in order, and the rows found there as one JSON array.
    skipped: Vec<i32>,
    found: Option<String>,
    /// Each position's row kept, in position order; None when the chunk kept none.
    kept: Option<Vec<Option<String>>>,
}

impl ChunkAudit<'_> {
    /// The row's arrays. Every position must be changed or skipped, once.
    fn arrays(&self) -> Result<Arrays> {
        let start = self.range.start;
        let mut revisions = vec![None; self.range.len()];
        let mut seen = vec![false; self.range.len()];
        let mut mark = |position: i32| -> Result<usize> {
            let at = usize::try_from(position - start)
                .ok()
                .filter(|&at| at < seen.len() && !seen[at])
                .ok_or_else(|| {
                    BatchError::Internal(format!(
                        "position {position} audited twice or outside its chunk {}..{}",
                        self.range.start, self.range.end
                    ))
                })?;
            seen[at] = true;
            Ok(at)
        };
        for &(position, revision) in self.changed {
            revisions[mark(position)?] = revision;
        }
        let mut skipped: Vec<(i32, &str)> = Vec::with_capacity(self.skipped.len());
        for (position, row) in self.skipped {
            mark(*position)?;
            skipped.push((*position, row));
        }
        if seen.iter().any(|s| !s) {
            return Err(BatchError::Internal(format!(
                "chunk {} audited {} of its {} items",
                self.chunk,
                self.changed.len() + self.skipped.len(),
                self.range.len()
            )));
        }
        skipped.sort_unstable_by_key(|(position, _)| *position);
        let found = (!skipped.is_empty()).then(|| {
            let rows: Vec<&str> = skipped.iter().map(|(_, row)| *row).collect();
            format!("[{}]", rows.join(","))
        });
        let kept = (!self.kept.is_empty()).then(|| {
            let mut kept = vec![None; self.range.len()];
            for (position, row) in self.kept {
                if let Some(at) = kept.get_mut((position - start) as usize) {
                    *at = Some(row.clone());
                }
            }
            kept
        });
        Ok(Arrays {
            revisions,
            skipped: skipped.into_iter().map(|(position, _)| position).collect(),
            found,
            kept,
        })
    }
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

    /// Writes the chunk's audit row in the current transaction. An audit row already
    /// beginning or ending where it does fails with unique_violation.
    pub fn write(&mut self, audit: &ChunkAudit) -> Result<()> {
        let Arrays {
            revisions,
            skipped,
            found,
            kept,
        } = audit.arrays()?;
        let found = match found {
            Some(rows) => jsonb(&rows)?,
            None => None,
        };
        let values = [
            audit.job_id.into_datum(),
            audit.range.start.into_datum(),
            (audit.range.end - 1).into_datum(),
            audit.chunk.into_datum(),
            txid_current().into_datum(),
            // the time of the commit, as near as it can be known before it
            pgrx::datum::clock_timestamp().into_datum(),
            revisions.into_datum(),
            (!skipped.is_empty()).then_some(skipped).into_datum(),
            found,
            kept.into_datum(),
        ];
        self.0.write(1, |_, row| row.copy_from_slice(&values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audit<'a>(
        changed: &'a [(i32, Option<i64>)],
        skipped: &'a [(i32, String)],
    ) -> ChunkAudit<'a> {
        ChunkAudit {
            job_id: "j",
            chunk: 2,
            range: 10..14,
            changed,
            skipped,
            kept: &[],
        }
    }

    #[test]
    fn revisions_in_position_order_with_the_skipped_apart() {
        let skipped = [(12, "{\"id\": 3}".to_string()), (11, "null".to_string())];
        let arrays = audit(&[(13, Some(7)), (10, Some(5))], &skipped)
            .arrays()
            .unwrap();
        assert_eq!(arrays.revisions, vec![Some(5), None, None, Some(7)]);
        assert_eq!(arrays.skipped, vec![11, 12]);
        assert_eq!(arrays.found.as_deref(), Some("[null,{\"id\": 3}]"));
    }

    #[test]
    fn every_position_once_or_it_is_refused() {
        let all = [(10, Some(1)), (11, Some(1)), (12, None), (13, None)];
        assert!(audit(&all, &[]).arrays().unwrap().found.is_none());
        assert!(audit(&all[..3], &[]).arrays().is_err());
        assert!(
            audit(&[(10, None), (10, None), (12, None), (13, None)], &[])
                .arrays()
                .is_err()
        );
        assert!(audit(&[(9, None), (11, None), (12, None), (13, None)], &[])
            .arrays()
            .is_err());
    }
}
