//! The SQL side of launches: launch_job and launch_batch (a launch written and its
//! workers started, all of them or none), stop_launch, and resume_launches (what a
//! supervisor does, on demand).

use super::bgw::{self, LaunchWorker, Task, WorkerStart};
use super::worker::Launch;
use super::{preloaded, slot, sql, MAX_WORKERS, MAX_WORKERS_PER_LAUNCH};
use crate::access::{self, Of, Right};
use crate::chain::runner::StepDelegate;
use crate::error::{BatchError, Result};
use crate::job::lifecycle;
use crate::pauses::role_name;
use crate::query;
use crate::roles::{as_owner, current_user};
use crate::session_lock::{self, Space};
use crate::status::{JobStatus, LaunchStatus, StartedBy};
use crate::txn::Transactions;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// What a launch runs.
#[derive(Debug, Clone, Copy)]
pub enum Work<'a> {
    /// A job, drained to the end.
    Job(&'a str),
    /// A chain, run from this step to its end.
    Chain(i64),
}

impl Work<'_> {
    /// The procedure a CALL of the same work would run, whose EXECUTE the launching role
    /// needs: the launch runs it as that role.
    fn procedure(&self) -> &'static str {
        match self {
            Work::Job(_) => "etc_batch.drain_job(text, integer, text, text, bigint, integer, bigint, text, text, text)",
            Work::Chain(_) => "etc_batch.exec_batch_from_id(bigint, boolean, text, text, bigint)",
        }
    }
}

query::row_reader! {
    /// What MAY_LAUNCH reads of the launching role.
    struct MayLaunch {
        can_login: bool = false,
        may_execute: bool = false,
    }
}

query::row_reader! {
    /// A launch as INSERT_LAUNCH returns it.
    struct Written {
        launch_id: i64 = 0,
        launching_xid: String = String::new(),
    }
}

query::row_reader! {
    /// A job as JOB_TO_LAUNCH reads it.
    struct JobToLaunch {
        status: String = String::new(),
        parallel: bool = false,
    }
}

query::row_reader! {
    /// The workers WORKERS_IN_USE counts.
    struct WorkersInUse {
        running: i32 = 0,
        in_use: i32 = 0,
    }
}

query::row_reader! {
    /// A lock as HELD_LOCKS reads it.
    struct HeldLock {
        id: i64 = -1,
    }
}

query::row_reader! {
    /// What STOP_LAUNCH returns: whether the launch stopped now.
    struct Stopped {
        stopped: bool = false,
    }
}

query::row_reader! {
    /// A launch as RUNNING_LAUNCHES reads it.
    struct RunningLaunch {
        launch_id: i64 = 0,
        workers: i32 = 0,
        launched_by: pg_sys::Oid = pg_sys::Oid::INVALID,
        launching_xid: String = String::new(),
        /// Whether it is of the last ten seconds.
        young: bool = false,
    }
}

/// What a launch started.
pub struct Launched {
    pub launch_id: i64,
    pub workers: i32,
    /// The workers' pids, in the order of their numbers.
    pub pids: Vec<i32>,
}

