//! Approvals PostgreSQL puts in order: those whose key is of several columns or of a type
//! this library does not order itself (numeric, dates and times, any type with a btree
//! order, domains over them), those guarded by a digest of the row, which only
//! PostgreSQL can take, and those of a target Citus distributes by a column of the key,
//! ordered by shard first (job/distributed.rs), which only Citus can tell.
//!
//! The items, given as a jsonb list (bound as arrays) or by an items query, are read by
//! one statement that casts each key's columns to their types, orders them in the types'
//! own order (text by its bytes, the "C" collation's, so that the order never depends on
//! a locale), ranks them (equal keys have equal ranks: 1.0 and 1.00 are one numeric, a
//! duplicate), prints each key as the frozen list keeps it, and, for a job guarded by a
//! digest, takes each item's row's digest. Its rows come through a cursor, a batch at a
//! time, under settings that print every value the same way in every session.

use crate::error::Result;
use crate::job::change::item_values;
use crate::job::register::freeze::ItemCursor;
use crate::job::register::items_query::ItemsQuery;
use crate::job::register::tables::JobTables;
use crate::job::rules::approval::Item;
use crate::job::rules::columns::Kind;
use crate::job::target::{text_array_sql, Target};
use pgrx::datum::DatumWithOid;
use pgrx::spi::{quote_identifier, quote_literal};

/// Where the approved items come from.
pub enum Given<'a> {
    /// A jsonb approval, checked and normalized, each item's key the texts of its
    /// columns (approval::Key::Given).
    Items(&'a [Item]),
    /// An items query.
    Query(&'a ItemsQuery),
}

/// The statements that read an approval in PostgreSQL's order, for one target.
pub struct SqlOrder<'a> {
    pub target: &'a Target,
    /// What each item's row holds now, recorded with the item: the values before the
    /// change.
    pub record: &'a Recorded,
}

/// The columns whose values before the change registration records, from the row each
/// item names: those a job sets to values (record_before) or by expressions, recorded in
/// each item's guards, where its chunk expects them; and those it sets to each item's
/// own value, which holds that column's place in the guards, recorded under
/// item_values::BEFORE.
#[derive(Debug, Default)]
pub struct Recorded {
    pub guards: Vec<String>,
    pub set_from_items: Vec<String>,
}

impl Recorded {
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty() && self.set_from_items.is_empty()
    }
}

/// The given items as rows `s(k, r, g)` (SqlOrder::source): the statement, what to bind,
/// and what `g`, the guards, is.
struct Source {
    sql: String,
    args: Vec<DatumWithOid<'static>>,
    /// The guards as jsonb (an items query's) rather than as JSON text (a jsonb
    /// approval's, bound as text): each is read as it comes, never printed and parsed again.
    jsonb: bool,
}

impl Source {
    /// SQL: the guards `s.g` as jsonb.
    fn guards_jsonb(&self) -> &'static str {
        match self.jsonb {
            true => "s.g",
            false => "s.g::pg_catalog.jsonb",
        }
    }

    /// SQL: the guards `s.g` as text.
    fn guards_text(&self) -> &'static str {
        match self.jsonb {
            true => "s.g::pg_catalog.text",
            false => "s.g",
        }
    }
}

