//! The business table a job changes: its columns as read from the catalog, and the
//! statements etc_batch builds for it.
//!
//! Identifiers are quoted, types are schema-qualified, operators are spelled
//! OPERATOR(pg_catalog.x), and every value is a bound parameter: nothing a caller
//! supplies is ever spliced into SQL as text.

use super::columns::{Column, Kind, Shape};
use super::sql::{COLUMNS, RELATION, UNIQUE_KEY};
use crate::error::{BatchError, Result};
use crate::query;
use pgrx::pg_sys;
use pgrx::spi::{quote_identifier, quote_literal};
use std::collections::HashMap;

#[derive(Debug, Clone)]
pub struct Target {
    /// `"schema"."table"`, quoted for SQL.
    pub sql_name: String,
    /// The table as regclass prints it, for messages and fingerprints.
    pub display: String,
    pub shape: Shape,
    /// Column -> `"schema"."type"`, quoted for casts.
    pub types: HashMap<String, String>,
}

impl Target {
    pub fn load(
        oid: pg_sys::Oid,
        key_column: &str,
        tenant_column: &str,
        revision_column: &str,
    ) -> Result<Target> {
        let (kind, sql_name, display) = query::row(RELATION, &[oid.into()], |r| {
            Ok((
                r.get::<String>(1)?,
                r.get::<String>(2)?,
                r.get::<String>(3)?,
            ))
        })?
        .ok_or_else(|| BatchError::UnknownRelation { oid: oid.to_u32() })?;
        let (sql_name, display) = (sql_name.unwrap_or_default(), display.unwrap_or_default());
        if !matches!(kind.as_deref(), Some("r") | Some("p")) {
            return Err(BatchError::invalid_because(
                format!("target \"{display}\" is not a table"),
                "A job changes rows of a table or a partitioned table.",
            ));
        }
        let (names, type_names, qualified) = query::row(COLUMNS, &[oid.into()], |r| {
            Ok((
                r.get::<Vec<String>>(1)?,
                r.get::<Vec<String>>(2)?,
                r.get::<Vec<String>>(3)?,
            ))
        })?
        .map(|(a, b, c)| {
            (
                a.unwrap_or_default(),
                b.unwrap_or_default(),
                c.unwrap_or_default(),
            )
        })
        .unwrap_or_default();
        let mut columns = HashMap::new();
        let mut types = HashMap::new();
        for ((name, type_name), sql_type) in names.into_iter().zip(type_names).zip(qualified) {
            let kind = Kind::for_type(&type_name);
            columns.insert(
                name.clone(),
                Column {
                    name: name.clone(),
                    type_name,
                    kind,
                },
            );
            types.insert(name, sql_type);
        }
        let shape = Shape {
            columns,
            key_column: key_column.to_string(),
            tenant_column: tenant_column.to_string(),
            revision_column: revision_column.to_string(),
        };
        shape.check_roles()?;
        let target = Target {
            sql_name,
            display,
            shape,
            types,
        };
        target.check_unique_key(oid)?;
        Ok(target)
    }

    /// One approved item must match one row: some unique index must cover only the key
    /// and tenant columns.
    fn check_unique_key(&self, oid: pg_sys::Oid) -> Result<()> {
        let (key, tenant) = (&self.shape.key_column, &self.shape.tenant_column);
        let covered = query::one::<bool>(
            UNIQUE_KEY,
            &[oid.into(), key.as_str().into(), tenant.as_str().into()],
        )? == Some(true);
        if covered {
            return Ok(());
        }
        Err(BatchError::invalid_because(
            format!(
                "target \"{}\" has no unique index on ({tenant}, {key})",
                self.display
            ),
            "Each approved item must match exactly one row of its tenant.",
        ))
    }

    fn col(&self, name: &str) -> String {
        quote_identifier(name)
    }

    fn cast(&self, expr: &str, column: &str) -> String {
        format!("({expr})::{}", self.types[column])
    }

    /// `t.col` equals the value stored under `name` in the jsonb `source`, where a JSON
    /// null means the column must be NULL.
    /// `t.col` equals the value stored under `name` in the jsonb `source`, a value the
    /// whole job shares ($7, expect), where a JSON null means the column must be NULL. The
    /// lookups are uncorrelated subqueries, which PostgreSQL evaluates once per statement
    /// rather than once per row.
    fn matches_constant(&self, source: &str, name: &str) -> String {
        let lit = quote_literal(name);
        let col = self.col(name);
        format!(
            "(CASE WHEN (SELECT {source} OPERATOR(pg_catalog.->) {lit} OPERATOR(pg_catalog.=) 'null'::pg_catalog.jsonb) \
             THEN t.{col} IS NULL \
             ELSE t.{col} OPERATOR(pg_catalog.=) (SELECT {}) END)",
            self.cast(&format!("{source} OPERATOR(pg_catalog.->>) {lit}"), name)
        )
    }

    /// The chunk's items as a relation `i(item_key, revision, guards, ord)`, from the
    /// arrays $1 to $3 in position order; the position of an item is `$4 + ord - 1`.
    const ITEMS: &'static str = "ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), \
         pg_catalog.unnest($2::pg_catalog.int8[]), pg_catalog.unnest($3::pg_catalog.jsonb[])) \
         WITH ORDINALITY AS i(item_key, revision, guards, ord)";