/// Writes a launch of `work` with `workers` workers and starts them. They act once this
/// transaction commits. Either every worker starts or the call fails (53400) and none
/// does: the launch is rolled back with the transaction, and a worker that started
/// finds no launch and ends.
pub fn launch(work: Work, workers: i32) -> Result<Launched> {
    if !(1..=MAX_WORKERS_PER_LAUNCH).contains(&workers) {
        return Err(BatchError::invalid_because(
            format!("workers {workers} is out of range"),
            format!("A launch has 1 to {MAX_WORKERS_PER_LAUNCH} workers."),
        ));
    }
    if let Work::Job(job_id) = work {
        access::require(Of::Job(job_id), Right::Act("launch"))?;
    }
    check(work, workers)?;
    let role = current_user();
    let (can_login, may_execute) = query::row(
        sql::MAY_LAUNCH,
        &[role.into(), work.procedure().into()],
        |r| MayLaunch::read(r).map(|m| (m.can_login, m.may_execute)),
    )?
    .unwrap_or_default();
    if !may_execute {
        return Err(BatchError::PermissionDenied {
            message: format!("permission denied for procedure {}", work.procedure().split('(').next().unwrap_or_default()),
            detail: "A launch's workers run the work as a CALL of it would, with the privileges of the role that launches them.".into(),
        });
    }
    if !can_login && pg_sys::PG_VERSION_NUM < 170000 {
        return Err(BatchError::LaunchRoleCannotLogIn {
            role: role_name(role),
        });
    }
    // launches are counted one after another in the whole cluster, each holding this
    // lock until it commits, by when its workers show in pg_stat_activity
    session_lock::transaction_lock(Space::Launches, 0);
    let (running, in_use) = workers_in_use()?;
    let max = MAX_WORKERS.get();
    if running + workers > max {
        return Err(BatchError::TooManyWorkers {
            asked: workers,
            running,
            max,
        });
    }
    let (job, step) = match work {
        Work::Job(job) => (Some(job), None),
        Work::Chain(step) => (None, Some(step)),
    };
    let client_min_messages = crate::settings::current(c"client_min_messages").unwrap_or_default();
    let Written {
        launch_id,
        launching_xid: xid,
    } = as_owner(|| {
        query::row(
            sql::INSERT_LAUNCH,
            &[
                job.into(),
                step.into(),
                workers.into(),
                role.into(),
                client_min_messages.as_str().into(),
            ],
            Written::read,
        )
    })?
    .ok_or_else(|| BatchError::Internal("a launch was not written".into()))?;
    crate::events::launch(
        launch_id,
        "started",
        serde_json::json!({"job_id": job, "step": step, "workers": workers,
                           "by": crate::pauses::role_name(role)}),
    );
    let xid: u64 = xid
        .parse()
        .map_err(|_| BatchError::Internal(format!("a launching transaction id reads {xid}")))?;
    let mut pids = Vec::with_capacity(workers as usize);
    for worker in 1..=workers {
        let start = WorkerStart::here(
            role,
            Task::Launch(LaunchWorker {
                launch_id,
                worker,
                xid,
                started_by: StartedBy::Launch,
            }),
        );
        match bgw::start_worker(&start)? {
            Some(pid) => pids.push(pid),
            None => {
                return Err(BatchError::NoWorkerSlot {
                    asked: workers,
                    started: worker - 1,
                    max_worker_processes: crate::settings::current(c"max_worker_processes")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0),
                    in_use: in_use + worker - 1,
                })
            }
        }
    }
    await_shown(&pids)?;
    ensure_supervisor()?;
    if !preloaded() {
        notice!(
            "etc_batch is not in shared_preload_libraries: after a restart of the server, launch {launch_id} goes on only when etc_batch.resume_launches() is called (docs/launches.md)"
        );
    }
    Ok(Launched {
        launch_id,
        workers,
        pids,
    })
}

/// The work must be able to go on, and by that many workers.
fn check(work: Work, workers: i32) -> Result<()> {
    match work {
        Work::Job(job_id) => {
            let JobToLaunch { status, parallel } =
                as_owner(|| query::row(sql::JOB_TO_LAUNCH, &[job_id.into()], JobToLaunch::read))?
                    .ok_or_else(|| BatchError::UnknownJob { job: job_id.into() })?;
            match JobStatus::parse(&status)? {
                JobStatus::Pending => {}
                stopped => return Err(lifecycle::refusal(job_id, stopped)?),
            }
            if !parallel && workers > 1 {
                return Err(BatchError::SequentialWorkers {
                    job: job_id.into(),
                    workers,
                });
            }
        }
        Work::Chain(step) => {
            as_owner(|| query::one::<String>(sql::STEP_TO_LAUNCH, &[step.into()]))?
                .ok_or(BatchError::UnknownStep { id: step })?;
            if workers > 1 {
                return Err(BatchError::invalid_because(
                    format!("a chain is run by one worker, not {workers}"),
                    "A chain's steps run one after another.",
                ));
            }
        }
    }
    Ok(())
}

