//! A worker process of a launch: connected as the role that launched it, it waits for
//! the launching transaction to end, takes its worker's lock (or ends, when another
//! process is that worker), begins a run, drains the job or runs the chain through the
//! same code a CALL runs, and records how the run ended (and, when the work ended, the
//! launch).

use super::bgw::{self, LaunchWorker, Task, WorkerStart};
use super::start::AuthorWorker;
use super::{slot, sql, WhenLaunchEnds};
use crate::chain::runner;
use crate::error::{BatchError, Result};
use crate::halt;
use crate::job::run::drain;
use crate::query;
use crate::roles::as_owner;
use crate::session_lock::{SessionLock, Space};
use crate::status::{JobStatus, LaunchStatus, RunOutcome};
use crate::txn::worker::{in_transaction, run_loop};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CString;

query::row_reader! {
    /// A launch as LAUNCH reads it.
    pub(super) struct Launch {
        pub(super) job_id: Option<String>,
        pub(super) step_id: Option<i64>,
        pub(super) workers: i32 = 0,
        pub(super) launching_xid: String = String::new(),
        pub(super) client_min_messages: String = String::new(),
        pub(super) status: String = String::new(),
    }
}

/// What a launch runs, as its worker read it.
enum Work {
    Job(String),
    Chain(i64),
}

/// The run a worker begins.
struct Run {
    launch_id: i64,
    worker: i32,
    run: i32,
    work: Work,
    /// The launching session's client_min_messages.
    client_min_messages: String,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    outcome: RunOutcome,
    sqlstate: Option<String>,
    message: Option<String>,
}

impl Outcome {
    fn plain(outcome: RunOutcome) -> Outcome {
        Outcome {
            outcome,
            sqlstate: None,
            message: None,
        }
    }

    /// The launch's status a run that ended so ends it with, if it does.
    fn ends_launch(&self) -> Option<LaunchStatus> {
        match self.outcome {
            RunOutcome::Done => Some(LaunchStatus::Done),
            RunOutcome::Paused => Some(LaunchStatus::Paused),
            RunOutcome::Conflict => Some(LaunchStatus::Conflict),
            RunOutcome::Failed => Some(LaunchStatus::Failed),
            RunOutcome::Pending | RunOutcome::Stopped | RunOutcome::Interrupted => None,
        }
    }
}

/// The entry point of a worker process: its launch (or its step) is the argument, who
/// it is in bgw_extra (bgw::WorkerStart).
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn etc_batch_worker_main(arg: pg_sys::Datum) {
    let argument = arg.value() as i64;
    let Some(start) = WorkerStart::read(argument, BackgroundWorker::get_extra()) else {
        log!("etc_batch worker of launch {argument}: its start could not be read; it ends");
        return;
    };
    bgw::take_signals();
    bgw::connect(start.database, start.role);
    let me = match start.task {
        Task::Step { step_id } => return run_step(step_id),
        Task::Launch(me) => me,
    };
    let launch_id = me.launch_id;
    // what the launching transaction did is seen only once it has ended: committed, the
    // launch is there; rolled back, it is not, and the worker ends
    in_transaction(|| wait_for(me.xid));
    let Some(_worker) =
        in_transaction(|| SessionLock::try_exclusive(Space::Worker, slot(launch_id, me.worker)))
    else {
        // another process is this worker already
        return;
    };
    // the database's supervisor, which starts this worker again if it dies, runs
    let run = match in_transaction(|| {
        super::start::ensure_supervisor()?;
        as_owner(|| begin(&me))
    }) {
        Ok(Some(run)) => run,
        Ok(None) => return,
        Err(e) => {
            log!(
                "etc_batch worker {} of launch {launch_id} cannot begin: {}",
                me.worker,
                e.report().message
            );
            return;
        }
    };
    messages_as_the_client_had_them(&run.client_min_messages);
    let statement = match &run.work {
        Work::Job(job) => format!(
            "etc_batch worker {} of launch {launch_id}: drain_job({})",
            run.worker,
            pgrx::spi::quote_literal(job)
        ),
        Work::Chain(step) => format!(
            "etc_batch worker {} of launch {launch_id}: exec_batch_from_id({step})",
            run.worker
        ),
    };
    show_statement(&statement);
    // the work stops before its next chunk or step once the launch no longer runs
    let halt = WhenLaunchEnds(launch_id);
    let ended = run_loop(|tx| match &run.work {
        Work::Job(job) => {
            let options = drain::Options {
                max_chunks: None,
                fence: None,
                // a worker outlasts a closed window, holding nothing
                at_window_close: drain::AtWindowClose::Wait,
                halt: &halt,
            };
            drain::drain(tx, job, options).map(|d| match d.ended {
                drain::Ended::Paused => Outcome::plain(RunOutcome::Paused),
                ended if ended.job_status() == JobStatus::Done => Outcome::plain(RunOutcome::Done),
                _ => Outcome::plain(RunOutcome::Pending),
            })
        }
        Work::Chain(step) => {
            let options = runner::Options {
                wait: true,
                fence: None,
                halt: &halt,
                delegate: &AuthorWorker,
            };
            runner::exec_batch_from_id(tx, *step, options)
                .map(|()| Outcome::plain(RunOutcome::Done))
        }
    });
    let outcome = match ended {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(error)) => failed(&error),
        Err(failure) if failure.kind() == crate::txn::FailureKind::Interrupted => Outcome {
            outcome: RunOutcome::Interrupted,
            sqlstate: Some(failure.sqlstate()),
            message: Some(failure.message),
        },
        Err(failure) => Outcome {
            outcome: RunOutcome::Failed,
            sqlstate: Some(failure.sqlstate()),
            message: Some(failure.message),
        },
    };
    match in_transaction(|| as_owner(|| end(&run, outcome.clone()))) {
        Ok(recorded) => log!(
            "etc_batch worker {} of launch {launch_id} ended: {}{}",
            run.worker,
            recorded.outcome,
            recorded
                .message
                .as_ref()
                .map(|m| format!(" ({}: {m})", recorded.sqlstate.as_deref().unwrap_or("")))
                .unwrap_or_default()
        ),
        Err(e) => log!(
            "etc_batch worker {} of launch {launch_id} could not record how it ended ({}): {}",
            run.worker,
            outcome.outcome,
            e.report().message
        ),
    }
}

