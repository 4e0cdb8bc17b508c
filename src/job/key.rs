//! How an approved item names its row of the target: the job's key. Chosen once from
//! the approval (`JobKey::of`); the approval's items, an items query, the chunk's
//! statements and the frozen list's order each ask it, and never what it is made of.

use super::columns::{is_integer, json_kind, parse_uuid, Columns, Kind};
use crate::error::{BatchError, Result};
use pgrx::spi::quote_identifier;
use serde_json::Value;
use std::fmt::Write as _;

/// The key: one column of the target, of an integer, text or uuid type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKey {
    column: String,
}

impl JobKey {
    pub fn of(key_column: &str) -> JobKey {
        JobKey {
            column: key_column.to_string(),
        }
    }

    /// The key's column, as the approval names it.
    pub fn column(&self) -> &str {
        &self.column
    }

    /// What the key's values are, checked against the target: a type the frozen list can
    /// order as the target's key orders it.
    pub fn kind(&self, columns: &Columns) -> Result<Kind> {
        let key = columns.column(&self.column)?;
        if !matches!(key.kind, Kind::Int { .. } | Kind::Text | Kind::Uuid) {
            return Err(BatchError::Unsupported {
                message: format!("key column \"{}\" has type {}", key.name, key.type_name),
                detail: "Key columns may be smallint, integer, bigint, text, varchar or uuid."
                    .into(),
            });
        }
        Ok(key.kind)
    }

    /// Whether a chunk's rows of the target lie between its first and last key, in the
    /// key's index: then the chunk's statement bounds its scan by them. True for integer
    /// keys, which the frozen list orders by value as the index does.
    pub fn bounds_chunks(&self, columns: &Columns) -> bool {
        matches!(self.kind(columns), Ok(Kind::Int { .. }))
    }

    /// The COLLATE clause an items query orders its keys with, so that they come in the
    /// order a jsonb approval's are frozen in: text by its bytes.
    pub fn order(&self, columns: &Columns) -> Result<&'static str> {
        Ok(match self.kind(columns)? {
            Kind::Text => " COLLATE \"C\"",
            _ => "",
        })
    }

    /// SQL: the target's row `t` is the one the item's key text `item_key` names; `sql_type`
    /// is the key column's type, quoted.
    pub fn matches(&self, item_key: &str, sql_type: &str) -> String {
        format!(
            "t.{} OPERATOR(pg_catalog.=) ({item_key})::{sql_type}",
            quote_identifier(&self.column)
        )
    }

    /// SQL: the chunk's rows lie between parameters `$first` and `$first + 1`, its first
    /// and last key (see bounds_chunks).
    pub fn between(&self, first: usize) -> String {
        let key = quote_identifier(&self.column);
        format!(
            "t.{key} OPERATOR(pg_catalog.>=) ${first} AND t.{key} OPERATOR(pg_catalog.<=) ${}",
            first + 1
        )
    }

    /// Item `position`'s key, given as `value`, in the key's own type.
    pub fn value(&self, columns: &Columns, value: &Value, position: usize) -> Result<Key> {
        let column = columns.column(&self.column)?;
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
            Kind::Uuid => parse_uuid(value.as_str().ok_or_else(wrong)?)
                .map(Key::Uuid)
                .ok_or_else(wrong),
            _ => Err(wrong()),
        }
    }
}

/// A key in the key column's own type; the derived order is that type's order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Int(i64),
    Uuid([u8; 16]),
    Text(String),
}

impl Key {
    /// A key as stored (its text form), read back in the key column's type.
    pub fn from_text(kind: Kind, text: &str) -> Key {
        match kind {
            Kind::Int { .. } => text
                .parse()
                .map(Key::Int)
                .unwrap_or_else(|_| Key::Text(text.into())),
            Kind::Uuid => parse_uuid(text)
                .map(Key::Uuid)
                .unwrap_or_else(|| Key::Text(text.into())),
            _ => Key::Text(text.into()),
        }
    }

    /// The key as PostgreSQL prints it, which is also how it is stored and cast back.
    pub fn text(&self) -> String {
        match self {
            Key::Int(i) => i.to_string(),
            Key::Text(s) => s.clone(),
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