/// etc_batch's workers at work in the cluster, and every background worker.
fn workers_in_use() -> Result<(i32, i32)> {
    Ok(query::row(sql::WORKERS_IN_USE, &[bgw::WORKER.into()], |r| {
        WorkersInUse::read(r).map(|w| (w.running, w.in_use))
    })?
    .unwrap_or_default())
}

/// Waits (a few seconds at most) until the started workers show in pg_stat_activity,
/// where the next launch counts them.
fn await_shown(pids: &[i32]) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        // pg_stat_activity is read once per transaction unless told to read it again
        query::run("SELECT pg_catalog.pg_stat_clear_snapshot()", &[])?;
        if query::one::<bool>(sql::ALL_SHOWN, &[pids.to_vec().into()])?.unwrap_or(false) {
            break;
        }
        crate::txn::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The ids of the locks of `space` that sessions of this database hold now.
pub(super) fn held(space: Space) -> Result<std::collections::HashSet<i64>> {
    Ok(
        query::rows(sql::HELD_LOCKS, &[(space as i32).into()], 0, |r| {
            HeldLock::read(r).map(|l| l.id)
        })?
        .into_iter()
        .collect(),
    )
}

/// Starts this database's supervisor, unless one runs.
pub(super) fn ensure_supervisor() -> Result<()> {
    if !held(Space::Supervisor)?.contains(&0) {
        // SAFETY: reads the backend's database
        bgw::start_supervisor(unsafe { pg_sys::MyDatabaseId })?;
    }
    Ok(())
}

/// stop_launch: the launch stops running; its workers end after the chunk or step in
/// flight. Whether it ran (a NOTICE says so otherwise).
pub fn stop(launch_id: i64) -> Result<bool> {
    access::require(Of::Launch(launch_id), Right::Act("stop"))?;
    let caller = current_user();
    let status = as_owner(|| {
        query::row(sql::LAUNCH, &[launch_id.into()], |r| {
            LaunchStatus::parse(&Launch::read(r)?.status)
        })
    })?
    .ok_or(BatchError::UnknownLaunch { id: launch_id })?;
    if status != LaunchStatus::Running {
        notice!("launch {launch_id} is already {status}; nothing changed");
        return Ok(false);
    }
    let stopped = as_owner(|| {
        query::row(sql::STOP_LAUNCH, &[launch_id.into(), caller.into()], |r| {
            Stopped::read(r).map(|s| s.stopped)
        })
    })?
    .unwrap_or(false);
    if stopped {
        crate::events::launch(
            launch_id,
            "ended",
            serde_json::json!({"status": LaunchStatus::Stopped.as_str(),
                               "by": crate::pauses::role_name(caller)}),
        );
    }
    Ok(stopped)
}

/// The chain runner's delegate, for a CALL and a worker alike: a step that commits,
/// added by another role, is run alone by a worker connected as its author, as a runner
/// of it would (chain::runner::run_step_alone), while the runner waits for it to end.
/// The runner's transaction is committed once the worker runs, so that the runner holds
/// nothing of the step's while it does; the runner then reads the step again.
pub struct AuthorWorker;

impl StepDelegate for AuthorWorker {
    fn run_as_author(
        &self,
        tx: &mut dyn Transactions,
        step_id: i64,
        author: pg_sys::Oid,
        batch: &str,
    ) -> Result<()> {
        run_step_as_author(tx, step_id, author, batch)
    }
}

