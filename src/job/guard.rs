//! How a job recognises that an approved item's row is still the row that was approved:
//! its guard. The guard is one of the job's terms, chosen once from the approval
//! (`Guard::of`); the statements of a chunk, the items a registration reads, a conflict's
//! description and the report each ask it, and never which kind it is.
//!
//! Besides the guard, an item may name guard columns (values its row must still hold),
//! and the job may expect values of every row (`expect`); those are the same for every
//! kind of guard.

use super::columns::{Columns, Kind};
use crate::error::{BatchError, Result};
use pgrx::spi::quote_identifier;

/// The kinds of guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// An integer column the application increments with every change of the row: an
    /// item is approved at a revision, matches while the row has it, and the job's change
    /// increments it too.
    Revision { column: String },
}

impl Guard {
    /// The guard an approval names: by its revision column.
    pub fn of(revision_column: &str) -> Guard {
        Guard::Revision {
            column: revision_column.to_string(),
        }
    }

    /// The target's column the guard reads, if it is one.
    pub fn column(&self) -> Option<&str> {
        match self {
            Guard::Revision { column } => Some(column),
        }
    }

    /// What an approved item's guard value is called, in messages and in items: the
    /// field of an item (and the column of an items query) that gives it.
    pub fn field(&self) -> &str {
        match self {
            Guard::Revision { column } => column,
        }
    }

    /// Checks the guard against the target's columns.
    pub fn check(&self, columns: &Columns) -> Result<()> {
        match self {
            Guard::Revision { column } => {
                let revision = columns.column(column)?;
                if !matches!(revision.kind, Kind::Int { .. }) {
                    return Err(BatchError::invalid_because(
                        format!(
                            "revision column \"{}\" must be an integer column",
                            revision.name
                        ),
                        format!("It has type {}.", revision.type_name),
                    ));
                }
                Ok(())
            }
        }
    }

    /// Whether an item's guard value `value` fits the target's column.
    pub fn accepts(&self, columns: &Columns, value: i64) -> bool {
        match self {
            Guard::Revision { column } => columns.get(column).is_some_and(
                |c| matches!(c.kind, Kind::Int { min, max } if value >= min && value <= max),
            ),
        }
    }

    /// SQL: the target's row `t` is at the state item `it` was approved at
    /// (`it.revision`).
    pub fn matches(&self) -> String {
        match self {
            Guard::Revision { column } => {
                format!(
                    "t.{} OPERATOR(pg_catalog.=) it.revision",
                    quote_identifier(column)
                )
            }
        }
    }

    /// SQL: the assignments the job's change adds to its own.
    pub fn assignments(&self) -> Vec<String> {
        match self {
            Guard::Revision { column } => {
                let col = quote_identifier(column);
                vec![format!("{col} = t.{col} OPERATOR(pg_catalog.+) 1")]
            }
        }
    }

    /// SQL: the guard value of the target's row `t` as it is (after the change, in a
    /// RETURNING list), as a bigint: what the audit keeps as the state the change left.
    pub fn now(&self) -> String {
        match self {
            Guard::Revision { column } => {
                format!("t.{}::pg_catalog.int8", quote_identifier(column))
            }
        }
    }
}
