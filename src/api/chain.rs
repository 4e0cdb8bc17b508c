//! Chains: add_step, reset_batch, retry_step, and the procedure exec_batch_from_id.

use crate::chain::{command, runner, sql, step};
use crate::error::{required, BatchError, OrRaise, Result};
use crate::lease::Fence;
use crate::query;
use crate::roles::{as_owner, current_user};
use crate::txn::TxnLoop;
use pgrx::fcinfo::{pg_getarg, pg_return_void};
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Adds a step to a batch; it will run as the role calling add_step.
#[pg_extern(volatile, parallel_unsafe)]
fn add_step(
    batch: Option<String>,
    command: Option<String>,
    id: default!(Option<i64>, "NULL"),
) -> i64 {
    add_step_impl(batch, command, id).or_raise()
}

fn add_step_impl(batch: Option<String>, command: Option<String>, id: Option<i64>) -> Result<i64> {
    let batch = required(batch, "batch")?;
    let command = required(command, "command")?;
    step::check_batch_name(&batch)?;
    if let Some(id) = id.filter(|id| *id < 1) {
        return Err(BatchError::InvalidArgument {
            message: format!("step id {id} is out of range"),
            detail: Some("Step ids are positive.".into()),
        });
    }
    command::check(&command)?;
    let adder = current_user();
    as_owner(|| {
        query::run(sql::LOCK_STEP_IDS, &[])?;
        let id = match id {
            Some(id) => {
                if let Some(batch) = query::one::<String>(sql::STEP_BATCH, &[id.into()])? {
                    return Err(BatchError::StepExists { id, batch });
                }
                id
            }
            None => query::one::<i64>(sql::NEXT_FREE_ID, &[])?.unwrap_or(0) + 1,
        };
        query::one::<i64>(
            sql::INSERT_STEP,
            &[id.into(), batch.into(), command.into(), adder.into()],
        )?
        .ok_or_else(|| BatchError::Internal("INSERT ... RETURNING returned no row".into()))
    })
}

/// Puts every step of a batch back to pending for its next run; step_audit keeps the
/// history. Returns the number of steps reset.
#[pg_extern(volatile, parallel_unsafe)]
fn reset_batch(batch: Option<String>) -> i32 {
    reset_batch_impl(batch).or_raise()
}

fn reset_batch_impl(batch: Option<String>) -> Result<i32> {
    let batch = required(batch, "batch")?;
    let reset = as_owner(|| query::one::<i32>(sql::RESET_BATCH, &[batch.clone().into()]))?;
    match reset.unwrap_or(0) {
        0 => Err(BatchError::UnknownBatch { batch }),
        n => Ok(n),
    }
}

/// Puts a failed step back to pending, so that the next run of its chain runs it again.
#[pg_extern(volatile, parallel_unsafe)]
fn retry_step(id: Option<i64>) {
    retry_step_impl(id).or_raise()
}

fn retry_step_impl(id: Option<i64>) -> Result<()> {
    let id = required(id, "id")?;
    as_owner(|| {
        if query::one::<i64>(sql::RETRY_STEP, &[id.into()])?.is_some() {
            return Ok(());
        }
        match query::one::<String>(sql::STEP_STATUS, &[id.into()])? {
            None => Err(BatchError::UnknownStep { id }),
            Some(status) => Err(BatchError::StepNotFailed { id, status }),
        }
    })
}

// CALL etc_batch.exec_batch_from_id(p_id bigint, wait boolean DEFAULT true,
//                                   lease_name text DEFAULT NULL, lease_holder text DEFAULT NULL,
//                                   lease_generation bigint DEFAULT NULL)
//
// A plain V1 C function rather than a #[pg_extern]: it needs fcinfo->context to know
// whether it may commit, and it is declared as a PROCEDURE in sql/chain.sql.

#[no_mangle]
#[doc(hidden)]
pub extern "C" fn pg_finfo_etc_batch_exec_batch_from_id() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn etc_batch_exec_batch_from_id(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    exec_batch_from_id(fcinfo).or_raise();
    pg_return_void()
}

unsafe fn exec_batch_from_id(fcinfo: pg_sys::FunctionCallInfo) -> Result<()> {
    let mut tx = TxnLoop::begin(fcinfo, "etc_batch.exec_batch_from_id")?;
    let first = required(pg_getarg::<i64>(fcinfo, 0), "p_id")?;
    let wait = required(pg_getarg::<bool>(fcinfo, 1), "wait")?;
    let fence = Fence::from_args(
        pg_getarg(fcinfo, 2),
        pg_getarg(fcinfo, 3),
        pg_getarg(fcinfo, 4),
    )?;
    runner::exec_batch_from_id(&mut tx, first, wait, fence)?;
    tx.finish();
    Ok(())
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn status(id: i64) -> String {
        Spi::get_one_with_args::<String>(
            "SELECT status FROM etc_batch.batch_log WHERE id = $1",
            &[id.into()],
        )
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn add_step_numbers_steps_after_the_highest_id() {
        assert_eq!(
            crate::api::chain::add_step(Some("t".into()), Some("SELECT 1".into()), Some(41)),
            41
        );
        assert_eq!(
            crate::api::chain::add_step(Some("t".into()), Some("SELECT 2".into()), None),
            42
        );
        assert_eq!(status(42), "pending");
        let adder = Spi::get_one::<bool>(
            "SELECT added_by = current_user::regrole FROM etc_batch.batch_log WHERE id = 42",
        );
        assert_eq!(adder, Ok(Some(true)));
    }

    #[pg_test(error = "step command has a syntax error")]
    fn add_step_rejects_a_command_that_does_not_parse() {
        crate::api::chain::add_step(Some("t".into()), Some("SELEC 1".into()), None);
    }

    #[pg_test(error = "invalid step command")]
    fn add_step_rejects_transaction_control() {
        crate::api::chain::add_step(
            Some("t".into()),
            Some("INSERT INTO x VALUES (1); COMMIT".into()),
            None,
        );
    }

    #[pg_test(error = "argument \"batch\" must not be null")]
    fn add_step_rejects_null_batch() {
        crate::api::chain::add_step(None, Some("SELECT 1".into()), None);
    }

    #[pg_test]
    fn reset_and_retry_move_steps_back_to_pending() {
        let a = crate::api::chain::add_step(Some("r".into()), Some("SELECT 1".into()), None);
        let b = crate::api::chain::add_step(Some("r".into()), Some("SELECT 2".into()), None);
        Spi::run_with_args(
            "UPDATE etc_batch.batch_log SET status = 'failed' WHERE id = $1",
            &[b.into()],
        )
        .unwrap();
        Spi::run_with_args(
            "UPDATE etc_batch.batch_log SET status = 'done' WHERE id = $1",
            &[a.into()],
        )
        .unwrap();
        crate::api::chain::retry_step(Some(b));
        assert_eq!(status(b), "pending");
        assert_eq!(status(a), "done");
        assert_eq!(crate::api::chain::reset_batch(Some("r".into())), 2);
        assert_eq!(status(a), "pending");
    }

    #[pg_test(error = "batch \"nope\" does not exist")]
    fn reset_batch_of_unknown_batch_is_an_error() {
        crate::api::chain::reset_batch(Some("nope".into()));
    }
}