fn run_step_as_author(
    tx: &mut dyn Transactions,
    step_id: i64,
    author: pg_sys::Oid,
    batch: &str,
) -> Result<()> {
    let refused = |reason: String| BatchError::NoStepWorker {
        id: step_id,
        batch: batch.into(),
        reason,
    };
    let can_login = query::one::<bool>(sql::ROLE_CAN_LOGIN, &[author.into()])?.unwrap_or(false);
    if !can_login && pg_sys::PG_VERSION_NUM < 170000 {
        return Err(refused(format!(
            "its author, role \"{}\", cannot log in, and on PostgreSQL 15 and 16 a background worker connects only as a role that can",
            role_name(author)
        )));
    }
    session_lock::transaction_lock(Space::Launches, 0);
    let (running, in_use) = workers_in_use()?;
    let max = MAX_WORKERS.get();
    if running >= max {
        return Err(refused(format!(
            "etc_batch.max_workers is {max}, and {running} of etc_batch's workers run now"
        )));
    }
    let start = WorkerStart::here(author, Task::Step { step_id });
    let Some(worker) = bgw::start_step_worker(&start)? else {
        return Err(refused(format!(
            "max_worker_processes is {}, and {in_use} background workers run now",
            crate::settings::current(c"max_worker_processes").unwrap_or_default()
        )));
    };
    tx.commit();
    // interrupted (a cancel, a timeout), the runner ends here; the worker goes on, and
    // the step's own lock keeps any other runner out of it until it is done
    let _ = worker.wait_for_shutdown();
    Ok(())
}

/// A worker started by resume_launches or a supervisor.
pub struct Resumed {
    pub launch_id: i64,
    pub worker: i32,
    pub pid: i32,
}

/// Starts again, for every launch of this database that runs, each worker that is not
/// at work (its process ended without saying how: terminated, a crash, a restart), as
/// far as etc_batch.max_workers allows. `patient`: leave alone a worker of a launch of
/// the last few seconds that has begun no run yet (it may still be starting). Run as
/// the owner.
pub fn resume(patient: bool, skip: impl Fn(i64, i32) -> bool) -> Result<Vec<Resumed>> {
    let launches = query::rows(sql::RUNNING_LAUNCHES, &[], 0, RunningLaunch::read)?;
    let mut resumed = Vec::new();
    let at_work = held(Space::Worker)?;
    for RunningLaunch {
        launch_id,
        workers,
        launched_by: role,
        launching_xid: xid,
        young,
    } in launches
    {
        for worker in 1..=workers {
            if at_work.contains(&slot(launch_id, worker)) || skip(launch_id, worker) {
                continue;
            }
            if patient
                && young
                && query::one::<i64>(sql::RUNS_OF_WORKER, &[launch_id.into(), worker.into()])?
                    .unwrap_or(0)
                    == 0
            {
                continue;
            }
            query::run(sql::INTERRUPTED, &[launch_id.into(), worker.into()])?;
            let (running, _) = workers_in_use()?;
            if running >= MAX_WORKERS.get() {
                // the rest waits for a free worker
                return Ok(resumed);
            }
            let start = WorkerStart::here(
                role,
                Task::Launch(LaunchWorker {
                    launch_id,
                    worker,
                    xid: xid.parse().unwrap_or(0),
                    started_by: StartedBy::Resume,
                }),
            );
            match bgw::start_worker(&start)? {
                Some(pid) => resumed.push(Resumed {
                    launch_id,
                    worker,
                    pid,
                }),
                // no slot of max_worker_processes: the rest waits
                None => return Ok(resumed),
            }
        }
    }
    Ok(resumed)
}

/// resume_job and resume_batch: the launches their pause ended run again, their workers
/// started by the supervisor.
pub fn resume_paused(job: Option<&str>, batch: Option<&str>) -> Result<()> {
    let resumed = as_owner(|| {
        query::rows(sql::RESUME_PAUSED, &[job.into(), batch.into()], 0, |_| {
            Ok(())
        })
    })?;
    if !resumed.is_empty() {
        ensure_supervisor()?;
    }
    Ok(())
}

/// resume_launches: what this database's supervisor does, now, and the supervisor
/// started if none runs while a launch does.
pub fn resume_launches() -> Result<Vec<Resumed>> {
    let resumed = as_owner(|| resume(false, |_, _| false))?;
    // a supervisor only where a launch runs: a schedule that calls this every minute
    // starts no process while there is nothing to watch
    if as_owner(|| query::one::<i64>(sql::RUNNING_COUNT, &[]))?.unwrap_or(0) > 0 {
        ensure_supervisor()?;
    }
    Ok(resumed)
}
