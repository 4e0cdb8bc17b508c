//! The revert of a job that deleted its rows (action 'delete') or moved them to an
//! archive ('move') and kept them (keep_deleted): a job of its own, action 'restore',
//! that puts each kept row back.
//!
//! Its items are the job's committed items whose key is free now, each carrying the
//! row as the job kept it, every column but the tenant's as a member of the item (so
//! that the row is checked, normalized and frozen as any approval is); an item whose key
//! was taken since is left out, `taken` (a move's whose row is no longer in the archive
//! as it was moved, `drifted`), and named. Each chunk is one statement that inserts the
//! chunk's rows where their key is still free (ON CONFLICT DO NOTHING: a key taken
//! meanwhile is drift, skipped or a conflict as the job says), and, for a move, deletes
//! each from the archive in the same statement, one copy of it, locked first, so that a
//! row is never both put back and left in the archive, nor taken from it and not put
//! back. The restore is guarded by named columns, every one of the row: its own revert
//! is a delete (or a move to the same archive) of the rows as it put them back, and the
//! revert of that a restore again.

use super::{Asked, RevertTerms};
use crate::error::{BatchError, Result};
use crate::job::rules::approval::Action;
use crate::job::rules::columns::{Column, Kind};
use crate::job::target::{columns_of, Constants, Target};
use pgrx::pg_sys;
use pgrx::spi::{quote_identifier, quote_literal};
use std::collections::BTreeMap;

/// A restore's approval: the archive its rows are taken back from, which still has a
/// column of each name of the target's.
pub(crate) fn check(target: &Target, archive: Option<pg_sys::Oid>) -> Result<Action> {
    let Some(archive) = archive else {
        return Ok(Action::Restore { archive: None });
    };
    let (sql_name, display, columns) = columns_of(archive)?;
    if let Some(missing) = target
        .shape
        .columns
        .in_order()
        .find(|c| columns.get(&c.name).is_none())
    {
        return Err(BatchError::invalid_because(
            format!("archive {display} has no column \"{}\" any more", missing.name),
            "The rows a move put in the archive are taken back from it as they were moved, every column of the target by name.",
        ));
    }
    Ok(Action::Restore {
        archive: Some(sql_name),
    })
}

/// What the revert of a job that deleted (or moved to `archive`) its rows does: put
/// them back, as a restore, guarded by every column of the row.
pub(crate) fn of_deleted(archive: Option<pg_sys::Oid>) -> RevertTerms {
    undone_by(Asked::Restore(archive))
}

/// What the revert of a restore does: delete the rows it put back (for a move's, move
/// them to the archive again), each as the restore left it, keeping them.
pub(crate) fn reverted(archive: Option<pg_sys::Oid>) -> RevertTerms {
    undone_by(match archive {
        Some(archive) => Asked::Move(archive),
        None => Asked::Delete,
    })
}

/// A revert by `action`, which sets nothing and expects nothing of a row but its own
/// guards, every column of it.
fn undone_by(action: Asked) -> RevertTerms {
    RevertTerms {
        set_back: None,
        from_items: Vec::new(),
        inverse: None,
        expressions: BTreeMap::new(),
        expect: BTreeMap::new(),
        strip: Vec::new(),
        action,
    }
}

/// SQL: the value of column `c` of the row `row`, as an item gives it (record_before's
/// way: a value JSON has no kind of its own for, as its text).
fn member(row: &str, c: &Column) -> String {
    match c.kind {
        Kind::Other => format!("({row}).{}::pg_catalog.text", quote_identifier(&c.name)),
        _ => format!("({row}).{}", quote_identifier(&c.name)),
    }
}

/// SQL: the item object of a row `row` of the target, as a restore approves it: every
/// column but the tenant's (jsonb_build_object takes 100 arguments at most: built in
/// parts).
fn item_object(target: &Target, row: &str) -> String {
    let s = &target.shape;
    let pairs: Vec<String> = s
        .columns
        .in_order()
        .filter(|c| s.tenant_column.as_deref() != Some(c.name.as_str()))
        .map(|c| format!("{}, {}", quote_literal(&c.name), member(row, c)))
        .collect();
    pairs
        .chunks(40)
        .map(|part| format!("pg_catalog.jsonb_build_object({})", part.join(", ")))
        .collect::<Vec<_>>()
        .join(" OPERATOR(pg_catalog.||) ")
}

/// SQL: the archive's row `a` is the row `row` as it was moved: the key's columns equal,
/// every other column not distinct (a type without equality compared as its text).
fn archived_as(target: &Target, row: &str) -> String {
    archive_matches(target, |c| format!("({row}).{}", quote_identifier(&c.name)))
}

