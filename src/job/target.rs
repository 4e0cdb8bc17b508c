//! The business table a job changes: its columns as read from the catalog, and the
//! statements etc_batch builds for it.
//!
//! Identifiers are quoted, types are schema-qualified, operators are spelled
//! OPERATOR(pg_catalog.x), and every value is a bound parameter: nothing a caller
//! supplies is ever spliced into SQL as text (but an items query, which is SQL by its
//! nature, run as the role that gave it: see items_query).

use super::sql::{COLUMNS, PRIMARY_KEY, RELATION, UNIQUE_KEY};
use crate::error::{BatchError, Result};
use crate::job::distributed::{distribution_column, Distributed};
use crate::job::rules::columns::{scalar_text, Column, Columns, HashBy, Kind};
use crate::job::rules::guard::Guard;
use crate::job::rules::key::JobKey;
use crate::job::rules::shape::Shape;
use crate::query;
use pgrx::pg_sys;
use pgrx::spi::{quote_identifier, quote_literal};
use serde_json::Value;
use std::collections::BTreeMap;

/// The member of an item's guards that holds what its row held before the change in the
/// columns set from each item (change/item_values.rs): the empty name, which no column
/// can have.
pub(crate) const BEFORE: &str = "";

#[derive(Debug, Clone)]
pub struct Target {
    /// `"schema"."table"`, quoted for SQL.
    pub sql_name: String,
    /// The table as regclass prints it, for messages and fingerprints.
    pub display: String,
    pub shape: Shape,
    /// How Citus distributes it, when it distributes it by a column.
    pub distributed: Option<Distributed>,
}

query::row_reader! {
    /// A relation as RELATION reads it.
    struct Relation {
        kind: String = String::new(),
        sql_name: String = String::new(),
        display: String = String::new(),
    }
}

query::row_reader! {
    /// A column as COLUMNS reads it.
    struct CatalogColumn {
        name: String = String::new(),
        type_name: String = String::new(),
        sql_type: String = String::new(),
        type_oid: pg_sys::Oid = pg_sys::Oid::INVALID,
        collatable: bool = false,
        byte_ordered: bool = false,
        generated: bool = false,
        not_null: bool = false,
    }
}

/// The target's columns as the catalog describes them, before roles are given to them.
pub fn columns_of(oid: pg_sys::Oid) -> Result<(String, String, Columns)> {
    let Relation {
        kind,
        sql_name,
        display,
    } = query::row(RELATION, &[oid.into()], Relation::read)?
        .ok_or_else(|| BatchError::UnknownRelation { oid: oid.to_u32() })?;
    if !matches!(kind.as_str(), "r" | "p") {
        return Err(BatchError::invalid_because(
            format!("target \"{display}\" is not a table"),
            "A job changes rows of a table or a partitioned table.",
        ));
    }
    let mut position = 0;
    let columns = query::rows(COLUMNS, &[oid.into()], 0, |r| {
        let c = CatalogColumn::read(r)?;
        position += 1;
        Ok((
            c.name.clone(),
            Column {
                kind: Kind::for_type(&c.type_name),
                name: c.name,
                type_name: c.type_name,
                sql_type: c.sql_type,
                type_oid: c.type_oid,
                collatable: c.collatable,
                byte_ordered: c.byte_ordered,
                generated: c.generated,
                not_null: c.not_null,
                position: position - 1,
                hash: hash_by(c.type_oid),
            },
        ))
    })?;
    Ok((sql_name, display, columns.into_iter().collect()))
}

