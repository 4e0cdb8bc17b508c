//! Chains: add_step, reset_batch, retry_step, and the procedure exec_batch_from_id.

use crate::chain::step::StepKind;
use crate::chain::{runner, runs, steps};
use crate::error::{required, OrRaise};
use crate::halt;
use crate::launch::AuthorWorker;
use crate::lease::Fence;
use crate::pauses;
use crate::procedure::{c_procedure, results};
use crate::status::ChainRunStatus;
use crate::txn::Transactions;
use pgrx::datum::Interval;
use pgrx::prelude::*;

/// Adds a step to a batch; it will run as the role calling add_step.
#[pg_extern(volatile, parallel_unsafe)]
fn add_step(
    batch: Option<String>,
    command: Option<String>,
    id: default!(Option<i64>, "NULL"),
    commits: default!(Option<bool>, false),
    timeout: default!(Option<Interval>, "NULL"),
    max_attempts: default!(Option<i32>, 1),
) -> i64 {
    crate::standby::refuse_writes("etc_batch.add_step").or_raise();
    let batch = required(batch, "batch").or_raise();
    let command = required(command, "command").or_raise();
    let options = steps::Options {
        kind: StepKind::of(required(commits, "commits").or_raise()),
        timeout,
        max_attempts: required(max_attempts, "max_attempts").or_raise(),
    };
    steps::add(&batch, &command, id, options).or_raise()
}

/// Puts every step of a batch back to pending for its next run; step_audit keeps the
/// history. Returns the number of steps reset.
#[pg_extern(volatile, parallel_unsafe)]
fn reset_batch(batch: Option<String>) -> i32 {
    crate::standby::refuse_writes("etc_batch.reset_batch").or_raise();
    steps::reset(&required(batch, "batch").or_raise()).or_raise()
}

/// Puts a failed step back to pending, so that the next run of its chain runs it again.
#[pg_extern(volatile, parallel_unsafe)]
fn retry_step(id: Option<i64>) {
    crate::standby::refuse_writes("etc_batch.retry_step").or_raise();
    steps::retry(required(id, "id").or_raise()).or_raise()
}

/// Pauses a batch: a runner at work stops after the step in flight, and runs stop
/// before its first pending step until resume_batch.
#[pg_extern(volatile, parallel_unsafe)]
fn pause_batch(batch: Option<String>) {
    crate::standby::refuse_writes("etc_batch.pause_batch").or_raise();
    let batch = required(batch, "batch").or_raise();
    if !pauses::pause_batch(&batch).or_raise() {
        notice!("batch \"{batch}\" was already paused; nothing changed");
    }
}

/// Lets a paused batch go on.
#[pg_extern(volatile, parallel_unsafe)]
fn resume_batch(batch: Option<String>) {
    crate::standby::refuse_writes("etc_batch.resume_batch").or_raise();
    let batch = required(batch, "batch").or_raise();
    runs::check_resumable(&batch).or_raise();
    if !pauses::resume_batch(&batch).or_raise() {
        notice!("batch \"{batch}\" was not paused; nothing changed");
    }
    crate::launch::start::resume_paused(None, Some(&batch)).or_raise();
}

/// Defines a chain whose runs run_chain makes: its steps are those added with add_step
/// under its name, which never run themselves.
#[pg_extern(volatile, parallel_unsafe)]
fn define_chain(
    chain: Option<String>,
    time_zone: default!(Option<String>, "NULL"),
    overlap: default!(Option<bool>, false),
) {
    crate::standby::refuse_writes("etc_batch.define_chain").or_raise();
    let chain = required(chain, "chain").or_raise();
    let overlap = required(overlap, "overlap").or_raise();
    runs::define(&chain, time_zone.as_deref(), overlap).or_raise()
}

