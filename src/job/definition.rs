//! A job as registered: read once per call, since registration never changes it.

use super::sql;
use super::target::{Set, Target};
use crate::error::{BatchError, Result};
use crate::job::register::tables::JobTables;
use crate::job::rules::approval::{parse_object, Action, OnDrift, Terms};
use crate::job::rules::guard::Guard;
use crate::job::rules::key::JobKey;
use crate::query;
use pgrx::pg_sys;
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct Definition {
    pub job_id: String,
    /// The tenant and its column; None: the job's scope is the whole table.
    pub tenant: Option<(String, String)>,
    pub target: pg_sys::Oid,
    /// `"schema"."table"`, quoted, as it was named at registration.
    pub target_name: String,
    /// Whether the target is still there (by its OID).
    pub target_present: bool,
    pub key: JobKey,
    pub guard: Guard,
    pub on_drift: OnDrift,
    pub chunk_size: i32,
    pub set_values: Option<BTreeMap<String, Value>>,
    /// The handler as a callable, schema-qualified, quoted name, and by OID.
    pub handler: Option<String>,
    pub handler_oid: Option<pg_sys::Oid>,
    pub expect: BTreeMap<String, Value>,
    pub guard_columns: Vec<String>,
    pub item_count: i32,
    pub registered_by: pg_sys::Oid,
    pub fingerprint: String,
    /// The registering session's search_path, which the job's change runs with.
    pub search_path: String,
    /// A handler job whose handler was dropped: `handler` is None, but it is no
    /// set_values job, and must never be drained as one.
    pub handler_dropped: bool,
    /// The job's own partitions of job_item and job_audit.
    pub tables: JobTables,
    /// Whether both partitions still exist: dropped by hand, the job's record is gone.
    pub tables_present: bool,
    /// Whether chunks may commit in any order, each claimed by one of many drainers.
    pub parallel: bool,
    /// Whether each item's guards hold the values its row had before the change in the
    /// columns the job sets, recorded at registration.
    pub record_before: bool,
    /// A revert's columns set to each item's own value (carried in its guards).
    pub set_from_items: Vec<String>,
    /// Columns set to an expression, as PostgreSQL printed it at registration.
    pub set_expressions: BTreeMap<String, String>,
    /// For a revert: the job whose committed items it sets back.
    pub reverts: Option<String>,
    /// For a job that deletes its rows (or moves them to an archive): how.
    pub deletes: Option<Deletion>,
    /// For a revert of such a job, which puts its rows back: from where.
    pub restores: Option<Restoring>,
}

/// How a revert of a delete or a move puts its rows back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restoring {
    /// For a move's: the archive the rows are taken back from, its quoted,
    /// schema-qualified name.
    pub archive: Option<String>,
}

/// How a job deletes its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// The table a move inserts them into first, its quoted, schema-qualified name;
    /// None: deleted only.
    pub archive: Option<String>,
    /// Whether each row's content is kept with its chunk's audit.
    pub keep: bool,
}

query::row_reader! {
    /// A job's row as JOB_DEFINITION reads it.
    struct JobRow {
        tenant: Option<String>,
        target: pg_sys::Oid = pg_sys::Oid::INVALID,
        key_columns: Vec<String> = Vec::new(),
        tenant_column: Option<String>,
        revision_column: Option<String>,
        chunk_size: i32 = 1,
        set_values: Option<String>,
        /// The handler as a callable, schema-qualified, quoted name; None: none, or
        /// dropped.
        handler: Option<String>,
        expect: Option<String>,
        guard_columns: Vec<String> = Vec::new(),
        item_count: i32 = 0,
        registered_by: pg_sys::Oid = pg_sys::Oid::INVALID,
        fingerprint: String = String::new(),
        target_name: String = String::new(),
        search_path: String = String::new(),
        has_handler: bool = false,
        job_number: i64 = 0,
        tables_present: bool = false,
        parallel: bool = false,
        guard: String = String::new(),
        on_drift: String = String::new(),
        target_present: bool = false,
        handler_oid: Option<pg_sys::Oid>,
        record_before: bool = false,
        set_from_items: Vec<String> = Vec::new(),
        action: String = String::new(),
        archive: Option<String>,
        keep_deleted: bool = true,
        set_expressions: Option<String>,
        reverts: Option<String>,
    }
}

impl Definition {
    /// The job, or the error for an unknown job id.
    pub fn require(job_id: &str) -> Result<Definition> {
        Self::load(job_id)?.ok_or_else(|| BatchError::UnknownJob {
            job: job_id.to_string(),
        })
    }