/// How a row's digest hashes a value of a type: by the extended hash function the type
/// cache finds for it (the default hash operator class's; a domain's is its base
/// type's; a container, an array, a composite or a range, has one only when its
/// elements have one), called directly where the value goes to it as it is, else
/// through a row of the one value; by its text where there is none.
fn hash_by(type_oid: pg_sys::Oid) -> HashBy {
    // SAFETY: type cache and catalog lookups, which raise an ERROR only for a type that
    // does not exist (the catalog just gave this one); the names are copied out at once
    unsafe {
        let entry =
            pg_sys::lookup_type_cache(type_oid, pg_sys::TYPECACHE_HASH_EXTENDED_PROC as i32);
        if entry.is_null() || (*entry).hash_extended_proc == pg_sys::Oid::INVALID {
            return HashBy::Text;
        }
        let function = (*entry).hash_extended_proc;
        let mut args: *mut pg_sys::Oid = std::ptr::null_mut();
        let mut nargs = 0;
        pg_sys::get_func_signature(function, &mut args, &mut nargs);
        let takes = if nargs > 0 {
            *args
        } else {
            pg_sys::Oid::INVALID
        };
        let base = pg_sys::getBaseType(type_oid);
        // a function of `internal` (bytea's hashvarlenaextended) cannot be called from
        // SQL: such a value is hashed through a row, whose hash calls it
        if takes == pg_sys::INTERNALOID {
            return HashBy::Record;
        }
        let as_it_is = takes == base
            || pg_sys::get_typtype(takes) as u8 == pg_sys::TYPTYPE_PSEUDO
            || pg_sys::IsBinaryCoercible(base, takes);
        if !as_it_is {
            return HashBy::Record;
        }
        let name = pg_sys::get_func_name(function);
        let schema = pg_sys::get_namespace_name(pg_sys::get_func_namespace(function));
        if name.is_null() || schema.is_null() {
            return HashBy::Record;
        }
        let text = |p: *mut std::os::raw::c_char| {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        };
        HashBy::Function(format!(
            "{}.{}",
            pgrx::spi::quote_identifier(text(schema)),
            pgrx::spi::quote_identifier(text(name))
        ))
    }
}

/// The columns of the target's primary key, in its order; empty when it has none.
pub fn primary_key(oid: pg_sys::Oid) -> Result<Vec<String>> {
    Ok(query::one::<Vec<String>>(PRIMARY_KEY, &[oid.into()])?.unwrap_or_default())
}

impl Target {
    pub fn load(
        oid: pg_sys::Oid,
        key: &JobKey,
        tenant_column: Option<&str>,
        guard: &Guard,
    ) -> Result<Target> {
        let (sql_name, display, columns) = columns_of(oid)?;
        let shape = Shape {
            columns,
            key: key.clone(),
            tenant_column: tenant_column.map(str::to_string),
            guard: guard.clone(),
        };
        shape.check_roles()?;
        let distributed = match distribution_column(oid)? {
            Some(column) => Some(Distributed::of(oid, &display, column, &shape)?),
            None => None,
        };
        let target = Target {
            sql_name,
            display,
            shape,
            distributed,
        };
        target.check_unique_key(oid)?;
        Ok(target)
    }

    /// One approved item must match one row: some unique index must cover only the key
    /// and tenant columns.
    fn check_unique_key(&self, oid: pg_sys::Oid) -> Result<()> {
        let s = &self.shape;
        let mut named: Vec<String> = s.key.columns().to_vec();
        named.extend(s.tenant_column.clone());
        if query::one::<bool>(UNIQUE_KEY, &[oid.into(), named.into()])? == Some(true) {
            return Ok(());
        }
        Err(BatchError::KeyNotUnique {
            table: self.display.clone(),
            key: match &s.tenant_column {
                Some(tenant) => format!("{} within tenant column \"{tenant}\"", s.key.describe()),
                None => s.key.describe(),
            },
        })
    }

    fn col(&self, name: &str) -> String {
        quote_identifier(name)
    }

    pub(crate) fn cast(&self, expr: &str, column: &str) -> String {
        format!("({expr})::{}", self.shape.columns[column].sql_type)
    }

