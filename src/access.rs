//! Who may read or act on a job or a launch: one rule, for every routine that takes a
//! job id or a launch id (docs/security.md, "Who may see and act on a job").
//!
//! As PostgreSQL lets a role act on what it owns: a job belongs to the role that
//! registered it, a launch to the role that launched it. That role and the roles with
//! its privileges (`pg_has_role(..., 'USAGE')`, as PostgreSQL's own owner checks: a
//! member that does not inherit them sets its role first) may read it and act on it.
//! Besides, SELECT on the object's table (etc_batch.job, etc_batch.launch) reads every
//! one, as the views show it, and UPDATE on it acts on every one: a role that may write
//! the rows that say a job is paused or aborted may as well pause or abort it through
//! the routines. Superusers pass both. Anyone else gets 42501, before anything changes.
//!
//! The rule is read as the caller: call `require` outside `roles::as_owner`.

use crate::error::{BatchError, Result};
use crate::query;
use crate::roles::{as_owner, current_user};
use pgrx::pg_sys;

/// What a routine reads or acts on.
#[derive(Debug, Clone, Copy)]
pub enum Of<'a> {
    Job(&'a str),
    Launch(i64),
}

/// What a routine does with it.
#[derive(Debug, Clone, Copy)]
pub enum Right {
    /// Reads what the views show of it (job_summary, job_report).
    Read,
    /// Acts on it: the verb says how, in the refusal ("permission denied to pause job").
    Act(&'static str),
}

/// Whether role $1 has the privileges of role $2, or privilege $4 on table $3.
const MAY: &str = "\
SELECT pg_catalog.pg_has_role($1::pg_catalog.oid, $2::pg_catalog.oid, 'USAGE')
       OR pg_catalog.has_table_privilege($1::pg_catalog.oid, $3, $4)";

/// The role that registered job $1.
const JOB_ROLE: &str = "\
SELECT j.registered_by::pg_catalog.oid FROM etc_batch.job j
 WHERE j.job_id OPERATOR(pg_catalog.=) $1";

/// The role that launched launch $1.
const LAUNCH_ROLE: &str = "\
SELECT l.launched_by::pg_catalog.oid FROM etc_batch.launch l
 WHERE l.launch_id OPERATOR(pg_catalog.=) $1";

/// Nothing, if the caller may do `right` on `of`; 42704 for a job or a launch that does
/// not exist, 42501 for one the caller may not read or act on.
pub fn require(of: Of, right: Right) -> Result<()> {
    let caller = current_user();
    let belongs_to = as_owner(|| match of {
        Of::Job(job_id) => query::one::<pg_sys::Oid>(JOB_ROLE, &[job_id.into()])?
            .ok_or_else(|| BatchError::UnknownJob { job: job_id.into() }),
        Of::Launch(id) => query::one::<pg_sys::Oid>(LAUNCH_ROLE, &[id.into()])?
            .ok_or(BatchError::UnknownLaunch { id }),
    })?;
    let (table, privilege) = match (of, right) {
        (Of::Job(_), Right::Read) => ("etc_batch.job", "SELECT"),
        (Of::Job(_), Right::Act(_)) => ("etc_batch.job", "UPDATE"),
        (Of::Launch(_), Right::Read) => ("etc_batch.launch", "SELECT"),
        (Of::Launch(_), Right::Act(_)) => ("etc_batch.launch", "UPDATE"),
    };
    let may = query::one::<bool>(
        MAY,
        &[
            caller.into(),
            belongs_to.into(),
            table.into(),
            privilege.into(),
        ],
    )?
    .unwrap_or(false);
    if may {
        return Ok(());
    }
    Err(refusal(of, right))
}

/// The refusal, in PostgreSQL's words for a privilege missing, with who may instead.
/// The role the job or launch belongs to is not named: the caller may not know it.
fn refusal(of: Of, right: Right) -> BatchError {
    let (what, whose, table) = match of {
        Of::Job(job_id) => (
            format!("job \"{job_id}\""),
            "the role that registered it",
            "etc_batch.job",
        ),
        Of::Launch(id) => (
            format!("launch {id}"),
            "the role that launched it",
            "etc_batch.launch",
        ),
    };
    let noun = match of {
        Of::Job(_) => "A job",
        Of::Launch(_) => "A launch",
    };
    match right {
        Right::Read => BatchError::PermissionDenied {
            message: format!("permission denied for {what}"),
            detail: format!(
                "{noun} is shown to {whose} (and its members), and to roles granted SELECT on {table}."
            ),
        },
        Right::Act(verb) => BatchError::PermissionDenied {
            message: format!("permission denied to {verb} {what}"),
            detail: format!(
                "{noun} is acted on by {whose} (and its members), and by roles granted UPDATE on {table}."
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(error: BatchError) -> (String, String) {
        match error {
            BatchError::PermissionDenied { message, detail } => (message, detail),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refusal_to_read_says_who_may() {
        assert_eq!(
            said(refusal(Of::Job("assign"), Right::Read)),
            (
                "permission denied for job \"assign\"".to_string(),
                "A job is shown to the role that registered it (and its members), and to roles granted SELECT on etc_batch.job.".to_string()
            )
        );
    }

    #[test]
    fn a_refusal_to_act_names_the_act() {
        let (message, detail) = said(refusal(Of::Launch(6), Right::Act("stop")));
        assert_eq!(message, "permission denied to stop launch 6");
        assert!(detail.contains("UPDATE on etc_batch.launch"), "{detail}");
        let (message, _) = said(refusal(Of::Job("night"), Right::Act("pace")));
        assert_eq!(message, "permission denied to pace job \"night\"");
    }
}
