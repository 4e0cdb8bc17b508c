//! A chunk's audit rows, written straight into the job's audit partition the way COPY
//! writes rows: one multi-insert into the heap, then each row into every index of the
//! partition, unique checks included. No statement is planned, started and ended for
//! them, which is most of what an INSERT of a small chunk's rows costs, and the heap gets
//! one WAL record per page instead of one per row.
//!
//! What an INSERT would also do and this does not: fire INSERT triggers (etc_batch puts
//! none on its tables) and evaluate column defaults (every column is given). The
//! partition must have exactly the columns etc_batch writes; a column added by hand
//! stops the drain with a clear error instead of being left to a default.

use crate::error::{BatchError, Result};
use pgrx::pg_sys;
use pgrx::IntoDatum;
use std::ffi::CString;

/// The columns of a job's audit partition, in the order etc_batch gives them, with
/// their types.
const COLUMNS: [(&str, pg_sys::Oid); 6] = [
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

/// Writes the audit rows of one job's chunks, one drain call long. Its tuple slots are
/// made once, in the memory context current when the writer was made (which outlives
/// every chunk's transaction), over a copy of the partition's row type that no
/// transaction's resources hold: a slot made per row and dropped again would cost more
/// than the row.
pub struct AuditWriter {
    /// The partition's name within schema etc_batch.
    partition: CString,
    context: pg_sys::MemoryContext,
    /// For each attribute of the partition, which of COLUMNS it holds.
    layout: Vec<Option<usize>>,
    desc: pg_sys::TupleDesc,
    slots: Vec<*mut pg_sys::TupleTableSlot>,
}

impl AuditWriter {
    pub fn new(partition: &str) -> Result<AuditWriter> {
        Ok(AuditWriter {
            partition: CString::new(partition).map_err(|_| {
                BatchError::Internal("a partition name contains a zero byte".into())
            })?,
            // SAFETY: reads the current context, which the caller keeps for the call.
            context: unsafe { pg_sys::CurrentMemoryContext },
            layout: Vec::new(),
            desc: std::ptr::null_mut(),
            slots: Vec::new(),
        })
    }

    fn name(&self) -> String {
        self.partition.to_string_lossy().into_owned()
    }

    /// Writes the chunk's audit rows, in the current transaction, as the current user
    /// (etc_batch's owner: the caller's privileges are never checked here). A row that is
    /// already there fails with unique_violation, as an INSERT would.
    pub fn write(&mut self, audit: &ChunkAudit) -> Result<()> {
        let job_id = audit
            .job_id
            .into_datum()
            .ok_or_else(|| BatchError::Internal("a job id without a datum".into()))?;
        // SAFETY: the relation is opened (and locked until the end of the transaction)
        // for the span of the call and closed before returning; the executor state and
        // the index descriptors are made and freed here, the slots are the writer's. An
        // ERROR (a duplicate row, a lost partition) unwinds through this: the
        // transaction's abort releases the relation, the locks and the memory.
        unsafe {
            let range = pg_sys::makeRangeVar(
                c"etc_batch".as_ptr() as *mut _,
                self.partition.as_ptr() as *mut _,
                -1,
            );
            let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
            let rel = pg_sys::table_openrv(range, lock);
            if let Err(e) = self.prepare(rel, audit.changed.len()) {
                pg_sys::table_close(rel, lock);
                return Err(e);
            }
            let txid = pg_sys::GetTopFullTransactionId().value as i64;
            // the time of the commit, as near as it can be known before it
            let committed_at = pg_sys::GetCurrentTimestamp();
            let estate = pg_sys::CreateExecutorState();
            let result_rel = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>())
                as *mut pg_sys::ResultRelInfo;
            pg_sys::InitResultRelInfo(result_rel, rel, 0, std::ptr::null_mut(), 0);
            pg_sys::ExecOpenIndices(result_rel, false);

            let slots = &mut self.slots[..audit.changed.len()];
            for (&slot, &(position, revision)) in slots.iter().zip(audit.changed) {
                let values = [
                    job_id,
                    pg_sys::Datum::from(position),
                    pg_sys::Datum::from(revision),
                    pg_sys::Datum::from(audit.chunk),
                    pg_sys::Datum::from(txid),
                    pg_sys::Datum::from(committed_at),
                ];
                pg_sys::ExecClearTuple(slot);
                for (i, column) in self.layout.iter().enumerate() {
                    *(*slot).tts_values.add(i) =
                        column.map_or(pg_sys::Datum::from(0), |c| values[c]);
                    *(*slot).tts_isnull.add(i) = column.is_none();
                }
                pg_sys::ExecStoreVirtualTuple(slot);
            }
            let command = pg_sys::GetCurrentCommandId(true);
            pg_sys::table_multi_insert(
                rel,
                slots.as_mut_ptr(),
                slots.len() as i32,
                command,
                0,
                std::ptr::null_mut(),
            );
            for &slot in slots.iter() {
                let recheck = insert_index_tuples(result_rel, slot, estate);
                // the partition's primary key is immediate: a duplicate has failed already
                if !recheck.is_null() {
                    return Err(BatchError::Internal(format!(
                        "a deferred unique constraint on etc_batch.{}",
                        self.name()
                    )));
                }
                pg_sys::ExecClearTuple(slot);
            }
            pg_sys::ExecCloseIndices(result_rel);
            pg_sys::FreeExecutorState(estate);
            // the lock stays until the transaction ends, as an INSERT's would
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
        Ok(())
    }

    /// Checks the partition's columns (again: they may have changed since the last
    /// chunk) and makes slots for `rows` rows, for the row type as it is now.
    ///
    /// # Safety
    /// `rel` must be the open partition.
    unsafe fn prepare(&mut self, rel: pg_sys::Relation, rows: usize) -> Result<()> {
        let layout = layout(rel, &self.name())?;
        let natts = (*(*rel).rd_att).natts;
        if layout != self.layout || self.desc.is_null() || (*self.desc).natts != natts {
            // the old slots are the writer context's memory, left to it
            self.slots.clear();
            let previous = pg_sys::MemoryContextSwitchTo(self.context);
            self.desc = pg_sys::CreateTupleDescCopy((*rel).rd_att);
            pg_sys::MemoryContextSwitchTo(previous);
            self.layout = layout;
        }
        while self.slots.len() < rows {
            let previous = pg_sys::MemoryContextSwitchTo(self.context);
            let slot = pg_sys::MakeSingleTupleTableSlot(self.desc, &pg_sys::TTSOpsVirtual);
            pg_sys::MemoryContextSwitchTo(previous);
            self.slots.push(slot);
        }
        Ok(())
    }
}

/// For each attribute of the partition, which of COLUMNS it holds; None for a dropped
/// one. Every column must be there with its type, and nothing else.
///
/// # Safety
/// `rel` must be an open relation.
unsafe fn layout(rel: pg_sys::Relation, partition: &str) -> Result<Vec<Option<usize>>> {
    let desc = pgrx::tupdesc::PgTupleDesc::from_pg_unchecked((*rel).rd_att);
    let mut layout = Vec::with_capacity(desc.len());
    let mut seen = [false; COLUMNS.len()];
    for i in 0..desc.len() {
        let attribute = desc.get(i).expect("the attribute exists");
        if attribute.attisdropped {
            layout.push(None);
            continue;
        }
        let name = attribute.name();
        let found = COLUMNS
            .iter()
            .position(|(n, t)| *n == name && *t == attribute.atttypid);
        let Some(c) = found else {
            return Err(BatchError::AuditLayout {
                partition: partition.to_string(),
                column: name.to_string(),
            });
        };
        seen[c] = true;
        layout.push(Some(c));
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(BatchError::AuditLayout {
            partition: partition.to_string(),
            column: COLUMNS[missing].0.to_string(),
        });
    }
    Ok(layout)
}

/// ExecInsertIndexTuples, whose last argument (onlySummarizing) came with PostgreSQL 16.
///
/// # Safety
/// As ExecInsertIndexTuples: the slot holds a tuple just inserted into the result
/// relation, whose indexes are open.
unsafe fn insert_index_tuples(
    result_rel: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
) -> *mut pg_sys::List {
    #[cfg(feature = "pg15")]
    {
        pg_sys::ExecInsertIndexTuples(
            result_rel,
            slot,
            estate,
            false,
            false,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    #[cfg(not(feature = "pg15"))]
    {
        pg_sys::ExecInsertIndexTuples(
            result_rel,
            slot,
            estate,
            false,
            false,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            false,
        )
    }
}
