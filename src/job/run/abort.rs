//! abort_job: stop a job for good, keeping its approval, audit and checkpoint.

use crate::error::Result;
use crate::job::lifecycle;
use crate::job::sql;
use crate::query;
use crate::roles::{as_owner, current_user};
use crate::status::JobStatus;
use pgrx::prelude::*;

pub fn abort(job_id: &str, reason: &str) -> Result<()> {
    let def = lifecycle::acted_on(job_id, "abort")?;
    let by = current_user();
    // a parallel job's chunks in flight commit first, and none starts after
    match lifecycle::hold(&def)? {
        JobStatus::Aborted => {
            notice!("job \"{job_id}\" was already aborted; nothing changed");
            Ok(())
        }
        JobStatus::Pending | JobStatus::Conflict | JobStatus::Corrupt => {
            as_owner(|| query::run(sql::ABORT_JOB, &[job_id.into(), reason.into(), by.into()]))?;
            crate::events::job(
                def.tables.number,
                job_id,
                "aborted",
                serde_json::json!({"reason": reason, "by": crate::pauses::role_name(by)}),
            );
            Ok(())
        }
        stopped => Err(lifecycle::refusal(job_id, stopped)?),
    }
}
