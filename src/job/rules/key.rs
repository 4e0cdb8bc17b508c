//! How an approved item names its row of the target: the job's key. Chosen once, when the
//! job is registered (the primary key, or the columns the approval names), and kept with
//! the job; the approval's items, an items query, the chunk's statements and the frozen
//! list's order each ask it, and never what it is made of.
//!
//! A key is one or more columns of any type with a btree order. Its value is kept in the
//! frozen list as text: a one-column key as its column's type prints it, a key of several
//! columns as a JSON array of those texts (`["eu", "2026-12-01"]`). The frozen list is in
//! the key's own order: a key of one integer, uuid or text column is ordered here (text
//! by its bytes, so the order never depends on a locale); any other key by PostgreSQL,
//! in the types' own order, as the key's btree index orders it (src/job/register/ordered.rs).

use crate::error::{BatchError, Result};
use crate::job::rules::columns::{is_integer, json_kind, parse_uuid, Columns, Kind};
use pgrx::spi::quote_identifier;
use serde_json::Value;
use std::fmt::Write as _;

/// The key: the columns an item names its row by, in the order they are compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKey {
    columns: Vec<String>,
}

/// Who puts the frozen list in the key's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrder {
    /// This library, as it reads the items: a key of one integer, uuid or text column.
    Here(Kind),
    /// PostgreSQL, in the key's types' own order (src/job/register/ordered.rs).
    Sql,
}

impl JobKey {
    pub fn of(columns: Vec<String>) -> JobKey {
        JobKey { columns }
    }

    pub fn one(column: &str) -> JobKey {
        JobKey::of(vec![column.to_string()])
    }

    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The key as messages name it: `id`, or `(region, id)`.
    pub fn describe(&self) -> String {
        match self.columns.as_slice() {
            [one] => one.clone(),
            more => format!("({})", more.join(", ")),
        }
    }

    /// Who orders the frozen list, once the key's columns are known to be there.
    pub fn order(&self, columns: &Columns) -> Result<KeyOrder> {
        for name in &self.columns {
            columns.column(name)?;
        }
        Ok(match self.columns.as_slice() {
            [one] => match columns.column(one)?.kind {
                kind @ (Kind::Int { .. } | Kind::Text | Kind::Uuid) => KeyOrder::Here(kind),
                _ => KeyOrder::Sql,
            },
            _ => KeyOrder::Sql,
        })
    }

    /// Whether the key is one column of an integer type: then how many keys lie between
    /// a chunk's first and last is their difference.
    pub fn is_one_integer(&self, columns: &Columns) -> bool {
        match self.columns.as_slice() {
            [one] => columns
                .get(one)
                .is_some_and(|c| matches!(c.kind, Kind::Int { .. })),
            _ => false,
        }
    }

    /// Whether a chunk's rows of the target lie between its first and last key, as the
    /// key's index orders them: then the chunk's statement bounds its scan by them. True
    /// unless a column of the key is text under a collation of the operating system's,
    /// whose order the library under it may change (the frozen list keeps text in byte
    /// order, which is the "C" collation's).
    pub fn bounds_chunks(&self, columns: &Columns) -> bool {
        self.columns.iter().all(|name| {
            columns
                .get(name)
                .is_some_and(|c| !c.collatable || c.byte_ordered)
        })
    }

