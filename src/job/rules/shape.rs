//! What an approval is checked against: the target's columns and the roles the job
//! gives them, its key, its tenant column if it has one, and its guard. Pure Rust, read
//! from the catalog by `target`.

use crate::error::{BatchError, Result};
use crate::job::rules::columns::{Column, Columns};
use crate::job::rules::guard::Guard;
use crate::job::rules::key::JobKey;
use serde_json::Value;

/// What the approval is checked against: the target's columns and the roles they play.
#[derive(Debug, Clone)]
pub struct Shape {
    pub columns: Columns,
    pub key: JobKey,
    /// The column that scopes the job to one tenant's rows; None: the whole table.
    pub tenant_column: Option<String>,
    pub guard: Guard,
}

impl Shape {
    pub fn column(&self, name: &str) -> Result<&Column> {
        self.columns.column(name)
    }

    /// SQL: the guard value of the target's row `t` (guard.rs, `Guard::now`).
    pub fn guard_now(&self) -> String {
        self.guard.now(&self.columns)
    }

    /// Whether the job's statements print a column of a row as text, under
    /// settings::STABLE_OUTPUT (guard.rs, `Guard::reads_the_row_as_text`).
    pub fn reads_rows_as_text(&self) -> bool {
        self.guard.reads_the_row_as_text(&self.columns)
    }

    /// Checks a value meant for `column` (a guard, an expectation, a value to set)
    /// against what the column accepts.
    pub fn check_value(&self, column: &str, value: &Value, context: &str) -> Result<()> {
        self.columns.check_value(column, value, context)
    }

    /// Checks the roles of the named columns: each its own column, the key's columns
    /// there, the tenant there, and the guard what its kind needs.
    pub fn check_roles(&self) -> Result<()> {
        // One column in two roles would let the job's revision increment change the key,
        // or make the tenant a key.
        let mut roles: Vec<(&str, &str)> = self
            .key
            .columns()
            .iter()
            .map(|c| ("key", c.as_str()))
            .collect();
        roles.extend(self.tenant_column.as_deref().map(|c| ("tenant", c)));
        roles.extend(self.guard.column().map(|c| ("revision", c)));
        for (i, (role, column)) in roles.iter().enumerate() {
            if let Some((other, _)) = roles[i + 1..].iter().find(|(_, c)| c == column) {
                let (what, detail) = if role == other {
                    (
                        format!("column \"{column}\" appears twice in the key"),
                        "Name each column of the key once.",
                    )
                } else {
                    (
                        format!(
                            "column \"{column}\" cannot be both the {role} and the {other} column"
                        ),
                        "The key, tenant and revision columns must be different columns.",
                    )
                };
                return Err(BatchError::invalid_because(what, detail));
            }
        }
        self.key.order(&self.columns)?;
        if let Some(tenant) = &self.tenant_column {
            self.column(tenant)?;
        }
        self.guard.check(&self.columns)
    }

    /// The columns that name and guard an approved row, which a job never sets.
    pub fn roles(&self) -> impl Iterator<Item = &str> {
        self.key
            .columns()
            .iter()
            .map(String::as_str)
            .chain(self.tenant_column.as_deref())
            .chain(self.guard.column())
    }

    /// Whether `field`, of an item or an items query, names the row (a key column) or
    /// its guard value (the revision column), not a guard column.
    pub fn names_the_row(&self, field: &str) -> bool {
        self.key.columns().iter().any(|c| c == field) || self.guard.column() == Some(field)
    }
}

/// The table the unit tests build on: `columns` (name, type), rows of a tenant column
/// `tenant`, named by `id` and guarded by `revision`.
#[cfg(test)]
impl Shape {
    pub(crate) fn of_orders(columns: &[(&str, &str)]) -> Shape {
        Shape {
            columns: columns
                .iter()
                .map(|(name, type_name)| {
                    (
                        name.to_string(),
                        super::columns::Column::of(name, type_name),
                    )
                })
                .collect(),
            key: JobKey::one("id"),
            tenant_column: Some("tenant".into()),
            guard: Guard::Revision {
                column: "revision".into(),
            },
        }
    }
}