/// SQL: the archive's row `a` holds, column by column, the values `value` reads: the
/// key's columns equal, every other not distinct (a type without equality compared as
/// its text).
fn archive_matches(target: &Target, value: impl Fn(&Column) -> String) -> String {
    let s = &target.shape;
    s.columns
        .in_order()
        .map(|c| {
            let (col, value) = (quote_identifier(&c.name), value(c));
            if s.key.columns().contains(&c.name) {
                format!("a.{col} OPERATOR(pg_catalog.=) {value}")
            } else if c.kind == Kind::Other {
                format!("a.{col}::pg_catalog.text IS NOT DISTINCT FROM ({value})::pg_catalog.text")
            } else {
                format!("a.{col} IS NOT DISTINCT FROM {value}")
            }
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// SQL: the job's committed items, each with the row it kept (in its row type's text
/// form), in position order, as against_rows lists items: position, key, no revision,
/// the kept row as `guards`. Over the job's tables.
pub(crate) const KEPT_ITEMS: &str = "\
SELECT i.position, i.item_key, NULL::pg_catalog.int8 AS revision, k.kept AS guards
  FROM {items} i
  JOIN (SELECT (a.first_position OPERATOR(pg_catalog.+) k.n OPERATOR(pg_catalog.-) 1)::pg_catalog.int4 AS position, k.kept
          FROM {audit_chunks} a, pg_catalog.unnest(a.kept) WITH ORDINALITY AS k(kept, n)) k
    ON k.position OPERATOR(pg_catalog.=) i.position
 WHERE k.kept IS NOT NULL
 ORDER BY i.position";

/// Where the rows a batch is read against come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowsFrom {
    /// A deleting job's kept rows (KEPT_ITEMS), in their row type's text form: its revert.
    Kept,
    /// A restore's own items, each a row (as its chunk inserts it): its remainder.
    Items,
}

/// SQL: a batch of rows to put back (bound as against_rows binds them: $3 the tenant, $4
/// the keys, $5 the revisions, $6 the rows, as `from` gives them) against the target
/// now, as the caller: each one's state, `again` where its key is free (and, for a move,
/// its row is in `archive` as it was moved), `taken` where a row of the job's tenant has
/// it (`drifted` where the archive no longer holds the row); and, to restore, its item.
pub(crate) fn against_rows_sql(target: &Target, archive: Option<&str>, from: RowsFrom) -> String {
    let s = &target.shape;
    let mut names: Vec<String> = target.tenant_condition("$3").into_iter().collect();
    names.push(s.key.matches("it.item_key", &s.columns));
    let archived = match archive {
        Some(archive) => format!(
            "\n        WHEN NOT EXISTS (SELECT FROM {archive} AS a WHERE {}) THEN 'drifted'",
            archived_as(target, "k.r")
        ),
        None => String::new(),
    };
    format!(
        "SELECT m.state,
       CASE WHEN m.state OPERATOR(pg_catalog.=) 'again' THEN ({item})::pg_catalog.text END AS approved
  FROM ROWS FROM (pg_catalog.unnest($4::pg_catalog.text[]),
                  pg_catalog.unnest($5::pg_catalog.int8[]),
                  pg_catalog.unnest($6::pg_catalog.text[]{rows_type}))
       WITH ORDINALITY AS it(item_key, revision, {rows}, n)
 CROSS JOIN LATERAL (SELECT {row} AS r) k
 CROSS JOIN LATERAL (SELECT CASE
        WHEN EXISTS (SELECT FROM {name} AS t WHERE {names}) THEN 'taken'{archived}
        ELSE 'again' END AS state) m
 ORDER BY it.n",
        item = item_object(target, "k.r"),
        rows_type = match from {
            RowsFrom::Kept => "",
            RowsFrom::Items => "::pg_catalog.jsonb[]",
        },
        rows = match from {
            RowsFrom::Kept => "kept",
            RowsFrom::Items => "guards",
        },
        row = match from {
            RowsFrom::Kept => format!("it.kept::{}", target.sql_name),
            RowsFrom::Items => format!(
                "ROW({})::{}",
                target
                    .shape
                    .columns
                    .in_order()
                    .map(|c| restored_value(target, c))
                    .collect::<Vec<_>>()
                    .join(", "),
                target.sql_name
            ),
        },
        name = target.sql_name,
        names = names.join(" AND "),
    )
}

/// The columns a restore inserts: every one but the generated ones, which PostgreSQL
/// computes again from the others.
fn inserted(target: &Target) -> Vec<&Column> {
    target
        .shape
        .columns
        .in_order()
        .filter(|c| !c.generated)
        .collect()
}

/// SQL: the value of column `c` of the row item `it` restores: its key's part, the job's
/// tenant ($3), or its member.
fn restored_value(target: &Target, c: &Column) -> String {
    let s = &target.shape;
    if let Some(i) = s.key.columns().iter().position(|k| *k == c.name) {
        return s.key.typed_part("it.item_key", i, &c.sql_type);
    }
    if s.tenant_column.as_deref() == Some(c.name.as_str()) {
        return target.cast("$3::pg_catalog.text", &c.name);
    }
    target.item_value("it", &c.name)
}

/// The restore of one chunk, one statement, run as the registering role; its parameters
/// as set_values' chunk_sql (no values to set): each row inserted where its key is free,
/// for a move's taken out of the archive (one copy, locked first) in the same statement;
/// returns each item restored.
pub(crate) fn chunk_sql(
    target: &Target,
    constants: &Constants,
    key_bounds: bool,
    archive: Option<&str>,
) -> String {
    let s = &target.shape;
    let arrays = constants.after() + if key_bounds { 2 } else { 0 };
    let columns = inserted(target);
    let names: Vec<String> = columns.iter().map(|c| quote_identifier(&c.name)).collect();
    let values: Vec<String> = columns.iter().map(|c| restored_value(target, c)).collect();
    let restored_key = s.key.matches("it.item_key", &s.columns);
    let key_names: Vec<String> = s
        .key
        .columns()
        .iter()
        .map(|c| format!("t.{}", quote_identifier(c)))
        .collect();
    let (found, from, taken) = match archive {
        None => (String::new(), "it".to_string(), String::new()),
        Some(archive) => {
            // the archive read once for the chunk, joined to its items by their keys (an
            // index on the archive's key columns lets it probe instead); every copy of a
            // row locked, one taken out
            (
                format!(
                    ",\nlocked AS MATERIALIZED (\n  SELECT it.position, a.ctid AS at FROM it JOIN {archive} AS a ON {}\n   \
                     FOR UPDATE OF a),\n\
                     found AS (SELECT l.position, pg_catalog.min(l.at) AS at FROM locked l GROUP BY l.position)",
                    archived_as_item(target)
                ),
                "it JOIN found f ON f.position OPERATOR(pg_catalog.=) it.position".to_string(),
                format!(
                    ",\ntaken AS (\n  DELETE FROM {archive} AS a USING found f, it, restored t\n   \
                     WHERE a.ctid OPERATOR(pg_catalog.=) f.at AND f.position OPERATOR(pg_catalog.=) it.position\n     \
                     AND {restored_key})"
                ),
            )
        }
    };
    format!(
        "WITH it AS MATERIALIZED (SELECT * FROM {items}){found},\n\
         restored AS (\n  INSERT INTO {name} AS t ({names}) OVERRIDING SYSTEM VALUE\n  \
         SELECT {values} FROM {from}\n  ON CONFLICT DO NOTHING\n  \
         RETURNING {key_names}, {guard_now} AS guard_now){taken}\n\
         SELECT it.position, t.guard_now, NULL::pg_catalog.text AS kept\n  \
         FROM restored t JOIN it ON {restored_key}",
        items = Target::bound_items(arrays),
        name = target.sql_name,
        names = names.join(", "),
        values = values.join(", "),
        key_names = key_names.join(", "),
        guard_now = s.guard_now(),
    )
}

/// SQL: the archive's row `a` is item `it`'s row as it was moved (archived_as, with each
/// value read from the item as the restore inserts it).
fn archived_as_item(target: &Target) -> String {
    archive_matches(target, |c| restored_value(target, c))
}

/// The items of a restore's chunk that it could not restore, in position order, with
/// the row that has each one's key now (NULL: none, its row was no longer in the
/// archive): what a conflict names first, and skip records. Parameters as
/// Target::mismatches_sql's.
pub(crate) fn mismatches_sql(
    target: &Target,
    items: &str,
    chunk_size: i32,
    archive: Option<&str>,
) -> String {
    let s = &target.shape;
    let mut names: Vec<String> = target.tenant_condition("$3").into_iter().collect();
    names.push(s.key.matches("it.item_key", &s.columns));
    let not_archived = match archive {
        Some(archive) => format!(
            " OR NOT EXISTS (SELECT FROM {archive} AS a WHERE {})",
            archived_as_item(target)
        ),
        None => String::new(),
    };
    format!(
        "SELECT it.position, (SELECT pg_catalog.to_jsonb(t)::pg_catalog.text FROM {name} AS t\n   \
         WHERE {names}) FROM {items_sql}\n WHERE EXISTS (SELECT FROM {name} AS t WHERE {names}){not_archived}\n \
         ORDER BY it.position",
        name = target.sql_name,
        names = names.join(" AND "),
        items_sql = Target::chunk_items(items, chunk_size),
    )
}
