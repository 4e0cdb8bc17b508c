//! Targets Citus distributes by the hash of a column: which part of a job's key holds
//! that column, the order registration freezes the items in (by shard, a node's shards
//! after each other, then by key, so that a chunk's items lie in one shard), and the
//! values a chunk's statement binds so that Citus sends it to the shards of its items
//! only.
//!
//! A chunk of items in one shard is a statement on one worker, whose transaction Citus
//! commits there with etc_batch's audit and checkpoint on the coordinator, in one
//! two-phase commit. A chunk of keys in key order lies in every shard: its statement
//! runs on every worker, each a participant of the commit.
//!
//! Citus is found by its catalog, pg_dist_partition, whose absence means no table is
//! distributed: nothing here is called on a database without Citus but that lookup.
//! Reference tables and Citus's local tables are not distributed by a column: jobs on
//! them run as on any table.

use crate::error::{BatchError, Result};
use crate::job::rules::shape::Shape;
use crate::query;
use pgrx::pg_sys;
use pgrx::spi::quote_identifier;

/// Whether Citus's catalog exists in this database.
const CITUS_CATALOG: &str =
    "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL";

/// The column a table is distributed by the hash of, if it is. $1 the table.
const DISTRIBUTION_COLUMN: &str = "\
SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)::pg_catalog.text
  FROM pg_catalog.pg_dist_partition p
 WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1
   AND p.partmethod OPERATOR(pg_catalog.=) 'h'";

/// A target distributed by the hash of `column`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distributed {
    pub table: pg_sys::Oid,
    pub column: String,
    /// Where each item's value of the column is.
    pub by: ValueIn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueIn {
    /// Part `i` of the key: items of one key lie in one shard, items of a job in many.
    Key(usize),
    /// The tenant column: every item of the job lies in the tenant's one shard, and the
    /// statement's tenant condition already says which.
    Tenant,
}

/// Whether Citus is installed in this database.
pub fn citus_here() -> Result<bool> {
    Ok(query::one::<bool>(CITUS_CATALOG, &[])? == Some(true))
}

/// The column `table` is distributed by, when Citus distributes it by hash.
pub fn distribution_column(table: pg_sys::Oid) -> Result<Option<String>> {
    if !citus_here()? {
        return Ok(None);
    }
    query::one::<String>(DISTRIBUTION_COLUMN, &[table.into()])
}

/// The greatest value `sql` (one bigint) has on Citus's workers, run on each through
/// run_command_on_workers as the current role; None in a database without Citus, or
/// where no worker answered (a worker that cannot be reached fails the chunks sent to
/// it, and says so there).
pub fn greatest_on_workers(sql: &str) -> Result<Option<i64>> {
    if !citus_here()? {
        return Ok(None);
    }
    query::one::<i64>(ON_WORKERS, &[sql.into()])
}

/// The shards of table $1, node by node (its first placement's group), each node's in
/// the order of their ids.
const SHARDS_BY_NODE: &str = "\
SELECT pg_catalog.array_agg(x.shardid ORDER BY x.node, x.shardid)
  FROM (SELECT s.shardid, pg_catalog.min(p.groupid) AS node
          FROM pg_catalog.pg_dist_shard s
          JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid
         WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1
         GROUP BY s.shardid) x";

/// $1 run on every worker, the greatest of the bigints they return.
const ON_WORKERS: &str = "\
SELECT pg_catalog.max(w.result::pg_catalog.int8)
  FROM pg_catalog.run_command_on_workers($1) w
 WHERE w.success";

