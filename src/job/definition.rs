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
        query::row(sql::JOB_DEFINITION, &[job_id.into()], |r| {
            let tenant = r.get::<String>(1)?;
            let tenant_column = r.get::<String>(4)?;
            Ok(Definition {
                job_id: job_id.to_string(),
                tenant: tenant.zip(tenant_column),
                target: r.get::<pg_sys::Oid>(2)?.unwrap_or(pg_sys::Oid::INVALID),
                key: JobKey::of(r.get::<Vec<String>>(3)?.unwrap_or_default()),
                guard: Guard::stored(
                    &r.get::<String>(20)?.unwrap_or_default(),
                    r.get::<String>(5)?.as_deref(),
                ),
                on_drift: OnDrift::parse(&r.get::<String>(21)?.unwrap_or_default())?,
                chunk_size: r.get::<i32>(6)?.unwrap_or(1),
                set_values: r.get::<String>(7)?.map(|t| parse_object(&t)),
                handler: r.get::<String>(8)?,
                expect: r
                    .get::<String>(9)?
                    .map(|t| parse_object(&t))
                    .unwrap_or_default(),
                guard_columns: r.get::<Vec<String>>(10)?.unwrap_or_default(),
                item_count: r.get::<i32>(11)?.unwrap_or(0),
                registered_by: r.get::<pg_sys::Oid>(12)?.unwrap_or(pg_sys::Oid::INVALID),
                fingerprint: r.get::<String>(13)?.unwrap_or_default(),
                target_name: r.get::<String>(14)?.unwrap_or_default(),
                search_path: r.get::<String>(15)?.unwrap_or_default(),
                handler_dropped: r.get::<bool>(16)?.unwrap_or(false)
                    && r.get::<String>(8)?.is_none(),
                tables: JobTables::of(r.get::<i64>(17)?.unwrap_or_default()),
                tables_present: r.get::<bool>(18)?.unwrap_or(false),
                parallel: r.get::<bool>(19)?.unwrap_or(false),
                target_present: r.get::<bool>(22)?.unwrap_or(false),
                handler_oid: r.get::<pg_sys::Oid>(23)?,
                record_before: r.get::<bool>(24)?.unwrap_or(false),
                set_from_items: r.get::<Vec<String>>(25)?.unwrap_or_default(),
            })
        })
    }

    /// What the job approved besides its items, in normal form.
    pub fn terms(&self) -> Terms {
        Terms {
            tenant: self.tenant.clone(),
            target: self.target_name.clone(),
            key: self.key.clone(),
            guard: self.guard.clone(),
            chunk_size: self.chunk_size,
            action: match (&self.set_values, &self.handler) {
                (Some(values), _) => Action::Set(values.clone()),
                (None, Some(handler)) => Action::Handler(handler.clone()),
                (None, None) => Action::Set(BTreeMap::new()),
            },
            expect: self.expect.clone(),
            parallel: self.parallel,
            on_drift: self.on_drift,
            record_before: self.record_before,
            set_from_items: self.set_from_items.clone(),
        }
    }

    /// What the job sets, as a report reads it.
    pub fn set(&self) -> Set<'_> {
        Set {
            values: self.set_values.as_ref(),
            from_items: &self.set_from_items,
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
