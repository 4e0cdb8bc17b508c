//! register_job_from_query's `items_query`: one SELECT whose rows are the approved
//! items, checked before it runs, then read through a cursor in key order.
//!
//! Its columns are named like the fields of register_job's item objects: the key
//! column, the revision column, and every other column a guard. Each must be a column of
//! the target, of a type that can be assigned to it (as INSERT would take it); the
//! values are cast to the target's types as the chunk's statement casts them, and sorted
//! by key in the key's own type (text keys in byte order).

use crate::error::{capitalize, BatchError, Result};
use crate::job::rules::columns::Kind;
use crate::job::rules::key::KeyOrder;
use crate::job::target::Target;
use crate::parse::{self, Kind as Statement};
use crate::query::{self, ResultColumn};
use pgrx::pg_sys;
use pgrx::spi::quote_literal;

/// The checked query, and the statements that read it.
pub struct ItemsQuery {
    /// The query, as given.
    statement: String,
    /// For each column of the key, the query's value cast to the key column's type.
    key_parts: Vec<String>,
    /// The revision, as a bigint (0 for a job guarded otherwise).
    revision: String,
    /// The guard columns, as a jsonb object.
    guards: String,
    /// How ordered_sql orders a key of text: by its bytes, as a jsonb approval's are.
    collate: &'static str,
    pub guard_columns: Vec<String>,
}

