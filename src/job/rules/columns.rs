//! The target table's columns as a job sees them: what each accepts, as far as a JSON
//! value can be checked without a database, and the roles (key, tenant, revision) the
//! values a job gives them. Pure Rust, read from the catalog by `target`.

use crate::error::{BatchError, Result};
use serde_json::Value;
use std::collections::HashMap;

/// What a column accepts, as far as a JSON value can be checked without a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int {
        min: i64,
        max: i64,
    },
    Numeric,
    Text,
    Bool,
    Uuid,
    /// Anything else (dates, enums, ...): a string or a number, checked by a cast in SQL.
    Other,
}

impl Kind {
    pub fn for_type(type_name: &str) -> Kind {
        match type_name {
            "int2" => Kind::Int {
                min: i16::MIN as i64,
                max: i16::MAX as i64,
            },
            "int4" => Kind::Int {
                min: i32::MIN as i64,
                max: i32::MAX as i64,
            },
            "int8" => Kind::Int {
                min: i64::MIN,
                max: i64::MAX,
            },
            "numeric" | "float4" | "float8" => Kind::Numeric,
            "text" | "varchar" | "bpchar" | "name" | "citext" => Kind::Text,
            "bool" => Kind::Bool,
            "uuid" => Kind::Uuid,
            _ => Kind::Other,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Kind::Int { .. } => "an integer",
            Kind::Numeric => "a number",
            Kind::Text => "a string",
            Kind::Bool => "true or false",
            Kind::Uuid => "a uuid string",
            Kind::Other => "a string or a number",
        }
    }
}

/// A column of the target table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    /// Its type's name, a domain's base type's (`int4`, `text`, `numeric`).
    pub type_name: String,
    pub kind: Kind,
    /// Its declared type, schema-qualified and quoted, for casts.
    pub sql_type: String,
    pub type_oid: pgrx::pg_sys::Oid,
    /// Of a type that sorts by a collation.
    pub collatable: bool,
    /// Under the "C" or "POSIX" collation, whose order is the bytes'.
    pub byte_ordered: bool,
    /// A generated column, which only PostgreSQL writes.
    pub generated: bool,
    /// Declared NOT NULL: a job never sets it to null.
    pub not_null: bool,
    /// Its place among the table's columns, from 0.
    pub position: usize,
    /// How a row's digest hashes it (guard.rs).
    pub hash: HashBy,
}

/// How a row's digest hashes a column's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashBy {
    /// By its type's extended hash function (schema-qualified and quoted), called on the
    /// value as it is: the function takes the column's type, or one the value is
    /// binary-coercible to, or any type.
    Function(String),
    /// By its type's extended hash function, through hash_record_extended of a row of
    /// the one value: the function takes a type the value is not cast to without a
    /// conversion (timestamptz's takes timestamp).
    Record,
    /// By its text: the type has no extended hash function (json, the geometric types).
    Text,
}

impl Column {
    /// A column of type `type_name` (a base type's name), of a plain table: what tests
    /// of the rules need of one.
    pub fn of(name: &str, type_name: &str) -> Column {
        let kind = Kind::for_type(type_name);
        Column {
            name: name.to_string(),
            type_name: type_name.to_string(),
            kind,
            sql_type: format!("pg_catalog.{type_name}"),
            type_oid: pgrx::pg_sys::Oid::INVALID,
            collatable: kind == Kind::Text,
            byte_ordered: false,
            generated: false,
            not_null: false,
            position: 0,
            hash: HashBy::Function("pg_catalog.hashtextextended".into()),
        }
    }
}

/// The target's columns, by name.
#[derive(Debug, Clone, Default)]
pub struct Columns(HashMap<String, Column>);

impl FromIterator<(String, Column)> for Columns {
    fn from_iter<I: IntoIterator<Item = (String, Column)>>(columns: I) -> Columns {
        Columns(columns.into_iter().collect())
    }
}

impl std::ops::Deref for Columns {
    type Target = HashMap<String, Column>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Columns {
    /// The columns in the table's order.
    pub fn in_order(&self) -> impl Iterator<Item = &Column> {
        let mut columns: Vec<&Column> = self.0.values().collect();
        columns.sort_by_key(|c| c.position);
        columns.into_iter()
    }

    pub fn column(&self, name: &str) -> Result<&Column> {
        self.0.get(name).ok_or_else(|| BatchError::UndefinedColumn {
            column: name.to_string(),
            named_by: None,
            default: None,
        })
    }

    /// The column `name`, which `named_by` (set_values, expect, an item) names.
    pub fn named_in(&self, name: &str, named_by: &str) -> Result<&Column> {
        self.column(name).map_err(|e| match e {
            BatchError::UndefinedColumn {
                column, default, ..
            } => BatchError::UndefinedColumn {
                column,
                named_by: Some(named_by.to_string()),
                default,
            },
            other => other,
        })
    }

    /// Checks a value meant for `column` (a guard, an expectation, a value to set)
    /// against what the column accepts.
    pub fn check_value(&self, column: &str, value: &Value, context: &str) -> Result<()> {
        let column = self.named_in(column, context)?;
        let ok = match (column.kind, value) {
            (_, Value::Null) => true,
            (Kind::Int { min, max }, v) => v.as_i64().is_some_and(|i| i >= min && i <= max),
            (Kind::Numeric, Value::Number(_)) => true,
            (Kind::Text, Value::String(_)) => true,
            (Kind::Bool, Value::Bool(_)) => true,
            (Kind::Uuid, Value::String(s)) => parse_uuid(s).is_some(),
            (Kind::Other, Value::String(_) | Value::Number(_)) => true,
            _ => false,
        };
        if !ok && matches!(column.kind, Kind::Int { .. }) && is_integer(value) {
            return Err(BatchError::invalid_because(
                format!(
                    "{context} has a value out of range for column \"{}\"",
                    column.name
                ),
                format!(
                    "{value} does not fit column \"{}\" of type {}.",
                    column.name, column.type_name
                ),
            ));
        }
        if let (false, Kind::Uuid, Value::String(text)) = (ok, column.kind, value) {
            return Err(BatchError::invalid_because(
                format!(
                    "{context} has an invalid value for column \"{}\"",
                    column.name
                ),
                format!("\"{text}\" is not a valid uuid."),
            ));
        }
        if !ok {
            return Err(BatchError::invalid_because(
                format!(
                    "{context} has a value of the wrong type for column \"{}\"",
                    column.name
                ),
                format!(
                    "Column \"{}\" is {}, so the value must be {}, not {}.",
                    column.name,
                    column.type_name,
                    column.kind.describe(),
                    json_kind(value)
                ),
            ));
        }
        Ok(())
    }
}

/// A scalar as a column reads it from text (as `->>` reads it out of jsonb), None for a
/// JSON null.
pub fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

pub fn is_integer(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses a uuid the way PostgreSQL's uuid_in accepts it in its usual forms.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let s = s
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or(s);
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}
