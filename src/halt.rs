//! What stops a drain or a chain's run between two chunks or steps besides a pause,
//! handed in by whoever runs the work: the loops consult it where they read a pause,
//! and stop the same way, committing what they did. A client's CALL stops only for a
//! pause (`Never`); a launch's worker also stops once its launch no longer runs
//! (launch::WhenLaunchEnds). The loops never ask who runs them.

use crate::error::Result;
use crate::pauses::Paused;

/// A stop signal, read before every chunk or step and during a drain's waits.
pub trait Halt {
    /// Whether the work is to stop now, and why, told as a pause is: who ended it and
    /// when. Read in the round's transaction.
    fn halted(&self) -> Result<Option<Paused>>;
}

/// A client's CALL: nothing but a pause stops it (a cancel ends it as any statement).
pub struct Never;

impl Halt for Never {
    fn halted(&self) -> Result<Option<Paused>> {
        Ok(None)
    }
}