impl ItemsQuery {
    pub fn plan(target: &Target, items_query: &str) -> Result<ItemsQuery> {
        let statement = single_select(items_query)?;
        // Runs the query's planning and permission checks as the registering role, and
        // fetches nothing: a role that may not read what it names fails here, with 42501.
        let columns = query::describe(&format!("SELECT * FROM (\n{statement}\n) q LIMIT 0"))?;
        let shape = &target.shape;
        let mut guard_columns = Vec::new();
        for (i, c) in columns.iter().enumerate() {
            if columns[..i].iter().any(|o| o.name == c.name) {
                return Err(BatchError::invalid_because(
                    format!("items_query returns column \"{}\" more than once", c.name),
                    "Each column of the items query names one field of the items.",
                ));
            }
            if Some(c.name.as_str()) == shape.tenant_column.as_deref() {
                return Err(BatchError::invalid_because(
                    format!("items_query returns the tenant column \"{}\"", c.name),
                    "The tenant is given once for the whole job, not per item.",
                ));
            }
            let column = shape.column(&c.name)?;
            if !fits(c, column.type_oid) {
                return Err(BatchError::TypeMismatch {
                    message: format!(
                        "column \"{}\" of items_query has type {}, which does not fit column \"{}\" of type {}",
                        c.name,
                        type_name(c.type_oid)?,
                        c.name,
                        column.type_name
                    ),
                    detail: "A value of the items query must be one INSERT would take for the column; cast it in the query.".into(),
                });
            }
            if !shape.names_the_row(&c.name) {
                guard_columns.push(c.name.clone());
            }
        }
        let mut needed: Vec<(&str, &str)> = shape
            .key
            .columns()
            .iter()
            .map(|k| ("key", k.as_str()))
            .collect();
        needed.extend(shape.guard.column().map(|r| ("revision", r)));
        for (role, name) in needed {
            if !columns.iter().any(|c| c.name == name) {
                return Err(BatchError::invalid_because(
                    format!("items_query returns no {role} column \"{name}\""),
                    "Its columns are named like the fields of register_job's items: the key's columns, the revision column if the job has one, and any guard columns.",
                ));
            }
        }
        let col = |name: &str| format!("q.{}", pgrx::spi::quote_identifier(name));
        let cast = |name: &str| format!("CAST({} AS {})", col(name), shape.columns[name].sql_type);
        let guards = if guard_columns.is_empty() {
            "'{}'::pg_catalog.jsonb".to_string()
        } else {
            format!(
                "pg_catalog.jsonb_build_object({})",
                guard_columns
                    .iter()
                    .map(|g| format!("{}, {}", quote_literal(g), cast(g)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Ok(ItemsQuery {
            statement,
            key_parts: shape.key.columns().iter().map(|k| cast(k)).collect(),
            // in the column's own type first: a revision the column cannot hold fails
            revision: match shape.guard.column() {
                Some(r) => format!("CAST({} AS pg_catalog.int8)", cast(r)),
                None => "0::pg_catalog.int8".into(),
            },
            guards,
            collate: match shape.key.order(&shape.columns)? {
                KeyOrder::Here(Kind::Text) => " COLLATE \"C\"",
                _ => "",
            },
            guard_columns,
        })
    }

    /// The items in key order, for a key the library orders: (key, revision, guards), the
    /// key as text, in the order a jsonb approval's are frozen (text by its bytes).
    pub fn ordered_sql(&self) -> String {
        let collate = self.collate;
        format!(
            "SELECT s.k::pg_catalog.text AS item_key, s.r AS revision, s.g::pg_catalog.text AS guards\n  FROM (SELECT {} AS k, {} AS r, {} AS g\n          FROM (\n{}\n) q) s\n ORDER BY s.k{collate}",
            self.key_parts[0], self.revision, self.guards, self.statement,
        )
    }

    /// The items as they come: (key, revision, guards), the key as the text of its one
    /// column or a JSON array of its columns' texts, the guards as jsonb, for PostgreSQL
    /// to order (ordered.rs): never printed, only to be read back, as they are combined
    /// with what registration records.
    pub fn rows_sql(&self) -> String {
        let parts: Vec<String> = self
            .key_parts
            .iter()
            .map(|p| format!("({p})::pg_catalog.text"))
            .collect();
        let key = match parts.as_slice() {
            [one] => one.clone(),
            more => format!(
                "pg_catalog.jsonb_build_array({})::pg_catalog.text",
                more.join(", ")
            ),
        };
        format!(
            "SELECT {key}, {}, {}\n  FROM (\n{}\n) q",
            self.revision, self.guards, self.statement,
        )
    }
}

/// Whether a column of the query can be assigned to a column of type `to`.
fn fits(column: &ResultColumn, to: pg_sys::Oid) -> bool {
    // SAFETY: can_coerce_type only reads the catalogs.
    unsafe {
        pg_sys::can_coerce_type(
            1,
            &column.type_oid,
            &to,
            pg_sys::CoercionContext::COERCION_ASSIGNMENT,
        )
    }
}

fn type_name(oid: pg_sys::Oid) -> Result<String> {
    Ok(
        query::one::<String>("SELECT pg_catalog.format_type($1, NULL)", &[oid.into()])?
            .unwrap_or_default(),
    )
}

/// The text of the one SELECT `items_query` holds, or why it is not one. Parsed only, so
/// that a syntax error can name the argument.
fn single_select(items_query: &str) -> Result<String> {
    let refuse =
        |detail: &str| BatchError::invalid_because("items_query must be a single SELECT", detail);
    if items_query.contains('\0') {
        return Err(refuse("It contains a zero byte."));
    }
    let statements = parse::statements(items_query).map_err(|failure| BatchError::Syntax {
        what: "items_query",
        detail: format!("{}.", capitalize(&failure.message)),
    })?;
    let statement = match statements.as_slice() {
        [] => return Err(refuse("It contains no statement.")),
        [one] => one,
        more => return Err(refuse(&format!("It contains {} statements.", more.len()))),
    };
    match statement.kind {
        Statement::Select {
            into: false,
            modifying_with: false,
        } => {}
        Statement::Select { into: true, .. } => {
            return Err(refuse("It is SELECT INTO, which creates a table."))
        }
        Statement::Select { .. } => {
            return Err(refuse("Its WITH clause holds a data-modifying statement."))
        }
        _ => return Err(refuse("It is not a SELECT.")),
    }
    let bytes = items_query.as_bytes();
    let start = statement.location.max(0) as usize;
    let end = if statement.len > 0 {
        start + statement.len as usize
    } else {
        bytes.len()
    };
    Ok(String::from_utf8_lossy(&bytes[start.min(bytes.len())..end.min(bytes.len())]).into_owned())
}
