//! abort_job: stop a job for good, keeping its approval, audit and checkpoint.

use crate::access::{self, Of, Right};
use crate::error::{BatchError, Result};
use crate::job::definition::Definition;
use crate::job::run::claim;
use crate::job::sql;
use crate::query;
use crate::roles::{as_owner, current_user};
use crate::status::JobStatus;
use pgrx::prelude::*;

pub fn abort(job_id: &str, reason: &str) -> Result<()> {
    access::require(Of::Job(job_id), Right::Act("abort"))?;
    let by = current_user();
    as_owner(|| {
        // a parallel job's chunks in flight commit first, and none starts after
        let def = Definition::require(job_id)?;
        if def.parallel && def.tables_present {
            claim::stop(&def.tables)?;
        }
        let status = query::one::<String>(sql::LOCK_JOB_STATUS, &[job_id.into()])?
            .ok_or_else(|| BatchError::UnknownJob { job: job_id.into() })?;
        match JobStatus::parse(&status)? {
            JobStatus::Done => Err(BatchError::JobFinished { job: job_id.into() }),
            JobStatus::Continued => Err(BatchError::JobContinued {
                job: job_id.into(),
                successor: query::one::<String>(sql::JOB_STATUS_REASON, &[job_id.into()])?,
            }),
            JobStatus::Reverted => Err(BatchError::JobReverted {
                job: job_id.into(),
                by: query::one::<String>(sql::JOB_STATUS_REASON, &[job_id.into()])?,
            }),
            JobStatus::Aborted => {
                notice!("job \"{job_id}\" was already aborted; nothing changed");
                Ok(())
            }
            JobStatus::Pending | JobStatus::Conflict | JobStatus::Corrupt => {
                query::run(sql::ABORT_JOB, &[job_id.into(), reason.into(), by.into()])?;
                crate::events::job(
                    def.tables.number,
                    job_id,
                    "aborted",
                    serde_json::json!({"reason": reason, "by": crate::pauses::role_name(by)}),
                );
                Ok(())
            }
        }
    })
}