/// Ends a run of a chain on purpose: it never runs again, and a later run no longer
/// waits for it.
#[pg_extern(volatile, parallel_unsafe)]
fn abandon_run(chain: Option<String>, run_key: Option<String>) {
    crate::standby::refuse_writes("etc_batch.abandon_run").or_raise();
    let chain = required(chain, "chain").or_raise();
    let run_key = required(run_key, "run_key").or_raise();
    if !runs::abandon(&chain, &run_key).or_raise() {
        notice!("run \"{run_key}\" of chain \"{chain}\" was abandoned already; nothing changed");
    }
}

/// The run key of the run whose step is running in this session, NULL outside one: a
/// step's SQL names its own run's work with it.
#[pg_extern(stable, parallel_safe)]
fn current_run() -> Option<String> {
    runs::current()
}

results! {
    /// What one CALL of run_chain did: the run's batch, and how it stands after the call.
    pub struct RunResult {
        pub run: Option<String>,
        pub status: &'static str,
    }
}

// `CALL etc_batch.run_chain(...)`, declared in sql/procedures.sql.
c_procedure!(
    etc_batch_run_chain,
    pg_finfo_etc_batch_run_chain,
    |args, tx| {
        let chain: String = args.required("chain")?;
        let run_key: Option<String> = args.get("run_key")?;
        let fence = Fence::from_args(
            args.get("lease_name")?,
            args.get("lease_holder")?,
            args.get("lease_generation")?,
        )?;
        match runs::start(&chain, run_key.as_deref())? {
            runs::Start::Wait(run) => Ok(RunResult {
                run: Some(run.batch),
                status: ChainRunStatus::Waiting.as_str(),
            }),
            runs::Start::Run(run) => {
                // the run is there for every other caller before any of its steps runs
                tx.commit();
                let options = runner::Options {
                    wait: true,
                    fence,
                    halt: &halt::Never,
                    delegate: &AuthorWorker,
                };
                runner::exec_batch_from_id(tx, run.first_step, options)?;
                Ok(RunResult {
                    status: runs::status(&run.batch)?.as_str(),
                    run: Some(run.batch),
                })
            }
        }
    }
);

// `CALL etc_batch.exec_batch_from_id(...)`, declared in sql/procedures.sql.
c_procedure!(
    etc_batch_exec_batch_from_id,
    pg_finfo_etc_batch_exec_batch_from_id,
    |args, tx| {
        let first = args.required("p_id")?;
        let options = runner::Options {
            wait: args.required("wait")?,
            fence: Fence::from_args(
                args.get("lease_name")?,
                args.get("lease_holder")?,
                args.get("lease_generation")?,
            )?,
            halt: &halt::Never,
            delegate: &AuthorWorker,
        };
        runner::exec_batch_from_id(tx, first, options)
    }
);

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// add_step with its defaults: a plain step, no timeout, one attempt.
    fn add(batch: Option<&str>, command: &str, id: Option<i64>) -> i64 {
        crate::api::chain::add_step(
            batch.map(Into::into),
            Some(command.into()),
            id,
            Some(false),
            None,
            Some(1),
        )
    }

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
        assert_eq!(add(Some("t"), "SELECT 1", Some(41)), 41);
        assert_eq!(add(Some("t"), "SELECT 2", None), 42);
        assert_eq!(status(42), "pending");
        let adder = Spi::get_one::<bool>(
            "SELECT added_by = current_user::regrole FROM etc_batch.batch_log WHERE id = 42",
        );
        assert_eq!(adder, Ok(Some(true)));
    }

    #[pg_test(error = "step command has a syntax error")]
    fn add_step_rejects_a_command_that_does_not_parse() {
        add(Some("t"), "SELEC 1", None);
    }

    #[pg_test(error = "invalid step command")]
    fn add_step_rejects_transaction_control() {
        add(Some("t"), "INSERT INTO x VALUES (1); COMMIT", None);
    }

    #[pg_test(error = "argument \"batch\" must not be null")]
    fn add_step_rejects_null_batch() {
        add(None, "SELECT 1", None);
    }

    #[pg_test]
    fn reset_and_retry_move_steps_back_to_pending() {
        let a = add(Some("r"), "SELECT 1", None);
        let b = add(Some("r"), "SELECT 2", None);
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
