//! Launches: work the server finishes by itself, with no client session held.
//!
//! `launch_job` and `launch_batch` write a launch (sql/launches.sql) in the caller's
//! transaction and start its workers, background worker processes that drain the job
//! or run the chain through the same code a CALL runs (src/txn/worker.rs drives its
//! transactions). A worker acts only once the launching transaction has committed, and
//! not at all if it rolled back (worker.rs). Every database with launches running has a
//! supervisor that starts again the workers that ended without saying how (terminated,
//! a crash), and, when the library is preloaded, a launcher starts the supervisors after
//! a restart or a promotion (supervisor.rs, launcher.rs). No two processes are ever the
//! same worker: each holds its worker's lock (session_lock::Space::Worker) while it
//! lives, and the checkpoint, the chunk claims and the steps' done marks decide what is
//! left, as for any second CALL.
//!
//! - `start`      launch_job, launch_batch, stop_launch, resume_launches: the SQL side.
//! - `worker`     a worker process: its start, its work, its outcome.
//! - `supervisor` the supervisor of a database.
//! - `launcher`   the launcher of the cluster.
//! - `bgw`        registering the processes, and what each does first.
//! - `sql`        the statements.

mod bgw;
mod launcher;
mod sql;
pub mod start;
mod supervisor;
mod worker;

pub use start::AuthorWorker;

use crate::error::Result;
use crate::halt::Halt;
use crate::own_rows::{self, Compare, Key};
use crate::pauses::Paused;
use crate::status::LaunchStatus;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// How many of etc_batch's workers may run at once in the cluster.
pub static MAX_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(8);

/// The most workers one launch may have.
pub const MAX_WORKERS_PER_LAUNCH: i32 = 1000;

pub fn register() {
    GucRegistry::define_int_guc(
        c"etc_batch.max_workers",
        c"How many of etc_batch's background workers may run at once in the cluster.",
        c"A launch that would need more fails with 53400 and starts none; a supervisor starts a worker again only when one is free. They take slots of max_worker_processes too.",
        &MAX_WORKERS,
        1,
        MAX_WORKERS_PER_LAUNCH,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // SAFETY: reads whether the postmaster is loading the preloaded libraries
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        bgw::register_launcher();
    }
}

/// Whether the library is preloaded, so that launches are resumed after a restart.
pub fn preloaded() -> bool {
    crate::settings::current(c"shared_preload_libraries").is_some_and(|libraries| {
        libraries
            .split(',')
            .any(|l| l.trim().trim_matches('"') == "etc_batch")
    })
}

/// The lock id of worker `worker` of launch `launch_id`.
fn slot(launch_id: i64, worker: i32) -> i64 {
    (launch_id << 16) | i64::from(worker)
}

/// The halt a worker hands its drain or chain: launch `.0` no longer runs (stop_launch,
/// or another worker ended it), read before every chunk or step as a pause is, and told
/// as one: who ended it and when.
pub struct WhenLaunchEnds(pub i64);

impl Halt for WhenLaunchEnds {
    fn halted(&self) -> Result<Option<Paused>> {
        launch_ended(self.0)
    }
}

/// Whether launch `launch_id` ended, and how.
fn launch_ended(launch_id: i64) -> Result<Option<Paused>> {
    let found = own_rows::reading_table("launch", |launches| {
        launches.first("launch_id", Compare::Equal, Key::Int8(launch_id), |row| {
            let status = LaunchStatus::parse(&row.get::<String>("status")?.unwrap_or_default())?;
            if status == LaunchStatus::Running {
                return Ok(None);
            }
            Ok(Some(Paused::launch_ended(
                launch_id,
                status,
                row.get::<pg_sys::Oid>("stopped_by")?,
                row.get::<TimestampWithTimeZone>("ended_at")?,
            )))
        })
    })?;
    Ok(found.flatten())
}
