//! The frozen list in and out, a batch at a time: written at registration in key order
//! and hashed into the fingerprint as it goes, and read back in the same order to compare
//! a new registration with it or to verify it. Lists of any size take the memory of one
//! batch.

use super::approval::{canonical_object, parse_object, Fingerprint, Item, Key, Terms};
use super::key::KeyOrder;
use super::sql;
use super::tables::JobTables;
use crate::error::{BatchError, Result};
use crate::memory::Scratch;
use crate::query::{self, Cursor, Row};
use crate::roles::as_role;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use std::collections::{BTreeSet, VecDeque};

/// Items per INSERT when writing, and per fetch when reading.
pub const BATCH: usize = 10_000;

/// What registration froze.
pub struct Frozen {
    pub count: i32,
    pub fingerprint: String,
    pub guard_columns: BTreeSet<String>,
}

/// Writes items, in key order, into a job's item partition.
pub struct Writer<'a> {
    job_id: &'a str,
    /// etc_batch's owner, who alone writes its tables.
    owner: pg_sys::Oid,
    fingerprint: Fingerprint,
    last: Option<Key>,
    written: i32,
    keys: Vec<String>,
    revisions: Vec<i64>,
    guards: Vec<String>,
    guard_columns: BTreeSet<String>,
    insert: String,
    scratch: Scratch,
}

impl<'a> Writer<'a> {
    pub fn new(
        job_id: &'a str,
        tables: &JobTables,
        terms: &Terms,
        owner: pg_sys::Oid,
    ) -> Writer<'a> {
        Writer {
            job_id,
            owner,
            fingerprint: Fingerprint::begin(terms),
            last: None,
            written: 0,
            keys: Vec::with_capacity(BATCH),
            revisions: Vec::with_capacity(BATCH),
            guards: Vec::with_capacity(BATCH),
            guard_columns: BTreeSet::new(),
            insert: tables.sql(sql::INSERT_ITEMS),
            scratch: Scratch::new(c"etc_batch frozen items"),
        }
    }

    /// The next item; keys must come in ascending order, each once.
    pub fn push(&mut self, item: &Item) -> Result<()> {
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
        let guards = item.guards.canonical();
        self.fingerprint.item(&key, item.revision, &guards);
        for column in item.guards.keys() {
            if !self.guard_columns.contains(column) {
                self.guard_columns.insert(column.clone());
            }
        }
        self.keys.push(key);
        self.revisions.push(item.revision);
        self.guards.push(guards);
        self.last = Some(item.key.clone());
        if self.keys.len() == BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.keys.is_empty() {
            return Ok(());
        }
        let n = self.keys.len() as i32;
        let args = (
            std::mem::take(&mut self.keys),
            std::mem::take(&mut self.revisions),
            std::mem::take(&mut self.guards),
        );
        // The arrays are built in the scratch context and freed with it, batch by batch.
        self.scratch.round(|| {
            as_role(self.owner, || {
                query::run(
                    &self.insert,
                    &[
                        self.written.into(),
                        args.0.into(),
                        args.1.into(),
                        args.2.into(),
                        self.job_id.into(),
                    ],
                )
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
    /// Guards as the cursor gives them are canonicalized (one spelling per number), as
    /// a jsonb approval's are: the frozen list holds them so already.
    canonicalize: bool,
    /// Its statement prints rows or keys as text (settings::STABLE_OUTPUT).
    stable_output: bool,
}

impl ItemCursor {
    /// The frozen list of a job, in position (and so key) order.
    pub fn stored(tables: &JobTables, order: KeyOrder) -> Result<ItemCursor> {
        Self::open(&tables.sql(sql::STORED_ITEMS), &[], order, false, false)
    }

    /// The rows of an items query (see items_query::ItemsQuery::ordered_sql), in key
    /// order.
    pub fn query(sql: &str, order: KeyOrder) -> Result<ItemCursor> {
        Self::open(sql, &[], order, true, false)
    }

    /// Rows PostgreSQL orders (ordered.rs): with their rank, and whether they name a row.
    pub fn ranked(sql: &str, args: &[DatumWithOid], stable_output: bool) -> Result<ItemCursor> {
        Self::open(sql, args, KeyOrder::Sql, true, stable_output)
    }

    fn open(
        sql: &str,
        args: &[DatumWithOid],
        order: KeyOrder,
        canonicalize: bool,
        stable_output: bool,
    ) -> Result<ItemCursor> {
        let read = ReadAs {
            order,
            canonicalize,
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

impl ReadAs {
    fn settings<R>(self, work: impl FnOnce() -> R) -> R {
        let settings = if self.stable_output {
            crate::settings::STABLE_OUTPUT
        } else {
            &[]
        };
        crate::settings::with(settings, work)
    }

    fn item(self, row: &Row) -> Result<Item> {
        let key = row.get::<String>(1)?.ok_or_else(|| {
            BatchError::invalid_because(
                "items_query returned an item without a key",
                "Every row names its item by the key column, which must not be NULL.",
            )
        })?;
        let revision = row.get::<i64>(2)?;
        let text = row.get::<String>(3)?.unwrap_or_else(|| "{}".into());
        let guards = if self.canonicalize {
            parse_object(&canonical_object(&parse_object(&text)))
        } else {
            parse_object(&text)
        }
        .into_iter()
        .collect();
        let key = match self.order {
            KeyOrder::Here(_) => Key::from_text(self.order, &key),
            KeyOrder::Sql => {
                if row.get::<bool>(5)? == Some(true) {
                    return Err(BatchError::invalid_because(
                        format!("item {key} names no row of the target"),
                        "A job guarded by a digest of the row takes each item's digest when it is registered, from the row the item names now.",
                    ));
                }
                Key::ranked(row.get::<i64>(4)?.unwrap_or_default(), key)
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
