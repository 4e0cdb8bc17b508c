//! Background worker processes of etc_batch: registering them, and what each does first
//! when it starts (its signals, its connection).
//!
//! Three kinds, each a `bgw_type` of its own (pg_stat_activity.backend_type):
//! - `etc_batch worker`: one worker of a launch, connected as the role that launched it;
//!   never restarted by the postmaster (its database's supervisor starts it again);
//! - `etc_batch supervisor`: one per database with launches running, connected with no
//!   role of a person's: it starts again the workers that ended without saying how, and
//!   ends when nothing runs. Not restarted by the postmaster (a database dropped under
//!   it would make that a loop of failed connections): a launch, a worker of the
//!   database, resume_launches or the launcher starts it when none runs;
//! - `etc_batch launcher`: one per cluster, when the library is preloaded: after a
//!   start, a crash recovery or a promotion, it starts a supervisor in every database.

use crate::error::{BatchError, Result};
use crate::status::StartedBy;
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::pg_sys;
use std::time::Duration;

pub const WORKER: &str = "etc_batch worker";
pub const SUPERVISOR: &str = "etc_batch supervisor";
pub const LAUNCHER: &str = "etc_batch launcher";

/// How long the postmaster waits before it starts again the launcher that died.
const RESTART: Duration = Duration::from_secs(5);

/// Who a worker process is: handed to it when it starts, as its argument (its launch,
/// or its step) and its bgw_extra (text), and read back in one place (`read`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStart {
    pub database: pg_sys::Oid,
    /// The role it connects as: the launching role, or the step's author.
    pub role: pg_sys::Oid,
    pub task: Task,
}

/// What a worker process is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Launch(LaunchWorker),
    /// Step `step_id`, run alone as its author for a runner that waits for this process
    /// to end (launch::AuthorWorker).
    Step {
        step_id: i64,
    },
}

/// One worker of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchWorker {
    pub launch_id: i64,
    /// Which of the launch's workers, from 1.
    pub worker: i32,
    /// The launching transaction's id, waited for before the worker acts.
    pub xid: u64,
    pub started_by: StartedBy,
}

/// What bgw_extra's last word says a step's worker is, in place of a StartedBy.
const STEP: &str = "step";

impl WorkerStart {
    /// A worker in this backend's database, connected as `role`, started for `task`.
    pub fn here(role: pg_sys::Oid, task: Task) -> WorkerStart {
        WorkerStart {
            // SAFETY: reads the backend's database
            database: unsafe { pg_sys::MyDatabaseId },
            role,
            task,
        }
    }

    /// The worker's argument: its launch, or its step.
    fn argument(&self) -> i64 {
        match self.task {
            Task::Launch(launch) => launch.launch_id,
            Task::Step { step_id } => step_id,
        }
    }

    /// "<database> <role> <xid> <worker> <who>": who is a StartedBy, or "step" (whose
    /// xid and worker are 0).
    fn extra(&self) -> String {
        let (xid, worker, who) = match self.task {
            Task::Launch(launch) => (launch.xid, launch.worker, launch.started_by.as_str()),
            Task::Step { .. } => (0, 0, STEP),
        };
        format!(
            "{} {} {xid} {worker} {who}",
            self.database.to_u32(),
            self.role.to_u32()
        )
    }

    /// The start a worker was handed, from its argument and its bgw_extra; None when the
    /// text cannot be read.
    pub fn read(argument: i64, extra: &str) -> Option<WorkerStart> {
        let mut parts = extra.split(' ');
        let mut next = || parts.next();
        let database = pg_sys::Oid::from(next()?.parse::<u32>().ok()?);
        let role = pg_sys::Oid::from(next()?.parse::<u32>().ok()?);
        let xid = next()?.parse().ok()?;
        let worker = next()?.parse().ok()?;
        let task = match next()? {
            STEP => Task::Step { step_id: argument },
            who => Task::Launch(LaunchWorker {
                launch_id: argument,
                worker,
                xid,
                started_by: StartedBy::parse(who).ok()?,
            }),
        };
        Some(WorkerStart {
            database,
            role,
            task,
        })
    }

    /// A worker process to start for it, as the postmaster knows it.
    fn builder(&self) -> BackgroundWorkerBuilder {
        let name = match self.task {
            Task::Launch(launch) => format!(
                "{WORKER}: launch {}, worker {}",
                launch.launch_id, launch.worker
            ),
            Task::Step { step_id } => format!("{WORKER}: step {step_id}"),
        };
        dynamic(&name, WORKER)
            .set_function("etc_batch_worker_main")
            .set_argument(Some(pg_sys::Datum::from(self.argument())))
            .set_extra(&self.extra())
            .set_restart_time(None)
    }
}

/// Starts a worker of a launch (`start.task` is a Task::Launch); returns its pid once it
/// runs, or None when no background worker slot is free (max_worker_processes).
pub fn start_worker(start: &WorkerStart) -> Result<Option<i32>> {
    started(start.builder())
}

