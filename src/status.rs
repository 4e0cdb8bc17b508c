//! The states etc_batch keeps as text in its tables, as Rust enums: one variant per value
//! of the domains etc_batch.step_status and etc_batch.job_status (sql/bootstrap.sql).

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
                        concat!("unknown ", $what, " status \"{}\""),
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
    StepStatus, "step", {
        Pending = "pending",
        Done = "done",
        Failed = "failed",
    }
);

status!(
    /// A job: pending until its last chunk commits, or stopped for good.
    JobStatus, "job", {
        Pending = "pending",
        Done = "done",
        Conflict = "conflict",
        Corrupt = "corrupt",
        Aborted = "aborted",
        Continued = "continued",
        Reverted = "reverted",
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
        assert!(StepStatus::parse("running").is_err());
        assert!(JobStatus::parse("paused").is_err());
    }
}
