//! The states etc_batch keeps as text in its tables, as Rust enums: one variant per value
//! of the domains etc_batch.step_status, etc_batch.attempt_outcome and
//! etc_batch.job_status (sql/bootstrap.sql) and of the CHECKs on etc_batch.launch and
//! etc_batch.launch_run (sql/launches.sql). Each one's text is spelt here only: code
//! matches on the variants, and reads and writes the text through `parse` and `as_str`.

use crate::error::{BatchError, Result};

macro_rules! status {
    ($(#[$doc:meta])* $name:ident, $what:literal, { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn parse(text: &str) -> Result<Self> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => Err(BatchError::Internal(format!(
                        concat!("unknown ", $what, " \"{}\""),
                        other
                    ))),
                }
            }

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

status!(
    /// A step in the current run of its chain. There is no running state: a step being
    /// run is row-locked and still pending until its transaction commits.
    StepStatus, "step status", {
        Pending = "pending",
        Done = "done",
        Failed = "failed",
    }
);

status!(
    /// A job: pending until its last chunk commits, or stopped for good.
    JobStatus, "job status", {
        Pending = "pending",
        Done = "done",
        Conflict = "conflict",
        Corrupt = "corrupt",
        Aborted = "aborted",
        Continued = "continued",
        Reverted = "reverted",
    }
);

status!(
    /// What came of one attempt at a step, or of a step found done (step_audit.outcome).
    AttemptOutcome, "attempt outcome", {
        Done = "done",
        Failed = "failed",
        Skipped = "skipped",
        TimedOut = "timed_out",
        Retried = "retried",
    }
);

status!(
    /// How a run of a chain stands when run_chain returns (its status out): waiting its
    /// turn behind an earlier run that is not finished (nothing of it ran), done, paused,
    /// or pending (a step of it is not done).
    ChainRunStatus, "chain run status", {
        Waiting = "waiting",
        Done = "done",
        Paused = "paused",
        Pending = "pending",
    }
);

status!(
    /// A launch: running until its work ends (done, paused, in conflict, failed) or
    /// stop_launch stops it.
    LaunchStatus, "launch status", {
        Running = "running",
        Done = "done",
        Paused = "paused",
        Conflict = "conflict",
        Failed = "failed",
        Stopped = "stopped",
    }
);

status!(
    /// How one run of a launch's worker ended (launch_run.outcome): pending when the
    /// chunks left were all held by its fellow workers; interrupted when its process
    /// ended without saying (terminated, a crash, a restart).
    RunOutcome, "run outcome", {
        Done = "done",
        Pending = "pending",
        Paused = "paused",
        Conflict = "conflict",
        Failed = "failed",
        Stopped = "stopped",
        Interrupted = "interrupted",
    }
);

status!(
    /// Who started a run of a launch's worker (launch_run.started_by): the launch itself,
    /// or, once an earlier process of the worker ended without saying how or a pause of
    /// its work ended, the database's supervisor or resume_launches.
    StartedBy, "started_by", {
        Launch = "launch",
        Resume = "resume",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_text() {
        for s in StepStatus::ALL {
            assert_eq!(StepStatus::parse(s.as_str()).unwrap(), *s);
        }
        for s in JobStatus::ALL {
            assert_eq!(JobStatus::parse(s.as_str()).unwrap(), *s);
        }
        for s in AttemptOutcome::ALL {
            assert_eq!(AttemptOutcome::parse(s.as_str()).unwrap(), *s);
        }
        for s in ChainRunStatus::ALL {
            assert_eq!(ChainRunStatus::parse(s.as_str()).unwrap(), *s);
        }
        for s in LaunchStatus::ALL {
            assert_eq!(LaunchStatus::parse(s.as_str()).unwrap(), *s);
        }
        for s in RunOutcome::ALL {
            assert_eq!(RunOutcome::parse(s.as_str()).unwrap(), *s);
        }
        for s in StartedBy::ALL {
            assert_eq!(StartedBy::parse(s.as_str()).unwrap(), *s);
        }
        assert!(StepStatus::parse("running").is_err());
        assert!(JobStatus::parse("paused").is_err());
        assert!(StartedBy::parse("step").is_err());
    }
}
