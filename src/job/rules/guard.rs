//! How a job recognises that an approved item's row is still the row that was approved:
//! its guard. The guard is one of the job's terms, chosen once from the approval
//! (`Guard::of`); the statements of a chunk, the items a registration reads, a conflict's
//! description and the report each ask it, and never which kind it is.
//!
//! Whatever the kind, an item may also name guard columns (values its row must still
//! hold), and the job may expect values of every row (`expect`).
//!
//! An approved item keeps one number for its guard, its "revision": the revision the
//! operator saw, or the digest of the row taken at registration; and the audit keeps the
//! one the change left. A guard of named columns keeps none.

use crate::error::{BatchError, Result};
use crate::job::rules::columns::{Columns, HashBy, Kind};
use pgrx::spi::quote_identifier;

/// The kinds of guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// An integer column the application increments with every change of the row: an
    /// item is approved at a revision, matches while the row has it, and the job's change
    /// increments it too.
    Revision { column: String },
    /// A digest of every column of the row, taken when the job is registered: a row
    /// matches while no column of it has changed.
    Row,
    /// Only the guard columns the items name and the values `expect` names.
    Columns,
}

impl Guard {
    /// The guard an approval asks for: `kind` (revision, row or columns), or, when it
    /// names none, the revision column if there is one and the row's digest if not.
    pub fn of(revision_column: Option<&str>, kind: Option<&str>) -> Result<Guard> {
        match (kind, revision_column) {
            (None | Some("revision"), Some(column)) => Ok(Guard::Revision {
                column: column.to_string(),
            }),
            (Some("revision"), None) => Err(BatchError::invalid_because(
                "guard \"revision\" needs a revision column",
                "Name the column with revision_column, or guard the rows by guard => 'row' or guard => 'columns'.",
            )),
            (None | Some("row"), _) => Ok(Guard::Row),
            (Some("columns"), _) => Ok(Guard::Columns),
            (Some(other), _) => Err(BatchError::invalid_because(
                format!("unknown guard \"{other}\""),
                "A job's rows are guarded by their revision column (guard => 'revision'), a digest of the row (guard => 'row') or the columns the approval names (guard => 'columns').",
            )),
        }
    }

    /// The guard as the job's row keeps it: its kind, and its revision column.
    pub fn stored(kind: &str, revision_column: Option<&str>) -> Guard {
        match (kind, revision_column) {
            ("row", _) => Guard::Row,
            ("columns", _) => Guard::Columns,
            (_, column) => Guard::Revision {
                column: column.unwrap_or_default().to_string(),
            },
        }
    }