/// Starts a worker connected as a step's author, to run that step alone for a runner that
/// waits for it (`start.task` is a Task::Step); its handle, once it runs, or None when
/// no background worker slot is free.
pub fn start_step_worker(
    start: &WorkerStart,
) -> Result<Option<pgrx::bgworkers::DynamicBackgroundWorker>> {
    let Ok(worker) = start.builder().load_dynamic() else {
        return Ok(None);
    };
    match worker.wait_for_startup() {
        Ok(_) | Err(pgrx::bgworkers::BackgroundWorkerStatus::Stopped) => Ok(Some(worker)),
        Err(status) => Err(BatchError::Internal(format!(
            "a background worker did not start: {status:?}"
        ))),
    }
}

/// Starts the supervisor of the current database (which ends at once if another runs).
pub fn start_supervisor(database: pg_sys::Oid) -> Result<Option<i32>> {
    let builder = dynamic(SUPERVISOR, SUPERVISOR)
        .set_function("etc_batch_supervisor_main")
        .set_argument(Some(pg_sys::Datum::from(database.to_u32())))
        .set_restart_time(None);
    started(builder)
}

/// Registers the launcher, from _PG_init while the library is preloaded.
pub fn register_launcher() {
    BackgroundWorkerBuilder::new(LAUNCHER)
        .set_library("etc_batch")
        .set_function("etc_batch_launcher_main")
        .enable_spi_access()
        // after crash recovery, and after a standby's promotion: never on a standby
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(RESTART))
        .load();
}

fn dynamic(name: &str, kind: &str) -> BackgroundWorkerBuilder {
    BackgroundWorkerBuilder::new(name)
        .set_type(kind)
        .set_library("etc_batch")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        // SAFETY: reads the backend's pid
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
}

/// Registers the worker and waits until the postmaster started it: its pid, or None
/// when no slot was free.
fn started(builder: BackgroundWorkerBuilder) -> Result<Option<i32>> {
    let Ok(worker) = builder.load_dynamic() else {
        return Ok(None);
    };
    match worker.wait_for_startup() {
        Ok(pid) => Ok(Some(pid)),
        // it started and ended already (a supervisor that found another one at work)
        Err(pgrx::bgworkers::BackgroundWorkerStatus::Stopped) => Ok(Some(0)),
        Err(status) => Err(BatchError::Internal(format!(
            "a background worker did not start: {status:?}"
        ))),
    }
}

unsafe extern "C-unwind" {
    /// PostgreSQL's own SIGTERM handler of a backend (postgres.c), not pgrx's wrapper.
    #[link_name = "die"]
    fn postgres_die(signal: std::ffi::c_int);
}

/// What every etc_batch process does first: SIGHUP read as configuration, SIGTERM as a
/// backend takes it (pg_terminate_backend, a shutdown): the work stops at its next
/// check for interrupts, with a FATAL, the transaction in flight rolled back.
pub fn take_signals() {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SAFETY: installs PostgreSQL's handler, as a backend's
    unsafe {
        #[cfg(not(feature = "pg18"))]
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(postgres_die));
        #[cfg(feature = "pg18")]
        pg_sys::pqsignal_be(pg_sys::SIGTERM as i32, Some(postgres_die));
    }
}

/// Connects to `database` as `role` (InvalidOid: as no role of a person's, for the
/// supervisor and the launcher, which run only etc_batch's own statements).
pub fn connect(database: pg_sys::Oid, role: pg_sys::Oid) {
    // From PostgreSQL 17 on a worker may connect as a role without LOGIN, when asked to:
    // the role that launched it (or a step's author) is already at work in a session of
    // its own, and NOLOGIN is about logging in. On 15 and 16 the launch refuses such a
    // role before any worker starts (start.rs), since a worker there could not connect.
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    let flags = pg_sys::BGWORKER_BYPASS_ROLELOGINCHECK;
    #[cfg(not(any(feature = "pg17", feature = "pg18")))]
    let flags = 0;
    // SAFETY: once, before any transaction
    unsafe { pg_sys::BackgroundWorkerInitializeConnectionByOid(database, role, flags) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_reads_back_the_start_it_was_handed() {
        let launch = WorkerStart {
            database: pg_sys::Oid::from(5u32),
            role: pg_sys::Oid::from(10u32),
            task: Task::Launch(LaunchWorker {
                launch_id: 7,
                worker: 2,
                xid: 750,
                started_by: StartedBy::Resume,
            }),
        };
        assert_eq!(launch.extra(), "5 10 750 2 resume");
        assert_eq!(WorkerStart::read(7, &launch.extra()), Some(launch));
        let step = WorkerStart {
            database: pg_sys::Oid::from(5u32),
            role: pg_sys::Oid::from(16384u32),
            task: Task::Step { step_id: 42 },
        };
        assert_eq!(step.extra(), "5 16384 0 0 step");
        assert_eq!(WorkerStart::read(42, &step.extra()), Some(step));
        assert_eq!(WorkerStart::read(7, "5 10 750 2 someone"), None);
        assert_eq!(WorkerStart::read(7, "5 10"), None);
    }
}
