//! The frozen list in and out, a chunk at a time: written at registration in key order,
//! one row per chunk of the job (sql/jobs.sql, job_item_chunk), and hashed into the
//! fingerprint as it goes; and read back in the same order to compare a new registration
//! with it or to verify it. Lists of any size take the memory of one batch.

use crate::error::{BatchError, Result};
use crate::job::change::item_values;
use crate::job::register::tables::JobTables;
use crate::job::rules::approval::{Fingerprint, Guards, Item, Key, Terms};
use crate::job::rules::key::KeyOrder;
use crate::job::sql;
use crate::memory::Scratch;
use crate::own_rows::{Columns, RowWriter};
use crate::query::{self, Cursor, Row};
use crate::roles::as_role;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::IntoDatum;
use std::collections::{BTreeSet, VecDeque};

/// Items per fetch when reading.
pub const BATCH: usize = 10_000;

/// The columns of a job's item partition (sql/jobs.sql).
const COLUMNS: Columns = &[
    ("job_id", pg_sys::TEXTOID),
    ("first_position", pg_sys::INT4OID),
    ("last_position", pg_sys::INT4OID),
    ("keys", pg_sys::TEXTARRAYOID),
    ("revisions", pg_sys::INT8ARRAYOID),
    ("guards", pg_sys::TEXTARRAYOID),
];

/// What registration froze.
pub struct Frozen {
    pub count: i32,
    pub fingerprint: String,
    pub guard_columns: BTreeSet<String>,
}

/// Writes items, in key order, into a job's item partition, a chunk's row at a time.
pub struct Writer<'a> {
    job_id: &'a str,
    /// etc_batch's owner, who alone writes its tables.
    owner: pg_sys::Oid,
    chunk_size: usize,
    fingerprint: Fingerprint,
    last: Option<Key>,
    written: i32,
    keys: Vec<String>,
    revisions: Vec<i64>,
    /// Each item's guards as canonical JSON text, None for an item without any.
    guards: Vec<Option<String>>,
    guard_columns: BTreeSet<String>,
    rows: RowWriter,
    scratch: Scratch,
}

impl<'a> Writer<'a> {
    pub fn new(
        job_id: &'a str,
        tables: &JobTables,
        terms: &Terms,
        owner: pg_sys::Oid,
    ) -> Result<Writer<'a>> {
        let chunk_size = usize::try_from(terms.chunk_size).unwrap_or(1).max(1);
        // a chunk's row at once; a huge chunk's arrays grow as its items come
        let capacity = chunk_size.min(BATCH);
        Ok(Writer {
            job_id,
            owner,
            chunk_size,
            fingerprint: Fingerprint::begin(terms),
            last: None,
            written: 0,
            keys: Vec::with_capacity(capacity),
            revisions: Vec::with_capacity(capacity),
            guards: Vec::with_capacity(capacity),
            guard_columns: BTreeSet::new(),
            rows: RowWriter::new(&tables.items_relname(), COLUMNS)?,
            scratch: Scratch::new(c"etc_batch frozen items"),
        })
    }

    /// The next item; keys must come in ascending order, each once.
    pub fn push(&mut self, item: Item) -> Result<()> {
        if let Some(last) = &self.last {
            if item.key == *last {
                return Err(BatchError::invalid_because(
                    "items contain a duplicate key",
                    format!("Key {} appears more than once.", item.key.text()),
                ));
            }
            if item.key < *last {
                return Err(BatchError::Internal(format!(
                    "approved items arrived out of key order at key {}",
                    item.key.text()
                )));
            }
        }
        let position = self.written as usize + self.keys.len();
        if position >= i32::MAX as usize {
            return Err(BatchError::invalid_because(
                "too many items",
                "An approval holds at most 2147483647 items.",
            ));
        }
        let key = item.key.text();
        self.fingerprint
            .item(&key, item.revision, item.guards.canonical());
        let columns = &mut self.guard_columns;
        item.guards.for_each_column(|column| {
            // the values recorded before the change are no guard column (item_values)
            if column != item_values::BEFORE && !columns.contains(column) {
                columns.insert(column.to_string());
            }
        });
        self.keys.push(key);
        self.revisions.push(item.revision);
        self.guards.push(item.guards.into_text());
        self.last = Some(item.key);
        if self.keys.len() == self.chunk_size {
            self.flush()?;
        }
        Ok(())
    }

    /// The chunk's row, written as the owner; its arrays are built in the scratch
    /// context and freed with it, chunk by chunk.
    fn flush(&mut self) -> Result<()> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let n = self.keys.len() as i32;
        let keys = std::mem::take(&mut self.keys);
        let revisions = std::mem::take(&mut self.revisions);
        let guards = std::mem::take(&mut self.guards);
        let first = self.written;
        let (job_id, owner, rows) = (self.job_id, self.owner, &mut self.rows);
        self.scratch.round(|| {
            as_role(owner, || {
                // a chunk none of whose items has guards keeps none (NULL)
                let guards = guards.iter().any(Option::is_some).then_some(guards);
                let values = [
                    job_id.into_datum(),
                    first.into_datum(),
                    (first + n - 1).into_datum(),
                    keys.into_datum(),
                    revisions.into_datum(),
                    guards.into_datum(),
                ];
                rows.write(1, |_, row| row.copy_from_slice(&values))
            })
        })?;
        self.written += n;
        Ok(())
    }

    pub fn finish(mut self) -> Result<Frozen> {
        self.flush()?;
        Ok(Frozen {
            count: self.written,
            fingerprint: self.fingerprint.finish(),
            guard_columns: self.guard_columns,
        })
    }
}