/// A worker connected as a step's author, for a runner that may not run the step itself
/// and waits for this process to end: it runs the step alone, as a runner of it would,
/// recording its outcome in the step's row and audit, and nothing else.
fn run_step(step_id: i64) {
    show_statement(&format!("etc_batch worker: step {step_id}"));
    // the runner that waits for it stops the chain when it should; this worker is
    // connected as the step's author, and never hands the step on
    let options = runner::Options {
        wait: true,
        fence: None,
        halt: &halt::Never,
        delegate: &AuthorWorker,
    };
    let outcome = match run_loop(|tx| runner::run_step_alone(tx, step_id, options)) {
        Ok(Ok(())) => "ran".to_string(),
        Ok(Err(e)) => e.report().message,
        Err(failure) => format!("{}: {}", failure.sqlstate(), failure.message),
    };
    log!("etc_batch worker for step {step_id} ended: {outcome}");
}

/// Waits for the launching transaction `xid` to end, as a row lock's waiter would.
fn wait_for(xid: u64) {
    let xid = pg_sys::TransactionId::from(xid as u32);
    // SAFETY: inside a transaction, which the wait's lock needs
    unsafe {
        if pg_sys::TransactionIdIsInProgress(xid) {
            pg_sys::XactLockTableWait(
                xid,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                pg_sys::XLTW_Oper::XLTW_None,
            );
        }
    }
}

/// The run this worker begins, or None when there is nothing to do: the launch was
/// rolled back (or another launch has its id), it no longer runs, or it has fewer
/// workers.
fn begin(me: &LaunchWorker) -> Result<Option<Run>> {
    let launch_id = me.launch_id;
    crate::installed::owner()?;
    let Some((launch, status)) = query::row(sql::LAUNCH, &[launch_id.into()], |r| {
        let launch = Launch::read(r)?;
        let status = LaunchStatus::parse(&launch.status)?;
        Ok((launch, status))
    })?
    else {
        return Ok(None);
    };
    let Launch {
        job_id: job,
        step_id: step,
        workers,
        launching_xid: xid,
        client_min_messages,
        ..
    } = launch;
    if xid != me.xid.to_string() || status != LaunchStatus::Running || me.worker > workers {
        return Ok(None);
    }
    let work = match (job, step) {
        (Some(job), _) => Work::Job(job),
        (None, Some(step)) => Work::Chain(step),
        (None, None) => return Ok(None),
    };
    let run = query::one::<i32>(
        sql::BEGIN_RUN,
        &[
            launch_id.into(),
            me.worker.into(),
            me.started_by.as_str().into(),
        ],
    )?
    .unwrap_or(1);
    Ok(Some(Run {
        launch_id,
        worker: me.worker,
        run,
        work,
        client_min_messages,
    }))
}

/// How a run that returned an error ended.
fn failed(error: &BatchError) -> Outcome {
    let report = error.report();
    Outcome {
        outcome: match error {
            BatchError::JobConflict { .. } => RunOutcome::Conflict,
            _ => RunOutcome::Failed,
        },
        sqlstate: Some(crate::txn::unpack_sqlstate(report.code as i32)),
        message: Some(report.message),
    }
}