    /// Its kind, as the job's row keeps it.
    pub fn kind(&self) -> &'static str {
        match self {
            Guard::Revision { .. } => "revision",
            Guard::Row => "row",
            Guard::Columns => "columns",
        }
    }

    /// The target's column the guard reads and the job's change increments, if any.
    pub fn column(&self) -> Option<&str> {
        match self {
            Guard::Revision { column } => Some(column),
            Guard::Row | Guard::Columns => None,
        }
    }

    /// How messages name the guard value an item keeps: "revision", or "row digest".
    pub fn value_name(&self) -> &'static str {
        match self {
            Guard::Revision { .. } => "revision",
            Guard::Row => "row digest",
            Guard::Columns => "guard",
        }
    }

    /// Checks the guard against the target's columns.
    pub fn check(&self, columns: &Columns) -> Result<()> {
        let Guard::Revision { column } = self else {
            return Ok(());
        };
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

    /// Whether an item's revision `value` fits the target's revision column.
    pub fn accepts(&self, columns: &Columns, value: i64) -> bool {
        match self {
            Guard::Revision { column } => columns.get(column).is_some_and(
                |c| matches!(c.kind, Kind::Int { min, max } if value >= min && value <= max),
            ),
            Guard::Row | Guard::Columns => true,
        }
    }

    /// Whether an item keeps a digest of its row, which only PostgreSQL can take.
    pub fn is_digest(&self) -> bool {
        matches!(self, Guard::Row)
    }

    /// Whether the guard's SQL prints a column of the row as text (one whose type has no
    /// hash function), which must then print the same way in every session
    /// (settings::STABLE_OUTPUT).
    pub fn reads_the_row_as_text(&self, columns: &Columns) -> bool {
        self.is_digest() && columns.values().any(|c| c.hash == HashBy::Text)
    }

    /// SQL: the target's row `t` is at the state item `it` was approved at
    /// (`it.revision`), or None when only guard columns and expectations say so.
    pub fn matches(&self, columns: &Columns) -> Option<String> {
        match self {
            Guard::Revision { .. } | Guard::Row => Some(format!(
                "{} OPERATOR(pg_catalog.=) it.revision",
                self.now(columns)
            )),
            Guard::Columns => None,
        }
    }

    /// SQL: the assignments the job's change adds to its own.
    pub fn assignments(&self) -> Vec<String> {
        match self {
            Guard::Revision { column } => {
                let col = quote_identifier(column);
                vec![format!("{col} = t.{col} OPERATOR(pg_catalog.+) 1")]
            }
            Guard::Row | Guard::Columns => Vec::new(),
        }
    }

    /// SQL: the guard value of the target's row `t` as it is (after the change, in a
    /// RETURNING list), as a bigint: what an item keeps and the audit keeps as the state
    /// the change left.
    pub fn now(&self, columns: &Columns) -> String {
        match self {
            Guard::Revision { column } => {
                format!("t.{}::pg_catalog.int8", quote_identifier(column))
            }
            Guard::Row => digest(columns),
            Guard::Columns => "NULL::pg_catalog.int8".into(),
        }
    }
}

/// SQL: the digest of the target's row `t`: its columns' hashes, each by its type's own
/// extended hash function, which hashes equal values alike (a numeric 1.0 and 1.00, a
/// timestamptz in any time zone), or, for a type that has none (json, the geometric
/// types), by its text; each seeded with its column's place in the table, so that
/// values moved from one column to another change it, and XORed together. A NULL is
/// its seed. No text of a value is made where a hash function exists, and no row is
/// built: a third of what hashing the row as a record costs, a sixth of hashing its text.
fn digest(columns: &Columns) -> String {
    let mut in_order: Vec<_> = columns.values().collect();
    in_order.sort_by_key(|c| c.position);
    let hashes: Vec<String> = in_order
        .iter()
        .map(|c| {
            let column = format!("t.{}", quote_identifier(&c.name));
            let seed = c.position + 1;
            let hash = match &c.hash {
                HashBy::Function(function) => format!("{function}({column}, {seed})"),
                HashBy::Record => format!("pg_catalog.hash_record_extended(ROW({column}), {seed})"),
                HashBy::Text => {
                    format!("pg_catalog.hashtextextended({column}::pg_catalog.text, {seed})")
                }
            };
            format!("COALESCE({hash}, {seed})")
        })
        .collect();
    format!("({})", hashes.join(" OPERATOR(pg_catalog.#) "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_approval_chooses_the_guard() {
        assert_eq!(
            Guard::of(Some("revision"), None),
            Ok(Guard::Revision {
                column: "revision".into()
            })
        );
        assert_eq!(Guard::of(None, None), Ok(Guard::Row));
        assert_eq!(Guard::of(Some("revision"), Some("row")), Ok(Guard::Row));
        assert_eq!(Guard::of(None, Some("columns")), Ok(Guard::Columns));
        assert!(Guard::of(None, Some("revision")).is_err());
        assert!(Guard::of(None, Some("digest")).is_err());
        for guard in [
            Guard::Row,
            Guard::Columns,
            Guard::of(Some("v"), None).unwrap(),
        ] {
            assert_eq!(Guard::stored(guard.kind(), guard.column()), guard);
        }
    }
}