    /// The items relation of a set_values job: key and revision ($1, $2), and for guard k
    /// the arrays $(8 + 2k) (has it) and $(9 + 2k) (its value as text), so that checking a
    /// guard is a cast and a comparison per row, not a JSON lookup.
    fn typed_items(guards: usize) -> String {
        let mut functions = vec![
            "pg_catalog.unnest($1::pg_catalog.text[])".to_string(),
            "pg_catalog.unnest($2::pg_catalog.int8[])".to_string(),
        ];
        let mut names = vec!["item_key".to_string(), "revision".to_string()];
        for k in 0..guards {
            functions.push(format!(
                "pg_catalog.unnest(${}::pg_catalog.bool[])",
                8 + 2 * k
            ));
            functions.push(format!(
                "pg_catalog.unnest(${}::pg_catalog.text[])",
                9 + 2 * k
            ));
            names.push(format!("h_{k}"));
            names.push(format!("v_{k}"));
        }
        names.push("ord".into());
        format!(
            "ROWS FROM ({}) WITH ORDINALITY AS i({})",
            functions.join(", "),
            names.join(", ")
        )
    }

    /// The approved items of positions [$2, $3) of job $1, as arrays in position order:
    /// count, keys, revisions, guards (jsonb, for the audit and for handlers), the first
    /// and last key, and for each guard column whether the item has it and its value.
    pub fn chunk_items_sql(guard_columns: &[String]) -> String {
        let mut columns = vec![
            "pg_catalog.count(*)::pg_catalog.int4".to_string(),
            "pg_catalog.array_agg(i.item_key)".to_string(),
            "pg_catalog.array_agg(i.revision)".to_string(),
            "pg_catalog.array_agg(i.guards)".to_string(),
        ];
        for g in guard_columns {
            let lit = quote_literal(g);
            columns.push(format!(
                "pg_catalog.array_agg(i.guards OPERATOR(pg_catalog.?) {lit})"
            ));
            columns.push(format!(
                "pg_catalog.array_agg(i.guards OPERATOR(pg_catalog.->>) {lit})"
            ));
        }
        // The aggregates read the rows in the order of the subquery, which the primary
        // key's index scan gives without sorting: one pass, every array aligned.
        format!(
            "SELECT a.c1, a.c2, a.c3, a.c4, a.c2[1], a.c2[pg_catalog.cardinality(a.c2)]{}\n  FROM (SELECT {}\n          \
             FROM (SELECT * FROM etc_batch.job_item j\n                 WHERE j.job_id OPERATOR(pg_catalog.=) $1\n                   \
             AND j.position OPERATOR(pg_catalog.>=) $2 AND j.position OPERATOR(pg_catalog.<) $3\n                 \
             ORDER BY j.position) i) a(c1, c2, c3, c4{})",
            (0..2 * guard_columns.len()).map(|k| format!(", a.g{k}")).collect::<String>(),
            columns.join(",\n               "),
            (0..2 * guard_columns.len()).map(|k| format!(", g{k}")).collect::<String>(),
        )
    }

    const POSITION: &'static str =
        "($4 OPERATOR(pg_catalog.+) i.ord::pg_catalog.int4 OPERATOR(pg_catalog.-) 1)";

    fn item_conditions(&self, guard_columns: &[String], expect_columns: &[String]) -> String {
        let s = &self.shape;
        let mut conditions = vec![
            format!(
                "t.{} OPERATOR(pg_catalog.=) {}",
                self.col(&s.tenant_column),
                self.cast("$5", &s.tenant_column)
            ),
            format!(
                "t.{} OPERATOR(pg_catalog.=) {}",
                self.col(&s.key_column),
                self.cast("i.item_key", &s.key_column)
            ),
            // The same keys once more as an array: an index condition on the target, so
            // the plan reads the chunk's rows by index whatever the statistics say.
            format!(
                "t.{} OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[]::{}[])",
                self.col(&s.key_column),
                self.types[&s.key_column]
            ),
            format!(
                "t.{} OPERATOR(pg_catalog.=) i.revision",
                self.col(&s.revision_column)
            ),
        ];
        // Guard k comes as two columns of the items relation: whether the item has it
        // (h_k), and its value as text (v_k, NULL for a JSON null). See chunk_items_sql.
        for (k, g) in guard_columns.iter().enumerate() {
            let col = self.col(g);
            conditions.push(format!(
                "(NOT i.h_{k} OR CASE WHEN i.v_{k} IS NULL THEN t.{col} IS NULL \
                 ELSE t.{col} OPERATOR(pg_catalog.=) {} END)",
                self.cast(&format!("i.v_{k}"), g)
            ));
        }
        for e in expect_columns {
            conditions.push(self.matches_constant("$7", e));
        }
        conditions.join("\n   AND ")
    }

