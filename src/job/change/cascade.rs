//! Rows of other tables a delete reaches: the foreign keys that reference a job's target
//! ON DELETE CASCADE, SET NULL or SET DEFAULT, and through each CASCADE the keys that
//! reference the table it deletes from, to any depth. PostgreSQL deletes or changes
//! those rows in the same statement as the job's DELETE, where etc_batch keeps only the
//! target's: a purge whose revert brought back every customer and none of their orders.
//! So a job that deletes its rows (a delete, a move, a revert that deletes what a
//! restore put back) is refused at registration while any such key exists, and its
//! drain stops before its first chunk when one was made since.

use crate::error::{BatchError, Result};
use crate::query;
use pgrx::pg_sys;

/// A foreign key through which deleting a row of the job's target deletes or changes
/// rows of another table (or of the target itself, a key that references its own table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reach {
    /// The constraint's name.
    pub(crate) constraint: String,
    /// The referencing table, schema-qualified as regclass prints it.
    pub(crate) table: String,
    /// The table it references.
    pub(crate) references: String,
    /// What its ON DELETE does: CASCADE, SET NULL or SET DEFAULT.
    pub(crate) on_delete: String,
}

/// SQL: every foreign key a DELETE on table $1 reaches, nearest first: those that
/// reference it, then those that reference a table a CASCADE deletes from, a table met
/// again not followed again. A key of a referencing table's partition that it inherits
/// from the partitioned table is the partitioned table's, listed once.
const REACHED: &str = "\
WITH RECURSIVE reach AS (
    SELECT c.oid, c.conrelid, c.confrelid, c.confdeltype, 1 AS depth,
           ARRAY[$1::pg_catalog.oid, c.conrelid] AS seen,
           c.conrelid OPERATOR(pg_catalog.=) $1 AS again
      FROM pg_catalog.pg_constraint c
     WHERE c.contype OPERATOR(pg_catalog.=) 'f' AND c.confrelid OPERATOR(pg_catalog.=) $1
       AND c.confdeltype OPERATOR(pg_catalog.=) ANY ('{c,n,d}'::pg_catalog.\"char\"[])
    UNION ALL
    SELECT c.oid, c.conrelid, c.confrelid, c.confdeltype, r.depth OPERATOR(pg_catalog.+) 1,
           r.seen OPERATOR(pg_catalog.||) c.conrelid,
           c.conrelid OPERATOR(pg_catalog.=) ANY (r.seen)
      FROM reach r JOIN pg_catalog.pg_constraint c ON c.confrelid OPERATOR(pg_catalog.=) r.conrelid
     WHERE NOT r.again AND r.confdeltype OPERATOR(pg_catalog.=) 'c' AND r.depth OPERATOR(pg_catalog.<) 32
       AND c.contype OPERATOR(pg_catalog.=) 'f'
       AND c.confdeltype OPERATOR(pg_catalog.=) ANY ('{c,n,d}'::pg_catalog.\"char\"[]))
SELECT k.conname::pg_catalog.text AS constraint_name,
       r.conrelid::pg_catalog.regclass::pg_catalog.text AS referencing,
       r.confrelid::pg_catalog.regclass::pg_catalog.text AS referenced,
       CASE r.confdeltype WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' ELSE 'SET DEFAULT' END AS on_delete
  FROM (SELECT DISTINCT ON (oid) * FROM reach ORDER BY oid, depth) r
  JOIN pg_catalog.pg_constraint k ON k.oid OPERATOR(pg_catalog.=) r.oid
  JOIN pg_catalog.pg_class t ON t.oid OPERATOR(pg_catalog.=) r.conrelid
 WHERE NOT (t.relispartition AND k.conparentid OPERATOR(pg_catalog.<>) 0)
 ORDER BY r.depth, 2, 1";

/// The foreign keys a DELETE on `table` reaches (REACHED), nearest first.
pub(crate) fn reached(table: pg_sys::Oid) -> Result<Vec<Reach>> {
    query::row_reader! {
        /// A foreign key as REACHED reads it.
        struct Row {
            constraint_name: String = String::new(),
            referencing: String = String::new(),
            referenced: String = String::new(),
            on_delete: String = String::new(),
        }
    }
    query::rows(REACHED, &[table.into()], 0, |r| {
        let row = Row::read(r)?;
        Ok(Reach {
            constraint: row.constraint_name,
            table: row.referencing,
            references: row.referenced,
            on_delete: row.on_delete,
        })
    })
}

/// Refuses a job that deletes rows of `table` (`display`, as the job names it) while a
/// foreign key would delete or change rows of other tables with them.
pub(crate) fn refuse(table: pg_sys::Oid, display: &str) -> Result<()> {
    let reach = reached(table)?;
    if reach.is_empty() {
        return Ok(());
    }
    Err(BatchError::DeleteReachesOtherRows {
        table: display.to_string(),
        detail: detail(&reach),
    })
}

/// The DETAIL that names every key reached, nearest first.
pub(crate) fn detail(reach: &[Reach]) -> String {
    let keys: Vec<String> = reach
        .iter()
        .map(|r| {
            format!(
                "\"{}\" of {} (ON DELETE {}, referencing {})",
                r.constraint, r.table, r.on_delete, r.references
            )
        })
        .collect();
    format!(
        "Deleting its rows would {} through {} {}; etc_batch keeps only the rows the job deletes from its target, so those would be lost to its audit and its revert.",
        match reach.iter().all(|r| r.on_delete == "CASCADE") {
            true => "delete rows of other tables",
            false => "delete or change rows of other tables",
        },
        match reach.len() {
            1 => "the foreign key",
            _ => "the foreign keys",
        },
        keys.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(constraint: &str, table: &str, on_delete: &str) -> Reach {
        Reach {
            constraint: constraint.into(),
            table: table.into(),
            references: "customers".into(),
            on_delete: on_delete.into(),
        }
    }

    #[test]
    fn the_detail_names_every_key_and_what_it_does() {
        let one = detail(&[reach("orders_customer_fkey", "orders", "CASCADE")]);
        assert_eq!(
            one,
            "Deleting its rows would delete rows of other tables through the foreign key \"orders_customer_fkey\" of orders (ON DELETE CASCADE, referencing customers); etc_batch keeps only the rows the job deletes from its target, so those would be lost to its audit and its revert."
        );
        let two = detail(&[
            reach("orders_customer_fkey", "orders", "CASCADE"),
            reach("notes_customer_fkey", "notes", "SET NULL"),
        ]);
        assert!(
            two.starts_with("Deleting its rows would delete or change rows of other tables through the foreign keys \"orders_customer_fkey\" of orders (ON DELETE CASCADE, referencing customers), \"notes_customer_fkey\" of notes (ON DELETE SET NULL"),
            "{two}"
        );
    }
}