impl Distributed {
    /// How a target of `shape`, distributed by `column`, places a job's items. Every
    /// unique index of a distributed table includes its distribution column, so a key
    /// that names one row (with its tenant) names it too; refused here all the same,
    /// saying why, before the unique-key check would say less.
    pub fn of(table: pg_sys::Oid, display: &str, column: String, shape: &Shape) -> Result<Self> {
        let by = if let Some(i) = shape.key.columns().iter().position(|c| *c == column) {
            ValueIn::Key(i)
        } else if shape.tenant_column.as_deref() == Some(column.as_str()) {
            ValueIn::Tenant
        } else {
            return Err(BatchError::invalid_because(
                format!(
                    "target \"{display}\" is distributed by column \"{column}\", which is not in the job's key ({})",
                    shape.key.columns().join(", ")
                ),
                "Citus places each row by its distribution column: a job finds each item's rows, and chunks them by shard, by that column's value in the item's key (or the tenant column).",
            ));
        };
        Ok(Distributed { table, column, by })
    }

    /// SQL: where the item whose key text is `k` goes in a registration's order, before
    /// its key: the place of its shard among the table's shards taken node by node (a
    /// shard's first node, by group), so that a node's shards follow each other. Then a
    /// chunk across two shards most often has both on one worker, and a parallel job's
    /// drainers, which start spread over the list (run/claim.rs), start on different
    /// workers. None when every item of the job lies in one shard.
    pub fn shard_of(&self, shape: &Shape, k: &str) -> Result<Option<String>> {
        let ValueIn::Key(i) = self.by else {
            return Ok(None);
        };
        let shards =
            query::one::<Vec<i64>>(SHARDS_BY_NODE, &[self.table.into()])?.unwrap_or_default();
        let column = &shape.columns[&self.column];
        Ok(Some(format!(
            "pg_catalog.array_position('{{{}}}'::pg_catalog.int8[], \
             pg_catalog.get_shard_id_for_distribution_column({}::pg_catalog.oid::pg_catalog.regclass, {}))",
            shards.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
            self.table.to_u32(),
            shape.key.typed_part(k, i, &column.sql_type)
        )))
    }

    /// The job's chunks by shard, written on its row at registration (job.shards) for
    /// job_progress's chunks_per_node: each shard's first and last chunk, in chunk
    /// order, a chunk across shards under each. Read from the frozen list `items` (a
    /// job's item partition), as the owner: the shards of each chunk's first and last
    /// item, and of every item only in the few chunks where those two differ (items lie
    /// in shard order). $1 the job.
    pub fn shards_sql(&self, key_columns: usize, items: &str) -> Option<String> {
        let ValueIn::Key(i) = self.by else {
            return None;
        };
        let shard = |key: &str| {
            let value = match key_columns {
                1 => key.to_string(),
                _ => format!("({key}::pg_catalog.jsonb OPERATOR(pg_catalog.->>) {i})"),
            };
            format!(
                "pg_catalog.get_shard_id_for_distribution_column({}::pg_catalog.oid::pg_catalog.regclass, {value})",
                self.table.to_u32()
            )
        };
        Some(format!(
            "WITH c AS (\n\
               SELECT c.first_position OPERATOR(pg_catalog./) j.chunk_size OPERATOR(pg_catalog.+) 1 AS chunk, c.keys,\n\
                      {first} AS first_shard, {last} AS last_shard\n\
                 FROM etc_batch.{items} c, etc_batch.job j WHERE j.job_id OPERATOR(pg_catalog.=) $1),\n\
             s AS (\n\
               SELECT x.shard, pg_catalog.min(x.chunk) AS first_chunk, pg_catalog.max(x.chunk) AS last_chunk\n\
                 FROM (SELECT c.chunk, c.first_shard AS shard FROM c\n\
                       UNION SELECT c.chunk, c.last_shard FROM c\n\
                       UNION SELECT c.chunk, {each} FROM c, pg_catalog.unnest(c.keys) AS k(key)\n\
                              WHERE c.first_shard OPERATOR(pg_catalog.<>) c.last_shard) x\n\
                GROUP BY x.shard)\n\
             UPDATE etc_batch.job j SET shards = (\n\
               SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('shard', s.shard, \
                      'first_chunk', s.first_chunk, 'last_chunk', s.last_chunk) ORDER BY s.first_chunk, s.shard)\n\
                 FROM s)\n\
             WHERE j.job_id OPERATOR(pg_catalog.=) $1",
            first = shard("c.keys[1]"),
            last = shard("c.keys[pg_catalog.cardinality(c.keys)]"),
            each = shard("k.key"),
        ))
    }