    /// Reads the values in $1 (text[]) as column $2 of the target reads them (the
    /// column's name is bound whether or not the statement needs it), to refuse
    /// at registration what every chunk would fail on. A number is read through a record
    /// of the target's row type, as the column reads input, type modifier included
    /// (numeric(6,2)); anything else is cast to the column's type as the chunk's
    /// statement casts it.
    pub fn read_values_sql(&self, column: &str) -> String {
        match self.shape.columns.get(column).map(|c| c.kind) {
            Some(Kind::Numeric) => format!(
                "SELECT pg_catalog.count(pg_catalog.jsonb_populate_record(NULL::{}, \
                        pg_catalog.jsonb_build_object($2::pg_catalog.text, v))) \
                   FROM pg_catalog.unnest($1::pg_catalog.text[]) AS v",
                self.sql_name
            ),
            _ => format!(
                "SELECT pg_catalog.count(v::{}) FROM pg_catalog.unnest($1::pg_catalog.text[]) AS v",
                self.types[column]
            ),
        }
    }

    /// The guarded change of one chunk, one statement: tenant, key, revision, every
    /// guard and expectation in the WHERE clause, the revision incremented, and RETURNING
    /// what really changed: (position, revision after, key). $1-$2 the chunk's keys and
    /// revisions, $4 its first position, $5 tenant, $6 set_values, $7 expect, $8 on the
    /// guards (see typed_items).
    pub fn update_sql(
        &self,
        set_columns: &[String],
        guard_columns: &[String],
        expect_columns: &[String],
    ) -> String {
        let rev = self.col(&self.shape.revision_column);
        let mut assignments: Vec<String> = set_columns
            .iter()
            .map(|c| {
                format!(
                    "{} = (SELECT {})",
                    self.col(c),
                    self.cast(
                        &format!("$6 OPERATOR(pg_catalog.->>) {}", quote_literal(c)),
                        c
                    )
                )
            })
            .collect();
        assignments.push(format!("{rev} = t.{rev} OPERATOR(pg_catalog.+) 1"));
        format!(
            "UPDATE {} AS t\n   SET {}\n  FROM {}\n WHERE {}\nRETURNING {}, t.{rev}::pg_catalog.int8, i.item_key",
            self.sql_name,
            assignments.join(", "),
            Self::typed_items(guard_columns.len()),
            self.item_conditions(guard_columns, expect_columns),
            Self::POSITION,
        )
    }

    /// A handler job's chunk: the handler is called once per item, in position order,
    /// with the item as jsonb (key, revision, tenant, guards). $1-$5 as update_sql.
    pub fn handler_sql(&self, handler: &str) -> String {
        let s = &self.shape;
        format!(
            "SELECT {}, {handler}(pg_catalog.jsonb_build_object({}, {}, {}, i.revision, {}, {}) \
             OPERATOR(pg_catalog.||) i.guards)::pg_catalog.text, i.item_key\n  FROM {}\n ORDER BY i.ord",
            Self::POSITION,
            quote_literal(&s.key_column),
            self.cast("i.item_key", &s.key_column),
            quote_literal(&s.revision_column),
            quote_literal(&s.tenant_column),
            self.cast("$5", &s.tenant_column),
            Self::ITEMS,
        )
    }

    /// The row an item names now, as jsonb, or no row: what a conflict reports.
    /// $1 tenant, $2 key.
    pub fn current_row_sql(&self) -> String {
        let s = &self.shape;
        format!(
            "SELECT pg_catalog.to_jsonb(t)::pg_catalog.text FROM {} AS t WHERE t.{} OPERATOR(pg_catalog.=) {} AND t.{} OPERATOR(pg_catalog.=) {}",
            self.sql_name,
            self.col(&s.tenant_column),
            self.cast("$1", &s.tenant_column),
            self.col(&s.key_column),
            self.cast("$2", &s.key_column),
        )
    }

    /// Every approved item with what the job committed for it and what its row holds
    /// now, in one statement and so in one snapshot. $1 job, $2 tenant.
    pub fn report_sql(&self) -> String {
        let s = &self.shape;
        let rev = self.col(&s.revision_column);
        let key = self.col(&s.key_column);
        format!(
            "SELECT i.position, i.item_key,
       CASE WHEN a.position IS NULL THEN 'unprocessed'
            WHEN t.{key} IS NULL THEN 'missing'
            WHEN t.{rev}::pg_catalog.int8 OPERATOR(pg_catalog.=) a.revision_after THEN 'matching'
            ELSE 'drifted' END,
       a.revision_after, t.{rev}::pg_catalog.int8
  FROM etc_batch.job_item i
  LEFT JOIN etc_batch.job_audit a
    ON a.job_id OPERATOR(pg_catalog.=) i.job_id AND a.position OPERATOR(pg_catalog.=) i.position
  LEFT JOIN {} AS t
    ON t.{} OPERATOR(pg_catalog.=) {} AND t.{} OPERATOR(pg_catalog.=) {}
 WHERE i.job_id OPERATOR(pg_catalog.=) $1
 ORDER BY i.position",
            self.sql_name,
            self.col(&s.tenant_column),
            self.cast("$2", &s.tenant_column),
            self.col(&s.key_column),
            self.cast("i.item_key", &s.key_column),
        )
    }
}