impl SqlOrder<'_> {
    /// The given items as rows `s(k, r, g)`: the key's text as given (a JSON array of its
    /// columns' texts, for a key of several), the revision, the guards.
    fn source(&self, given: &Given) -> Source {
        match given {
            Given::Items(items) => {
                let keys: Vec<String> = items.iter().map(|i| i.key.text()).collect();
                let revisions: Vec<i64> = items.iter().map(|i| i.revision).collect();
                let guards: Vec<String> = items
                    .iter()
                    .map(|i| i.guards.canonical().to_string())
                    .collect();
                Source {
                    sql: "ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), \
                          pg_catalog.unnest($2::pg_catalog.int8[]), \
                          pg_catalog.unnest($3::pg_catalog.text[])) AS s(k, r, g)"
                        .into(),
                    args: vec![keys.into(), revisions.into(), guards.into()],
                    jsonb: false,
                }
            }
            Given::Query(query) => Source {
                sql: format!("({}) AS s(k, r, g)", query.rows_sql()),
                args: Vec::new(),
                jsonb: true,
            },
        }
    }

    /// SQL: the key's columns of the key text `k`, typed, as the frozen list orders them.
    fn order_by(&self, k: &str) -> String {
        let s = &self.target.shape;
        s.key
            .columns()
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let column = &s.columns[c];
                let part = s.key.typed_part(k, i, &column.sql_type);
                if column.collatable {
                    format!("{part} COLLATE pg_catalog.\"C\"")
                } else {
                    part
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// SQL: the key text `k` as the frozen list keeps it: each column as its type prints it.
    fn canonical(&self, k: &str) -> String {
        let s = &self.target.shape;
        let parts: Vec<String> = s
            .key
            .columns()
            .iter()
            .enumerate()
            .map(|(i, c)| {
                format!(
                    "({})::pg_catalog.text",
                    s.key.typed_part(k, i, &s.columns[c].sql_type)
                )
            })
            .collect();
        match parts.as_slice() {
            [one] => one.clone(),
            more => format!(
                "pg_catalog.jsonb_build_array({})::pg_catalog.text",
                more.join(", ")
            ),
        }
    }

    /// The given items in order, to be frozen: each with its key as the frozen list keeps
    /// it, its revision (a job guarded by the row: the digest of the row it names, which
    /// must exist; by named columns: 0), its guards (with the values its row holds now in
    /// the columns recorded, where the item does not name them itself; the row must
    /// exist) and its rank. `tenant`: the job's, as it binds it.
    pub fn frozen(&self, given: &Given, tenant: Option<&str>) -> Result<ItemCursor> {
        let t = self.target;
        let s = &t.shape;
        let mut source = self.source(given);
        let mut args = std::mem::take(&mut source.args);
        // by shard first on a distributed target, so that chunks lie in one shard
        let shard = match &t.distributed {
            Some(d) => d.shard_of(s, "s.k")?,
            None => None,
        };
        let order = match shard {
            Some(shard) => format!("{shard}, {}", self.order_by("s.k")),
            None => self.order_by("s.k"),
        };
        let by_digest = s.guard.is_digest();
        let sql = if by_digest || !self.record.is_empty() {
            let tenant_param = args.len() + 1;
            args.push(tenant.into());
            let mut joins: Vec<String> = s
                .tenant_column
                .iter()
                .map(|c| {
                    format!(
                        "t.{} OPERATOR(pg_catalog.=) (${tenant_param}::pg_catalog.text)::{}",
                        quote_identifier(c),
                        s.columns[c].sql_type
                    )
                })
                .collect();
            joins.push(s.key.matches("s.k", &s.columns));
            // a value JSON has no kind of its own for (an array, json, a composite, a
            // date) as its text, which the guard casts back
            let value = |c: &str| match s.columns[c].kind {
                Kind::Other => format!("t.{}::pg_catalog.text", quote_identifier(c)),
                _ => format!("t.{}", quote_identifier(c)),
            };
            let guards = if self.record.is_empty() {
                source.guards_text().to_string()
            } else {
                // the values recorded first, so that an item's own value of a column
                // (a guard it names) stands over the row's
                let recorded = (!self.record.guards.is_empty()).then(|| {
                    format!(
                        "pg_catalog.jsonb_build_object({}) OPERATOR(pg_catalog.||) ",
                        self.record
                            .guards
                            .iter()
                            .map(|c| format!("{}, {}", quote_literal(c), value(c)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                });
                format!(
                    "({}COALESCE({}, '{{}}'){})::pg_catalog.text",
                    recorded.unwrap_or_default(),
                    source.guards_jsonb(),
                    item_values::recorded_sql(&self.record.set_from_items, value)
                        .map(|before| format!(" OPERATOR(pg_catalog.||) {before}"))
                        .unwrap_or_default()
                )
            };
            format!(
                "SELECT {} AS item_key, {} AS revision, {guards} AS guards, \
                 pg_catalog.dense_rank() OVER (ORDER BY {order}) AS rank, t.{} IS NULL AS names_no_row\n  \
                 FROM {}\n  LEFT JOIN {} AS t ON {}\n ORDER BY {order}",
                self.canonical("s.k"),
                if by_digest { s.guard_now() } else { "s.r".to_string() },
                // a column of the key, never NULL in a row the join found: not the whole
                // row, which every row sorted would carry
                quote_identifier(&s.key.columns()[0]),
                source.sql,
                t.sql_name,
                joins.join(" AND "),
            )
        } else {
            format!(
                "SELECT {} AS item_key, s.r AS revision, {} AS guards, \
                 pg_catalog.dense_rank() OVER (ORDER BY {order}) AS rank, false AS names_no_row\n  \
                 FROM {}\n ORDER BY {order}",
                self.canonical("s.k"),
                source.guards_text(),
                source.sql,
            )
        };
        ItemCursor::ranked(&sql, &args, true)
    }

    /// The frozen list of a job (`stored`) and the given items, each in order, ranked in
    /// one order so that a walk side by side compares them: a registration of the same
    /// job id again. The stored list keeps the revisions frozen; the given items theirs
    /// as given (a digest is not taken again: it is not part of the request; nor are the
    /// values recorded before the change, compared on neither side).
    pub fn compared(&self, given: &Given, stored: &JobTables) -> Result<(ItemCursor, ItemCursor)> {
        let source = self.source(given);
        let order = self.order_by("u.k");
        let (stored_guards, given_guards) = if self.record.is_empty() {
            (
                "i.guards::pg_catalog.text".to_string(),
                source.guards_text().to_string(),
            )
        } else {
            let mut stored = self.record.guards.clone();
            if !self.record.set_from_items.is_empty() {
                stored.push(item_values::BEFORE.to_string());
            }
            (
                format!(
                    "(i.guards OPERATOR(pg_catalog.-) {})::pg_catalog.text",
                    text_array_sql(&stored)
                ),
                format!(
                    "(COALESCE({}, '{{}}') OPERATOR(pg_catalog.-) {})::pg_catalog.text",
                    source.guards_jsonb(),
                    text_array_sql(&self.record.guards)
                ),
            )
        };
        let side = |which: i32| {
            format!(
                "SELECT r.k AS item_key, r.r AS revision, r.g AS guards, r.rank, \
                 false AS names_no_row FROM (\n\
                   SELECT {canonical} AS k, u.r, u.g, u.side,\n\
                          pg_catalog.dense_rank() OVER (ORDER BY {order}) AS rank\n\
                     FROM (SELECT i.item_key, i.revision, {stored_guards}, 0\n\
                             FROM {items} i\n\
                           UNION ALL\n\
                           SELECT s.k, s.r, {given_guards}, 1 FROM {source_sql}) AS u(k, r, g, side)) r\n \
                 WHERE r.side OPERATOR(pg_catalog.=) {which}\n ORDER BY r.rank",
                canonical = self.canonical("u.k"),
                items = stored.sql("{items}"),
                source_sql = source.sql,
            )
        };
        Ok((
            ItemCursor::ranked(&side(0), &source.args, true)?,
            ItemCursor::ranked(&side(1), &source.args, true)?,
        ))
    }
}
