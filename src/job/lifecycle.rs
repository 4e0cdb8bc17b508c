//! The checks every routine that acts on a job makes, in one place: may this role act on
//! it; its drainers held still and its status locked; and what a routine refuses a job
//! stopped for good with. register_remainder, register_revert, abort_job, pace_job,
//! drain_job and launch_job all decide through these.

use crate::access::{self, Of, Right};
use crate::error::{BatchError, Result};
use crate::job::definition::Definition;
use crate::job::run::claim;
use crate::job::sql;
use crate::query;
use crate::roles::as_owner;
use crate::status::JobStatus;

/// Job `job_id`, for a routine that acts on it: refused (42501) unless the caller may
/// (access.rs; `act` names the act in the refusal), then read as the owner.
pub(crate) fn acted_on(job_id: &str, act: &'static str) -> Result<Definition> {
    access::require(Of::Job(job_id), Right::Act(act))?;
    as_owner(|| Definition::require(job_id))
}

/// Holds `def` still for a routine that decides by its status, until the caller's
/// transaction ends: a parallel job's drainers claim no other chunk (each finishes the
/// one it holds, which the status lock waits for), and its status row is locked, as a
/// sequential drainer locks it for each chunk. Returns the status after the lock.
pub(crate) fn hold(def: &Definition) -> Result<JobStatus> {
    let status = as_owner(|| {
        if def.parallel && def.tables_present {
            claim::stop(&def.tables)?;
        }
        query::one::<String>(sql::LOCK_JOB_STATUS, &[def.job_id.as_str().into()])
    })?
    .ok_or_else(|| BatchError::UnknownJob {
        job: def.job_id.clone(),
    })?;
    JobStatus::parse(&status)
}

/// What the job's status records beside a stop: the successor of a continued job, the
/// job that reverted a reverted one, why a job stopped.
pub(crate) fn reason(job_id: &str) -> Result<Option<String>> {
    as_owner(|| query::one::<String>(sql::JOB_STATUS_REASON, &[job_id.into()]))
}

/// The error a routine that needs job `job_id` pending raises for it in `status`, with
/// the reason recorded.
pub(crate) fn refusal(job_id: &str, status: JobStatus) -> Result<BatchError> {
    Ok(match status {
        JobStatus::Done => BatchError::JobFinished { job: job_id.into() },
        status => stopped(job_id, status, reason(job_id)?),
    })
}

/// The error for a job stopped in `status` for `reason` (for a job continued as another,
/// its successor's id; reverted, the reverting job's).
pub(crate) fn stopped(job: &str, status: JobStatus, reason: Option<String>) -> BatchError {
    let job = job.to_string();
    match status {
        JobStatus::Continued => BatchError::JobContinued {
            job,
            successor: reason,
        },
        JobStatus::Reverted => BatchError::JobReverted { job, by: reason },
        JobStatus::Conflict => BatchError::JobConflict {
            job,
            detail: reason.unwrap_or_default(),
        },
        JobStatus::Corrupt => BatchError::JobCorrupt {
            job,
            detail: reason.unwrap_or_default(),
        },
        _ => BatchError::JobAborted { job, reason },
    }
}

/// The error for a routine that reads what a corrupt job changed (its remainder, its
/// revert): its records cannot say.
pub(crate) fn untrusted(job_id: &str) -> BatchError {
    BatchError::JobCorrupt {
        job: job_id.into(),
        detail: "Its records cannot be trusted to tell what it changed.".into(),
    }
}