    /// SQL: item `item`'s value of `column` in its guards, as the column's type.
    pub(crate) fn item_value(&self, item: &str, column: &str) -> String {
        self.cast(
            &format!(
                "{item}.guards OPERATOR(pg_catalog.->>) {}",
                quote_literal(column)
            ),
            column,
        )
    }

    /// The chunk's approved items, positions [$1, $2), as `it(position, item_key,
    /// revision, guards)`: the one row of the job's item partition that begins at $1,
    /// found by its primary key and unfolded. The chunk size as a LIMIT tells the
    /// planner how many rows to expect, so that it probes the target by index once per
    /// item however large the chunk is; no ORDER BY, which would sort every chunk for
    /// nothing (the change's RETURNING comes in no order anyway).
    pub(crate) fn chunk_items(items: &str, chunk_size: i32) -> String {
        format!(
            "(SELECT u.position, u.item_key, u.revision, u.guards\n          FROM {items} c,\n               \
             etc_batch.chunk_items(c.first_position, c.keys, c.revisions, c.guards) u\n         \
             WHERE c.first_position OPERATOR(pg_catalog.=) $1 AND u.position OPERATOR(pg_catalog.<) $2\n         \
             LIMIT {chunk_size}) it"
        )
    }

    /// The chunk's approved items as `it(position, item_key, revision, guards)`, unfolded
    /// from its row's arrays bound as parameters `$at` (keys), `$at + 1` (revisions) and
    /// `$at + 2` (guards), the first at position $1.
    pub(crate) fn bound_items(at: usize) -> String {
        format!(
            "(SELECT u.position, u.item_key, u.revision, u.guards\n          FROM \
             etc_batch.chunk_items($1, ${at}::pg_catalog.text[], ${}::pg_catalog.int8[], \
             ${}::pg_catalog.text[]) u) it",
            at + 1,
            at + 2
        )
    }

    /// SQL: the target's row `t` is of the job's tenant (`tenant`, an expression of
    /// text), if it has one.
    pub fn tenant_condition(&self, tenant: &str) -> Option<String> {
        self.shape.tenant_column.as_ref().map(|column| {
            format!(
                "t.{} OPERATOR(pg_catalog.=) {}",
                self.col(column),
                self.cast(tenant, column)
            )
        })
    }

    /// Whether the target's row `t` is the one item `it` approved, as it was approved:
    /// tenant, key, guard, every guard column the item has and every expectation.
    /// $3 tenant, the expectations as `constants` numbers them.
    pub(crate) fn item_matches(&self, guard_columns: &[String], constants: &Constants) -> String {
        let s = &self.shape;
        let mut conditions: Vec<String> = self.tenant_condition("$3").into_iter().collect();
        conditions.push(s.key.matches("it.item_key", &s.columns));
        conditions.extend(s.guard.matches(&s.columns));
        for g in guard_columns {
            // One lookup where the guard holds: equal, or both NULL (a JSON null), or an
            // item without this guard.
            let (col, lit) = (self.col(g), quote_literal(g));
            let value = self.cast(&format!("it.guards OPERATOR(pg_catalog.->>) {lit}"), g);
            conditions.push(format!(
                "(t.{col} OPERATOR(pg_catalog.=) {value} OR (t.{col} IS NULL AND {value} IS NULL) \
                 OR NOT it.guards OPERATOR(pg_catalog.?) {lit})"
            ));
        }
        // a column set from each item still holds the value recorded before the change
        // (change/item_values.rs), where the item recorded one
        let before = quote_literal(BEFORE);
        for column in constants.item_columns() {
            let (col, lit) = (self.col(column), quote_literal(column));
            let value = self.cast(
                &format!(
                    "it.guards OPERATOR(pg_catalog.->) {before} OPERATOR(pg_catalog.->>) {lit}"
                ),
                column,
            );
            conditions.push(format!(
                "(t.{col} OPERATOR(pg_catalog.=) {value} OR (t.{col} IS NULL AND {value} IS NULL) \
                 OR NOT COALESCE(it.guards OPERATOR(pg_catalog.->) {before} OPERATOR(pg_catalog.?) {lit}, false))"
            ));
        }
        for (column, param) in constants.expected() {
            let col = self.col(column);
            conditions.push(match param {
                Some(n) => format!("t.{col} OPERATOR(pg_catalog.=) ${n}"),
                None => format!("t.{col} IS NULL"),
            });
        }
        conditions.join("\n     AND ")
    }

