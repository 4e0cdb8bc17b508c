//! What an approval is checked against: the target's columns and the roles the job
//! gives them, its key, its tenant column and its guard. Pure Rust, read from the
//! catalog by `target`.

use super::columns::{Column, Columns};
use super::guard::Guard;
use super::key::JobKey;
use crate::error::{BatchError, Result};
use serde_json::Value;

/// What the approval is checked against: the target's columns and the roles they play.
#[derive(Debug, Clone)]
pub struct Shape {
    pub columns: Columns,
    pub key: JobKey,
    pub tenant_column: String,
    pub guard: Guard,
}

impl Shape {
    pub fn column(&self, name: &str) -> Result<&Column> {
        self.columns.column(name)
    }

    /// Checks a value meant for `column` (a guard, an expectation, a value to set)
    /// against what the column accepts.
    pub fn check_value(&self, column: &str, value: &Value, context: &str) -> Result<()> {
        self.columns.check_value(column, value, context)
    }

    /// Checks the roles of the named columns: each its own column, the key of a type the
    /// frozen list can order, the tenant there, and the guard what its kind needs.
    pub fn check_roles(&self) -> Result<()> {
        // One column in two roles would let the job's revision increment change the key,
        // or make the tenant a key.
        let roles = [
            ("key", Some(self.key.column())),
            ("tenant", Some(self.tenant_column.as_str())),
            ("revision", self.guard.column()),
        ];
        for (i, (role, column)) in roles.iter().enumerate() {
            let Some(column) = column else { continue };
            if let Some((other, _)) = roles[i + 1..].iter().find(|(_, c)| c == &Some(*column)) {
                return Err(BatchError::invalid_because(
                    format!("column \"{column}\" cannot be both the {role} and the {other} column"),
                    "The key, tenant and revision columns must be three different columns.",
                ));
            }
        }
        self.key.kind(&self.columns)?;
        self.column(&self.tenant_column)?;
        self.guard.check(&self.columns)
    }

    /// The columns that name and guard an approved row, which a job never sets.
    pub fn roles(&self) -> impl Iterator<Item = &str> {
        [
            Some(self.key.column()),
            Some(self.tenant_column.as_str()),
            self.guard.column(),
        ]
        .into_iter()
        .flatten()
    }
}