    /// SQL: the condition that sends a chunk's statement to the shards of its items: the
    /// row's distribution value is one of those bound as `$param` (text[]; NULL, which
    /// sends it everywhere, when they could not be read). Citus evaluates the bound
    /// values before it picks the shards. None: the tenant's condition does it.
    pub fn prunes(&self, shape: &Shape, param: usize) -> Option<String> {
        let ValueIn::Key(_) = self.by else {
            return None;
        };
        let column = &shape.columns[&self.column];
        Some(format!(
            "(${param}::pg_catalog.text[] IS NULL OR t.{} OPERATOR(pg_catalog.=) ANY (${param}::pg_catalog.text[]::{}[]))",
            quote_identifier(&self.column),
            column.sql_type
        ))
    }

    /// Whether a job's items lie in many shards: frozen by shard (`shard_of`), each
    /// chunk binding its distribution values (`prunes`).
    pub fn spans_shards(&self) -> bool {
        matches!(self.by, ValueIn::Key(_))
    }

    /// The distinct distribution values of a chunk's items, from their keys as the
    /// frozen list keeps them (`key_count` columns: a JSON array of texts when more than
    /// one), for `prunes`. None when a key cannot be read so.
    pub fn values<'k>(
        &self,
        keys: impl Iterator<Item = &'k str>,
        key_count: usize,
    ) -> Option<Vec<String>> {
        let ValueIn::Key(i) = self.by else {
            return None;
        };
        // a key of one column is its value: a chunk of it has as many values as items
        let mut seen = std::collections::HashSet::new();
        let mut values: Vec<String> = Vec::new();
        for key in keys {
            let value = if key_count == 1 {
                key.to_string()
            } else {
                match serde_json::from_str::<serde_json::Value>(key)
                    .ok()?
                    .get(i)?
                {
                    serde_json::Value::String(s) => s.clone(),
                    _ => return None,
                }
            };
            if seen.insert(value.clone()) {
                values.push(value);
            }
        }
        Some(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_key(i: usize) -> Distributed {
        Distributed {
            table: pg_sys::Oid::INVALID,
            column: "customer".into(),
            by: ValueIn::Key(i),
        }
    }

    #[test]
    fn a_chunk_binds_each_value_of_its_keys_once() {
        let keys = [
            r#"["7", "1"]"#,
            r#"["7", "2"]"#,
            r#"["9", "1"]"#,
            r#"["7", "3"]"#,
        ];
        assert_eq!(
            by_key(0).values(keys.iter().copied(), 2),
            Some(vec!["7".to_string(), "9".to_string()])
        );
        assert_eq!(
            by_key(1).values(keys.iter().copied(), 2),
            Some(vec!["1".to_string(), "2".to_string(), "3".to_string()])
        );
    }

    #[test]
    fn a_key_of_one_column_is_its_value() {
        let keys = ["a b", "c", "a b"];
        assert_eq!(
            by_key(0).values(keys.iter().copied(), 1),
            Some(vec!["a b".to_string(), "c".to_string()])
        );
    }

    #[test]
    fn a_key_that_cannot_be_read_binds_nothing() {
        assert_eq!(by_key(0).values(["not json"].iter().copied(), 2), None);
        assert_eq!(by_key(2).values([r#"["1", "2"]"#].iter().copied(), 2), None);
        let tenant = Distributed {
            by: ValueIn::Tenant,
            ..by_key(0)
        };
        assert_eq!(tenant.values(["1"].iter().copied(), 1), None);
    }
}