    /// SQL: the key columns of the target's row `t` as a jsonb object, the fields of an
    /// item of register_job that name it.
    pub fn key_object_sql(&self) -> String {
        format!(
            "pg_catalog.jsonb_build_object({})",
            self.shape
                .key
                .columns()
                .iter()
                .map(|c| format!("{}, t.{}", quote_literal(c), quote_identifier(c)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// `item_matches`, for a reader of items other than a chunk's (`it`: item_key,
    /// revision, guards).
    pub fn matches_item(&self, guard_columns: &[String], constants: &Constants) -> String {
        self.item_matches(guard_columns, constants)
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
                self.shape.columns[column].sql_type
            ),
        }
    }

    /// Whether a chunk's statement bounds its scan by the chunk's first and last key
    /// (JobKey::bounds_chunks), which it binds as text after the constants.
    /// Never on a distributed target, whose chunks lie in shard order: a chunk that ends
    /// one shard's items and begins the next one's spans no range of keys.
    pub fn bounds_chunks(&self) -> bool {
        self.distributed.is_none() && self.shape.key.bounds_chunks(&self.shape.columns)
    }

    /// The items of a chunk that no longer match their rows, in position order, as the
    /// registering role: what a chunk that changed fewer rows than it has items conflicts
    /// on (the first), or skips (all of them), with the row each names now, as jsonb
    /// text (NULL: the row is gone). Its parameters are change_sql's (the values to set
    /// unused).
    pub fn mismatches_sql(
        &self,
        items: &str,
        chunk_size: i32,
        guard_columns: &[String],
        constants: &Constants,
    ) -> String {
        let s = &self.shape;
        let mut names: Vec<String> = self.tenant_condition("$3").into_iter().collect();
        names.push(s.key.matches("it.item_key", &s.columns));
        format!(
            "SELECT it.position, (SELECT pg_catalog.to_jsonb(t)::pg_catalog.text FROM {name} AS t\n   \
             WHERE {names}) FROM {items_sql}\n WHERE NOT EXISTS (\n  \
             SELECT FROM {name} AS t\n   WHERE {matches})\n ORDER BY it.position",
            name = self.sql_name,
            names = names.join(" AND "),
            items_sql = Self::chunk_items(items, chunk_size),
            matches = self.item_matches(guard_columns, constants),
        )
    }

    /// The row an item names now, as jsonb, or no row: what a conflict reports.
    /// $1 tenant, $2 key.
    pub fn current_row_sql(&self) -> String {
        let s = &self.shape;
        let mut conditions: Vec<String> = self.tenant_condition("$1").into_iter().collect();
        conditions.push(s.key.matches("$2::pg_catalog.text", &s.columns));
        format!(
            "SELECT pg_catalog.to_jsonb(t)::pg_catalog.text FROM {} AS t WHERE {}",
            self.sql_name,
            conditions.join(" AND ")
        )
    }

    /// Every approved item with what the job committed for it and what its row holds
    /// now, in one statement and so in one snapshot, with the caller's privileges, read
    /// through `through` (the parents, or the job's own partitions). Planned afresh each
    /// time with the job id known, so that only the job's own partitions are read or
    /// locked. $1 job, $2 tenant. `set`: what the job sets, which a job guarded by named
    /// columns reads as its state.
    pub fn report_sql(&self, set: &Set, through: &Through) -> String {
        format!("{}\n ORDER BY i.position", self.report_rows(set, through))
    }

    /// The job's items counted by state, in one statement. $1, $2 as report_sql.
    pub fn counts_sql(&self, set: &Set, through: &Through) -> String {
        let count = |state: &str, states: &[&str]| {
            let states: Vec<String> = states.iter().map(|s| quote_literal(*s)).collect();
            format!(
                "(pg_catalog.count(*) FILTER (WHERE r.state OPERATOR(pg_catalog.=) ANY (ARRAY[{}])))::pg_catalog.int4 AS {state}",
                states.join(", ")
            )
        };
        // a row a delete left gone is as the job left it: matching
        let matching: Vec<&str> = std::iter::once("matching")
            .chain(set.gone_as_left)
            .collect();
        format!(
            "WITH r AS ({})\nSELECT {}, {}, {}, {}, {} FROM r",
            self.report_rows(set, through),
            count("unprocessed", &["unprocessed"]),
            count("matching", &matching),
            count("drifted", &["drifted"]),
            count("missing", &["missing"]),
            count("skipped", &["skipped"]),
        )
    }

    fn report_rows(&self, set: &Set, through: &Through) -> String {
        let s = &self.shape;
        let present = format!("t.{}", self.col(&s.key.columns()[0]));
        // what the job left the row at: its guard value then, or (named columns) what it set
        let (gone, matching) = match set.gone_as_left {
            Some(state) => (quote_literal(state), "false".to_string()),
            None => ("'missing'".to_string(), self.matching(set)),
        };
        let mut joins: Vec<String> = self.tenant_condition("$2").into_iter().collect();
        joins.push(s.key.matches("i.item_key", &s.columns));
        format!(
            "SELECT i.position, i.item_key,
       CASE WHEN a.position IS NULL THEN 'unprocessed'
            WHEN a.skipped THEN 'skipped'
            WHEN {present} IS NULL THEN {gone}
            WHEN {matching} THEN 'matching'
            ELSE 'drifted' END AS state,
       a.revision_after AS revision_committed,
       CASE WHEN {present} IS NOT NULL THEN {} END AS revision_now
  FROM {} i
  LEFT JOIN {} a
    ON a.job_id OPERATOR(pg_catalog.=) $1 AND a.position OPERATOR(pg_catalog.=) i.position
  LEFT JOIN {} AS t
    ON {}
 WHERE i.job_id OPERATOR(pg_catalog.=) $1",
            s.guard_now(),
            through.items,
            through.audit,
            self.sql_name,
            joins.join(" AND "),
        )
    }

    /// SQL: whether the target's row `t` holds what the job left it at: its guard value
    /// then, or (named columns) what it set.
    fn matching(&self, set: &Set) -> String {
        let s = &self.shape;
        match s.guard.column() {
            Some(_) => format!("{} OPERATOR(pg_catalog.=) a.revision_after", s.guard_now()),
            None if s.guard == Guard::Row => {
                format!("{} OPERATOR(pg_catalog.=) a.revision_after", s.guard_now())
            }
            None => set
                .values
                .into_iter()
                .flatten()
                .map(|(column, value)| match scalar_text(value) {
                    // the operators spelled out, never the search_path's (as IS NOT
                    // DISTINCT FROM would look them up)
                    Some(text) => format!(
                        "COALESCE(t.{} OPERATOR(pg_catalog.=) {}, false)",
                        self.col(column),
                        self.cast(&quote_literal(&text), column)
                    ),
                    None => format!("t.{} IS NULL", self.col(column)),
                })
                .chain(set.from_items.iter().map(|column| {
                    let (col, value) = (self.col(column), self.item_value("i", column));
                    format!(
                        "COALESCE(t.{col} OPERATOR(pg_catalog.=) {value}, t.{col} IS NULL AND {value} IS NULL)"
                    )
                }))
                .chain(std::iter::once("true".to_string()))
                .collect::<Vec<_>>()
                .join(" AND "),
        }
    }
}

/// SQL: a text[] of the names `values`, each a quoted literal (an empty one for none).
pub fn text_array_sql(values: &[String]) -> String {
    format!(
        "ARRAY[{}]::pg_catalog.text[]",
        values
            .iter()
            .map(quote_literal)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// What a job sets, as a report of a job guarded by named columns reads a row's state:
/// the values of set_values, and the columns set to each item's own value.
pub struct Set<'a> {
    pub values: Option<&'a BTreeMap<String, Value>>,
    pub from_items: &'a [String],
    /// For a job that deletes its rows: the state of an item whose row is gone, as the
    /// job left it ("deleted by the job", "moved to the archive"); a row of its key
    /// found again is one that drifted.
    pub gone_as_left: Option<&'static str>,
}

/// The tables a report reads a job's items and audit through: the parents
/// etc_batch.job_item and etc_batch.job_audit, where a reader of every job is granted
/// SELECT, or the job's own partitions, which the role that registered it may read.
pub struct Through {
    pub items: String,
    pub audit: String,
}

/// The values a job's change sets and those it expects, bound from $4 on in that order,
/// each of its column's own type (so that no row casts it): a JSON null is not bound but
/// spelled out, `= NULL` to set, `IS NULL` to expect.
pub struct Constants {
    set: Vec<(String, Option<String>)>,
    expect: Vec<(String, Option<String>)>,
    /// Columns set to each item's own value, read from its guards (a revert's
    /// set_from_items): no constant, nothing bound.
    from_items: Vec<String>,
}

impl Constants {
    pub fn new(
        set_values: Option<&BTreeMap<String, Value>>,
        expect: &BTreeMap<String, Value>,
    ) -> Constants {
        let texts = |m: &BTreeMap<String, Value>| -> Vec<(String, Option<String>)> {
            m.iter().map(|(c, v)| (c.clone(), scalar_text(v))).collect()
        };
        Constants {
            set: set_values.map(texts).unwrap_or_default(),
            expect: texts(expect),
            from_items: Vec::new(),
        }
    }

    /// The same, with the columns `from_items` set to each item's own value.
    pub fn with_item_values(mut self, from_items: &[String]) -> Constants {
        self.from_items = from_items.to_vec();
        self
    }

    /// Columns to set, with the number of the parameter each is bound to.
    pub(crate) fn assigned(&self) -> impl Iterator<Item = (&str, Option<usize>)> {
        Self::numbered(&self.set, 4)
    }

    /// Columns expected, with the number of the parameter each is bound to.
    fn expected(&self) -> impl Iterator<Item = (&str, Option<usize>)> {
        let after_set = 4 + self.set.iter().filter(|(_, v)| v.is_some()).count();
        Self::numbered(&self.expect, after_set)
    }

    /// The columns set to each item's own value.
    pub(crate) fn item_columns(&self) -> &[String] {
        &self.from_items
    }

    /// The number of the first parameter after the bound values.
    pub fn after(&self) -> usize {
        4 + self
            .set
            .iter()
            .chain(&self.expect)
            .filter(|(_, v)| v.is_some())
            .count()
    }

    fn numbered(
        values: &[(String, Option<String>)],
        first: usize,
    ) -> impl Iterator<Item = (&str, Option<usize>)> {
        let mut next = first;
        values.iter().map(move |(column, value)| {
            let param = value.as_ref().map(|_| {
                next += 1;
                next - 1
            });
            (column.as_str(), param)
        })
    }

    /// The bound values, in parameter order, as datums of their columns' types.
    pub fn args(&self, target: &Target) -> Result<Vec<query::Opaque>> {
        self.set
            .iter()
            .chain(&self.expect)
            .filter_map(|(column, value)| value.as_ref().map(|v| (column, v)))
            .map(|(column, value)| query::typed(target.shape.columns[column].type_oid, value))
            .collect()
    }
}
