//! A chain never runs itself again: not directly, through a step that commits and CALLs
//! exec_batch_from_id on a step of its own batch, nor through another batch whose steps
//! do. Two checks, both before anything runs:
//! - `check_no_cycle` follows the steps that commit and CALL exec_batch_from_id with a
//!   literal step id, from batch to batch;
//! - `enter` keeps the batches this backend is running, one inside the other, so that a
//!   step id the first check cannot read (an expression, a variable of a procedure) is
//!   caught when the inner CALL starts.

use super::{command, sql};
use crate::error::{BatchError, Result};
use crate::query;
use std::cell::RefCell;

thread_local! {
    static RUNNING: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Takes the batch off the backend's list when the run ends, however it ends.
pub struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.borrow_mut().pop());
    }
}

/// The run of `batch` begins, unless this backend is already running it, further out.
pub fn enter(batch: &str) -> Result<Running> {
    RUNNING.with(|r| {
        let mut running = r.borrow_mut();
        if let Some(at) = running.iter().position(|b| b == batch) {
            let mut path: Vec<String> = running[at..].to_vec();
            path.push(batch.to_string());
            return Err(BatchError::ChainRunsItself {
                batch: batch.to_string(),
                path: path.join(" → "),
            });
        }
        running.push(batch.to_string());
        Ok(Running)
    })
}

query::row_reader! {
    /// A step that commits, as COMMITTING_STEPS reads it.
    struct CommittingStep {
        id: i64 = 0,
        command: String = String::new(),
    }
}

/// Fails when a step that commits, in `batch` or in a batch it runs, runs `batch`
/// again. Run as the extension's owner.
pub fn check_no_cycle(batch: &str) -> Result<()> {
    // (batch, how it was reached from the first)
    let mut queue: Vec<(String, String)> = vec![(batch.to_string(), batch.to_string())];
    let mut seen: Vec<String> = vec![batch.to_string()];
    while let Some((current, path)) = queue.pop() {
        let steps = query::rows(
            sql::COMMITTING_STEPS,
            &[current.as_str().into()],
            0,
            CommittingStep::read,
        )?;
        for CommittingStep { id, command: text } in steps {
            let Some(called) = command::called_step(&text) else {
                continue;
            };
            let Some(target) = query::one::<String>(sql::STEP_BATCH, &[called.into()])? else {
                continue;
            };
            let path = format!("{path} (step {id}) → {target}");
            if target == batch {
                return Err(BatchError::ChainRunsItself {
                    batch: batch.to_string(),
                    path,
                });
            }
            if !seen.contains(&target) {
                seen.push(target.clone());
                queue.push((target, path));
            }
        }
    }
    Ok(())
}