    /// The job's target table, as the catalog describes it now; the error that names it
    /// when it is gone (dropped, or dropped and made again, which gives it another OID).
    pub fn target(&self) -> Result<Target> {
        if !self.target_present {
            return Err(BatchError::TargetGone {
                job: self.job_id.clone(),
                table: self.target_name.clone(),
            });
        }
        Target::load(
            self.target,
            &self.key,
            self.tenant.as_ref().map(|(_, c)| c.as_str()),
            &self.guard,
        )
    }

    /// The tenant the job's statements bind as $3 (NULL for a job without one).
    pub fn tenant_value(&self) -> Option<&str> {
        self.tenant.as_ref().map(|(v, _)| v.as_str())
    }

    pub fn load(job_id: &str) -> Result<Option<Definition>> {
        let Some(r) = query::row(sql::JOB_DEFINITION, &[job_id.into()], JobRow::read)? else {
            return Ok(None);
        };
        Ok(Some(Definition {
            job_id: job_id.to_string(),
            tenant: r.tenant.zip(r.tenant_column),
            target: r.target,
            key: JobKey::of(r.key_columns),
            guard: Guard::stored(&r.guard, r.revision_column.as_deref()),
            on_drift: OnDrift::parse(&r.on_drift)?,
            chunk_size: r.chunk_size,
            set_values: r.set_values.map(|t| parse_object(&t)),
            handler_dropped: r.has_handler && r.handler.is_none(),
            handler: r.handler,
            expect: r.expect.map(|t| parse_object(&t)).unwrap_or_default(),
            guard_columns: r.guard_columns,
            item_count: r.item_count,
            registered_by: r.registered_by,
            fingerprint: r.fingerprint,
            target_name: r.target_name,
            search_path: r.search_path,
            tables: JobTables::of(r.job_number),
            tables_present: r.tables_present,
            parallel: r.parallel,
            target_present: r.target_present,
            handler_oid: r.handler_oid,
            record_before: r.record_before,
            set_from_items: r.set_from_items,
            deletes: matches!(r.action.as_str(), "delete" | "move").then(|| Deletion {
                archive: r.archive.clone(),
                keep: r.keep_deleted,
            }),
            restores: (r.action == "restore").then_some(Restoring { archive: r.archive }),
            set_expressions: r
                .set_expressions
                .map(|t| {
                    parse_object(&t)
                        .into_iter()
                        .map(|(c, e)| (c, e.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default(),
            reverts: r.reverts,
        }))
    }

    /// What the job approved besides its items, in normal form.
    pub fn terms(&self) -> Terms {
        Terms {
            tenant: self.tenant.clone(),
            target: self.target_name.clone(),
            key: self.key.clone(),
            guard: self.guard.clone(),
            chunk_size: self.chunk_size,
            action: match (&self.deletes, &self.set_values, &self.handler) {
                _ if self.restores.is_some() => Action::Restore {
                    archive: self.restores.as_ref().and_then(|r| r.archive.clone()),
                },
                (
                    Some(Deletion {
                        archive: None,
                        keep,
                    }),
                    ..,
                ) => Action::Delete { keep: *keep },
                (
                    Some(Deletion {
                        archive: Some(archive),
                        keep,
                    }),
                    ..,
                ) => Action::Move {
                    archive: archive.clone(),
                    keep: *keep,
                },
                (None, Some(values), _) => Action::Set(values.clone()),
                (None, None, Some(handler)) => Action::Handler(handler.clone()),
                (None, None, None) => Action::Set(BTreeMap::new()),
            },
            expect: self.expect.clone(),
            parallel: self.parallel,
            on_drift: self.on_drift,
            record_before: self.record_before,
            set_from_items: self.set_from_items.clone(),
            set_expressions: self.set_expressions.clone(),
        }
    }

    /// What the job sets, as a report reads it.
    pub fn set(&self) -> Set<'_> {
        Set {
            values: self.set_values.as_ref(),
            from_items: &self.set_from_items,
            gone_as_left: self.deletes.as_ref().map(|d| {
                if d.archive.is_some() {
                    "moved to the archive"
                } else {
                    "deleted by the job"
                }
            }),
        }
    }

    /// The job's record of its frozen list is gone when a partition was dropped by hand.
    pub fn require_tables(&self) -> Result<()> {
        if self.tables_present {
            return Ok(());
        }
        Err(BatchError::JobCorrupt {
            job: self.job_id.clone(),
            detail: format!(
                "Its partitions etc_batch.job_item_chunk_{n} and etc_batch.job_audit_chunk_{n} do not both exist any more.",
                n = self.tables.number
            ),
        })
    }
}