    /// SQL: the text of the key of row `t` (`t.`-qualified columns), as the frozen list
    /// keeps it.
    pub fn text_of(&self, row: &str) -> String {
        let part = |c: &String| format!("{row}.{}::pg_catalog.text", quote_identifier(c));
        match self.columns.as_slice() {
            [one] => part(one),
            more => format!(
                "pg_catalog.jsonb_build_array({})::pg_catalog.text",
                more.iter().map(part).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// SQL: part `i` of the key text `item_key` as the column's type `sql_type`.
    pub fn typed_part(&self, item_key: &str, i: usize, sql_type: &str) -> String {
        match self.columns.len() {
            1 => format!("({item_key})::{sql_type}"),
            _ => {
                format!("(({item_key})::pg_catalog.jsonb OPERATOR(pg_catalog.->>) {i})::{sql_type}")
            }
        }
    }

    /// SQL: the target's row `t` is the one the key text `item_key` names.
    pub fn matches(&self, item_key: &str, columns: &Columns) -> String {
        self.columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                format!(
                    "t.{} OPERATOR(pg_catalog.=) {}",
                    quote_identifier(c),
                    self.typed_part(item_key, i, &columns[c].sql_type)
                )
            })
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// SQL: the chunk's rows lie between parameters `$first` and `$first + 1`, the key
    /// texts of its first and last item (see bounds_chunks); a key of several columns is
    /// compared as a row, which its btree index reads as one range.
    pub fn between(&self, first: usize, columns: &Columns) -> String {
        let row = |param: usize| -> String {
            let parts: Vec<String> = self
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    self.typed_part(
                        &format!("${param}::pg_catalog.text"),
                        i,
                        &columns[c].sql_type,
                    )
                })
                .collect();
            match parts.as_slice() {
                [one] => one.clone(),
                more => format!("ROW({})", more.join(", ")),
            }
        };
        let key = match self.columns.as_slice() {
            [one] => format!("t.{}", quote_identifier(one)),
            more => format!(
                "ROW({})",
                more.iter()
                    .map(|c| format!("t.{}", quote_identifier(c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        format!(
            "{key} OPERATOR(pg_catalog.>=) {} AND {key} OPERATOR(pg_catalog.<=) {}",
            row(first),
            row(first + 1)
        )
    }

    /// SQL: the key's columns, for an ORDER BY that sorts rows `t` in the key's order.
    pub fn order_by(&self, row: &str) -> String {
        self.columns
            .iter()
            .map(|c| format!("{row}.{}", quote_identifier(c)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Item `position`'s key, given by the fields of its object, for a key the library
    /// orders (KeyOrder::Here). None: the item has no such field.
    pub fn value(
        &self,
        columns: &Columns,
        object: &serde_json::Map<String, Value>,
        position: usize,
    ) -> Result<Key> {
        let [name] = self.columns.as_slice() else {
            return Err(BatchError::Internal(
                "a key of several columns read as one".into(),
            ));
        };
        let value = object.get(name).ok_or_else(|| no_key(name, position))?;
        let column = columns.column(name)?;
        let wrong = || {
            BatchError::invalid_because(
                format!("item {position} has a key of the wrong type"),
                format!(
                    "Key column \"{}\" is {}, so the key must be {}, not {}.",
                    column.name,
                    column.type_name,
                    column.kind.describe(),
                    json_kind(value)
                ),
            )
        };
        match column.kind {
            Kind::Int { min, max } => match value.as_i64() {
                Some(i) if i >= min && i <= max => Ok(Key::Int(i)),
                // Beyond i64 too (a u64): still an integer, so say it is out of range.
                _ if is_integer(value) => Err(BatchError::invalid_because(
                    format!("item {position} has a key out of range"),
                    format!(
                        "{value} does not fit key column \"{}\" of type {}.",
                        column.name, column.type_name
                    ),
                )),
                _ => Err(wrong()),
            },
            Kind::Text => Ok(Key::Text(value.as_str().ok_or_else(wrong)?.to_string())),
            Kind::Uuid => {
                let text = value.as_str().ok_or_else(wrong)?;
                parse_uuid(text).map(Key::Uuid).ok_or_else(|| {
                    BatchError::invalid_because(
                        format!("item {position} has an invalid key"),
                        format!(
                            "Key column \"{}\" is uuid, and \"{text}\" is not a valid uuid.",
                            column.name
                        ),
                    )
                })
            }
            _ => Err(wrong()),
        }
    }

    /// Item `position`'s key as the texts of its columns, for a key PostgreSQL orders
    /// (KeyOrder::Sql), each checked as far as JSON allows: a string or a number, never
    /// null. PostgreSQL reads them as the columns' types when it orders them.
    pub fn parts(
        &self,
        columns: &Columns,
        object: &serde_json::Map<String, Value>,
        position: usize,
    ) -> Result<Vec<String>> {
        self.columns
            .iter()
            .map(|name| {
                let value = object.get(name).ok_or_else(|| no_key(name, position))?;
                columns.check_value(name, value, &format!("item {position}"))?;
                crate::job::rules::columns::scalar_text(value).ok_or_else(|| {
                    BatchError::invalid_because(
                        format!("item {position} has a null key"),
                        format!("Key column \"{name}\" names the row: it cannot be null."),
                    )
                })
            })
            .collect()
    }
}

fn no_key(name: &str, position: usize) -> BatchError {
    BatchError::invalid_because(
        format!("item {position} has no key"),
        format!("It has no field \"{name}\"."),
    )
}

/// A key's value; the derived order is the key's order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// One integer column, ordered by value.
    Int(i64),
    /// One uuid column, ordered by its bytes, as PostgreSQL orders uuids.
    Uuid([u8; 16]),
    /// One text column, in byte order.
    Text(String),
    /// A key PostgreSQL ordered: its rank in that order (equal keys have equal ranks,
    /// whatever their text: 1.0 and 1.00 are one numeric), and its text.
    Ranked { rank: i64, text: Unordered },
    /// A key PostgreSQL is to order, as an item gave it: the texts of its columns.
    Given(Vec<String>),
}

/// A key's text where only its rank orders it.
#[derive(Debug, Clone)]
pub struct Unordered(pub String);

impl PartialEq for Unordered {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Unordered {}
impl PartialOrd for Unordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Unordered {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}
impl std::hash::Hash for Unordered {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl Key {
    /// A key PostgreSQL ordered, at `rank`.
    pub fn ranked(rank: i64, text: String) -> Key {
        Key::Ranked {
            rank,
            text: Unordered(text),
        }
    }

    /// A key as stored (its text form), read back in the key's kind.
    pub fn from_text(order: KeyOrder, text: &str) -> Key {
        match order {
            KeyOrder::Here(Kind::Int { .. }) => text
                .parse()
                .map(Key::Int)
                .unwrap_or_else(|_| Key::Text(text.into())),
            KeyOrder::Here(Kind::Uuid) => parse_uuid(text)
                .map(Key::Uuid)
                .unwrap_or_else(|| Key::Text(text.into())),
            _ => Key::Text(text.into()),
        }
    }

    /// The text of the key's column `i`, as given: a key of several columns is given as
    /// the texts of its parts; any other is one column's.
    pub fn part(&self, i: usize) -> String {
        match self {
            Key::Given(parts) => parts.get(i).cloned().unwrap_or_default(),
            other => other.text(),
        }
    }

    /// The key as PostgreSQL prints it, which is also how it is stored and cast back.
    pub fn text(&self) -> String {
        match self {
            Key::Int(i) => i.to_string(),
            Key::Text(s)
            | Key::Ranked {
                text: Unordered(s), ..
            } => s.clone(),
            Key::Given(parts) => match parts.as_slice() {
                [one] => one.clone(),
                more => serde_json::to_string(more).unwrap_or_default(),
            },
            Key::Uuid(b) => {
                let mut s = String::with_capacity(36);
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        s.push('-');
                    }
                    let _ = write!(s, "{byte:02x}");
                }
                s
            }
        }
    }
}