/// Items read from a cursor of rows (key as text, revision, guards as jsonb text, and,
/// for a key PostgreSQL orders, the key's rank in that order and whether the item names
/// no row), in the order the cursor gives them, a batch at a time.
pub struct ItemCursor {
    cursor: Option<Cursor>,
    read: ReadAs,
    batch: VecDeque<Item>,
}

/// How an ItemCursor reads its rows.
#[derive(Clone, Copy)]
struct ReadAs {
    order: KeyOrder,
    /// Its statement prints rows or keys as text (settings::STABLE_OUTPUT).
    stable_output: bool,
}

impl ItemCursor {
    /// The frozen list of a job, in position (and so key) order.
    pub fn stored(tables: &JobTables, order: KeyOrder) -> Result<ItemCursor> {
        Self::open(&tables.sql(sql::STORED_ITEMS), &[], order, false)
    }

    /// The rows of an items query (see items_query::ItemsQuery::ordered_sql), in key
    /// order.
    pub fn query(sql: &str, order: KeyOrder) -> Result<ItemCursor> {
        Self::open(sql, &[], order, false)
    }

    /// Rows PostgreSQL orders (ordered.rs): with their rank, and whether they name a row.
    pub fn ranked(sql: &str, args: &[DatumWithOid], stable_output: bool) -> Result<ItemCursor> {
        Self::open(sql, args, KeyOrder::Sql, stable_output)
    }

    fn open(
        sql: &str,
        args: &[DatumWithOid],
        order: KeyOrder,
        stable_output: bool,
    ) -> Result<ItemCursor> {
        let read = ReadAs {
            order,
            stable_output,
        };
        let cursor = read.settings(|| Cursor::open(sql, args))?;
        Ok(ItemCursor {
            cursor: Some(cursor),
            read,
            batch: VecDeque::new(),
        })
    }
}

query::row_reader! {
    /// An item as every statement an ItemCursor reads returns it: its key as text, its
    /// revision and its guards as jsonb text.
    struct ItemRow {
        item_key: Option<String>,
        revision: Option<i64>,
        guards: Option<String>,
    }
}

query::row_reader! {
    /// What the statements of a key PostgreSQL orders add to an item: the key's rank in
    /// that order, and whether the item names no row.
    struct Ranked {
        rank: i64 = 0,
        names_no_row: Option<bool>,
    }
}

impl ReadAs {
    fn settings<R>(self, work: impl FnOnce() -> R) -> R {
        crate::settings::stable_output_if(self.stable_output, work)
    }

    fn item(self, row: &Row) -> Result<Item> {
        let ItemRow {
            item_key,
            revision,
            guards,
        } = ItemRow::read(row)?;
        let key = item_key.ok_or_else(|| {
            BatchError::invalid_because(
                "items_query returned an item without a key",
                "Every row names its item by the key column, which must not be NULL.",
            )
        })?;
        let guards = match guards {
            Some(text) => Guards::read(&text),
            None => Guards::default(),
        };
        let key = match self.order {
            KeyOrder::Here(_) => Key::from_text(self.order, &key),
            KeyOrder::Sql => {
                let Ranked { rank, names_no_row } = Ranked::read(row)?;
                if names_no_row == Some(true) {
                    return Err(BatchError::invalid_because(
                        format!("item {key} names no row of the target"),
                        "A job guarded by a digest of the row takes each item's digest when it is registered, and one that records the values before its change reads them then, from the row the item names now.",
                    ));
                }
                Key::ranked(rank, key)
            }
        };
        let revision = revision.ok_or_else(|| {
            BatchError::invalid_because(
                format!(
                    "items_query returned item {} without a revision",
                    key.text()
                ),
                "Every row carries the revision the operator saw, which must not be NULL.",
            )
        })?;
        Ok(Item {
            key,
            revision,
            guards,
        })
    }
}

impl Iterator for ItemCursor {
    type Item = Result<Item>;

    fn next(&mut self) -> Option<Result<Item>> {
        if self.batch.is_empty() {
            let cursor = self.cursor.as_ref()?;
            let read = self.read;
            match read.settings(|| cursor.fetch(BATCH as i64, |r| read.item(r))) {
                Ok(rows) if rows.is_empty() => {
                    if let Some(cursor) = self.cursor.take() {
                        cursor.close();
                    }
                    return None;
                }
                Ok(rows) => self.batch.extend(rows),
                Err(e) => {
                    self.cursor = None;
                    return Some(Err(e));
                }
            }
        }
        self.batch.pop_front().map(Ok)
    }
}