/// Records how the run ended; and, when its work ended (done, paused, in conflict,
/// failed), the launch, unless it ended already. A run that stopped for its launch
/// having ended is pending when a fellow worker finished the work (nothing was left for
/// it), and stopped otherwise (stop_launch, or a fellow worker's conflict or failure),
/// whatever the work said.
fn end(run: &Run, mut outcome: Outcome) -> Result<Outcome> {
    let status = query::row(sql::LAUNCH, &[run.launch_id.into()], |r| {
        LaunchStatus::parse(&Launch::read(r)?.status)
    })?
    // a launch deleted under its worker is as one stopped
    .unwrap_or(LaunchStatus::Stopped);
    if status != LaunchStatus::Running
        && matches!(
            outcome.outcome,
            RunOutcome::Paused | RunOutcome::Pending | RunOutcome::Done
        )
    {
        outcome = Outcome::plain(after_launch_ended(status, outcome.outcome));
    } else if outcome.outcome == RunOutcome::Done {
        if let Work::Chain(step) = run.work {
            // a chain's run returns when it is done or when its batch is paused
            if query::one::<bool>(sql::CHAIN_PAUSED, &[step.into()])?.unwrap_or(false) {
                outcome = Outcome::plain(RunOutcome::Paused);
            }
        }
    }
    query::run(
        sql::END_RUN,
        &[
            run.launch_id.into(),
            run.worker.into(),
            run.run.into(),
            outcome.outcome.as_str().into(),
            outcome.sqlstate.as_deref().into(),
            outcome.message.as_deref().into(),
        ],
    )?;
    let mut ends = outcome.ends_launch();
    if ends == Some(LaunchStatus::Paused) {
        // resumed since the worker stopped for it: the launch goes on (the supervisor
        // starts this worker again)
        let (job, step) = match &run.work {
            Work::Job(job) => (Some(job.as_str()), None),
            Work::Chain(step) => (None, Some(*step)),
        };
        if !query::one::<bool>(sql::STILL_PAUSED, &[job.into(), step.into()])?.unwrap_or(false) {
            ends = None;
        }
    }
    if let Some(ended) = ends {
        if query::one::<bool>(
            sql::END_LAUNCH,
            &[run.launch_id.into(), ended.as_str().into()],
        )? == Some(true)
        {
            crate::events::launch(
                run.launch_id,
                "ended",
                serde_json::json!({"status": ended.as_str()}),
            );
        }
    }
    Ok(outcome)
}

/// How a run that stopped for its launch having ended (with `launch_status`) ended,
/// when its own work said `own`.
fn after_launch_ended(launch_status: LaunchStatus, own: RunOutcome) -> RunOutcome {
    match (launch_status, own) {
        (_, RunOutcome::Done) => RunOutcome::Done,
        (LaunchStatus::Done, _) => RunOutcome::Pending,
        _ => RunOutcome::Stopped,
    }
}

/// A worker has no client: what a NOTICE of its work would have shown the launching
/// session (its client_min_messages) goes to the server log instead, by lowering the
/// worker's log_min_messages to it (never raising it).
fn messages_as_the_client_had_them(client_min_messages: &str) {
    // the order log_min_messages ranks levels in (LOG sits above ERROR there)
    const ORDER: [&str; 12] = [
        "debug5", "debug4", "debug3", "debug2", "debug1", "info", "notice", "warning", "error",
        "log", "fatal", "panic",
    ];
    // a client at "log" sees notices and more: the log takes notices then
    let wanted = match client_min_messages {
        "log" => "notice",
        other => other,
    };
    let rank = |level: &str| ORDER.iter().position(|l| *l == level);
    let current = crate::settings::current(c"log_min_messages").unwrap_or_default();
    if let (Some(wanted_rank), Some(current_rank)) = (rank(wanted), rank(&current)) {
        if wanted_rank < current_rank {
            crate::settings::set_for_process(c"log_min_messages", wanted);
        }
    }
}

/// What pg_stat_activity and the log show as the worker's statement.
fn show_statement(statement: &str) {
    if let Ok(text) = CString::new(statement) {
        // SAFETY: the text is kept for the life of the process, as debug_query_string
        // must be while the work runs.
        unsafe { pg_sys::debug_query_string = text.into_raw() };
    }
}

#[cfg(test)]
mod tests {
    use super::after_launch_ended;
    use crate::status::{LaunchStatus as Launch, RunOutcome as Run};

    #[test]
    fn a_run_stopped_by_its_launch_ending_says_why() {
        // a fellow worker finished the job before this one took another chunk
        assert_eq!(after_launch_ended(Launch::Done, Run::Pending), Run::Pending);
        assert_eq!(after_launch_ended(Launch::Done, Run::Paused), Run::Pending);
        assert_eq!(after_launch_ended(Launch::Done, Run::Done), Run::Done);
        // stop_launch, or a fellow worker's conflict or failure
        assert_eq!(
            after_launch_ended(Launch::Stopped, Run::Pending),
            Run::Stopped
        );
        assert_eq!(
            after_launch_ended(Launch::Conflict, Run::Paused),
            Run::Stopped
        );
        assert_eq!(after_launch_ended(Launch::Failed, Run::Done), Run::Done);
    }
}
