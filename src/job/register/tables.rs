//! A job's own partitions of etc_batch.job_item_chunk and etc_batch.job_audit_chunk
//! (and, for a parallel job, of etc_batch.job_chunk), named by its number: made when it
//! is registered (sql/jobs.sql, create_job_tables), filled, then attached; read and
//! written by its chunks directly, never through the parents.

use crate::error::Result;
use crate::job::sql;
use crate::query;
use pgrx::pg_sys;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobTables {
    pub number: i64,
    items: String,
    audit: String,
}

impl JobTables {
    pub fn of(number: i64) -> JobTables {
        JobTables {
            number,
            items: format!("etc_batch.job_item_chunk_{number}"),
            audit: format!("etc_batch.job_audit_chunk_{number}"),
        }
    }

    /// `template` (a statement of `job::sql`) with `{item_chunks}` and `{audit_chunks}`
    /// naming this job's partitions, and `{items}` and `{audit}` its frozen list and its
    /// audit one row per item, as the views etc_batch.job_item and etc_batch.job_audit
    /// show them (for the reads of the whole job: verify_job, the report, the remainder).
    pub fn sql(&self, template: &str) -> String {
        template
            .replace("{items}", &sql::ITEMS.replace("{item_chunks}", &self.items))
            .replace("{item_chunks}", &self.items)
            .replace(
                "{audit}",
                &sql::AUDIT_ITEMS.replace("{audit_chunks}", &self.audit),
            )
            .replace("{audit_chunks}", &self.audit)
            .replace("{chunks}", &format!("etc_batch.{}", self.chunks_relname()))
    }

    /// The item partition, for statements built around the target.
    pub fn items(&self) -> &str {
        &self.items
    }

    /// The item partition's name within schema etc_batch, for direct reads and writes.
    pub fn items_relname(&self) -> String {
        format!("job_item_chunk_{}", self.number)
    }

    /// A parallel job's chunk partition's name within schema etc_batch.
    pub fn chunks_relname(&self) -> String {
        format!("job_chunk_{}", self.number)
    }

    /// The audit partition's name within schema etc_batch, for the audit writer.
    pub fn audit_relname(&self) -> String {
        format!("job_audit_chunk_{}", self.number)
    }

    /// Makes the partitions, as tables of their own, empty. Run as the owner.
    pub fn create(&self, job_id: &str, registrant: pg_sys::Oid, parallel: bool) -> Result<()> {
        query::run(
            sql::CREATE_JOB_TABLES,
            &[
                self.number.into(),
                job_id.into(),
                registrant.into(),
                parallel.into(),
            ],
        )
    }

    /// Attaches the partitions, once the items (and a parallel job's chunk rows) are
    /// written. Run as the owner.
    pub fn attach(&self, job_id: &str) -> Result<()> {
        query::run(sql::ATTACH_JOB_TABLES, &[self.number.into(), job_id.into()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_jobs_own_partitions() {
        let t = JobTables::of(42);
        assert_eq!(
            t.sql("SELECT 1 FROM {item_chunks} i JOIN {audit_chunks} a ON true"),
            "SELECT 1 FROM etc_batch.job_item_chunk_42 i JOIN etc_batch.job_audit_chunk_42 a ON true"
        );
        let per_item = t.sql("SELECT i.position FROM {items} i JOIN {audit} a USING (position)");
        assert!(
            per_item.contains("FROM etc_batch.job_item_chunk_42 c,"),
            "{per_item}"
        );
        assert!(
            per_item.contains("FROM etc_batch.job_audit_chunk_42 a,"),
            "{per_item}"
        );
        assert!(!per_item.contains('{'), "{per_item}");
    }
}
