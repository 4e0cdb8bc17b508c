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

/// Who a worker process is: passed in its bgw_extra, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStart {
    pub database: pg_sys::Oid,
    pub role: pg_sys::Oid,
    /// The launching transaction's id, waited for before the worker acts.
    pub xid: u64,
    /// Which of the launch's workers, from 1.
    pub worker: i32,
    /// Who started it: "launch" or "resume".
    pub started_by: String,
}

impl WorkerStart {
    fn extra(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.database.to_u32(),
            self.role.to_u32(),
            self.xid,
            self.worker,
            self.started_by
        )
    }

    pub fn parse(extra: &str) -> Option<WorkerStart> {
        let mut parts = extra.split(' ');
        let mut next = || parts.next();
        Some(WorkerStart {
            database: pg_sys::Oid::from(next()?.parse::<u32>().ok()?),
            role: pg_sys::Oid::from(next()?.parse::<u32>().ok()?),
            xid: next()?.parse().ok()?,
            worker: next()?.parse().ok()?,
            started_by: next()?.to_string(),
        })
    }
}

/// Starts worker `start.worker` of launch `launch_id`; returns its pid once it runs, or
/// None when no background worker slot is free (max_worker_processes).
pub fn start_worker(launch_id: i64, start: &WorkerStart) -> Result<Option<i32>> {
    let builder = dynamic(
        &format!("{WORKER}: launch {launch_id}, worker {}", start.worker),
        WORKER,
    )
    .set_function("etc_batch_worker_main")
    .set_argument(Some(pg_sys::Datum::from(launch_id)))
    .set_extra(&start.extra())
    .set_restart_time(None);
    started(builder)
}

/// Starts a worker connected as a step's author, to run that step alone for a runner that
/// waits for it (`start.started_by` is "step"); its handle, once it runs, or None when
/// no background worker slot is free.
pub fn start_step_worker(
    step_id: i64,
    start: &WorkerStart,
) -> Result<Option<pgrx::bgworkers::DynamicBackgroundWorker>> {
    let builder = dynamic(&format!("{WORKER}: step {step_id}"), WORKER)
        .set_function("etc_batch_worker_main")
        .set_argument(Some(pg_sys::Datum::from(step_id)))
        .set_extra(&start.extra())
        .set_restart_time(None);
    let Ok(worker) = builder.load_dynamic() else {
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
