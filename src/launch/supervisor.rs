//! The supervisor of a database's launches: while any runs, it looks every two seconds
//! for workers that are not at work (their process ended without saying how:
//! pg_terminate_backend, a crash, a restart) and starts them again, as far as
//! etc_batch.max_workers allows. It ends when it finds no launch running; a launch
//! starts it again. One per database: it holds the supervisor's lock while it lives.
//!
//! A worker that ends again before it begins its run (its role can no longer connect,
//! say) is not started again at once but after a wait that doubles, up to five minutes,
//! with a WARNING each time: the doctor names the launch.

use super::start::resume;
use super::{bgw, slot, sql};
use crate::query;
use crate::roles::as_owner;
use crate::session_lock::{SessionLock, Space};
use crate::txn::worker::in_transaction;
use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often the supervisor looks.
const NAPTIME: Duration = Duration::from_secs(2);

/// How many looks in a row with no launch running before it ends: one, so that it leaves
/// the database soon (DROP DATABASE waits five seconds for its other sessions to go).
const IDLE_LOOKS: u32 = 1;

/// A worker the supervisor started, and what became of it.
struct Started {
    /// Its runs when it was started: one more says it began.
    runs_before: i64,
    /// Whether the next look is still to see what became of it.
    unseen: bool,
    /// How many times in a row it ended before beginning its run.
    failures: u32,
    /// Not started again before this.
    not_before: Instant,
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn etc_batch_supervisor_main(arg: pg_sys::Datum) {
    let database = pg_sys::Oid::from(arg.value() as u32);
    bgw::take_signals();
    bgw::connect(database, pg_sys::Oid::INVALID);
    let Some(_supervisor) = in_transaction(|| SessionLock::try_exclusive(Space::Supervisor, 0))
    else {
        // another supervisor watches this database
        return;
    };
    let mut started: HashMap<(i64, i32), Started> = HashMap::new();
    let mut idle = 0;
    loop {
        match in_transaction(|| look(&mut started)) {
            // etc_batch is not installed here, or at another version: nothing to watch
            Ok(None) => return,
            Ok(Some(0)) => idle += 1,
            Ok(Some(_)) => idle = 0,
            Err(e) => log!("etc_batch supervisor: {}", e.report().message),
        }
        if idle >= IDLE_LOOKS {
            return;
        }
        // a SIGTERM ends the process here (the handler is PostgreSQL's own)
        BackgroundWorker::wait_latch(Some(NAPTIME));
        reload_configuration();
    }
}

/// One look: the workers to start again started; how many launches run, or None when
/// etc_batch is not installed here at the library's version.
fn look(started: &mut HashMap<(i64, i32), Started>) -> crate::error::Result<Option<usize>> {
    if !query::one::<bool>(sql::INSTALLED_HERE, &[env!("CARGO_PKG_VERSION").into()])?
        .unwrap_or(false)
    {
        return Ok(None);
    }
    as_owner(|| {
        let now = Instant::now();
        let runs = |launch_id: i64, worker: i32| -> crate::error::Result<i64> {
            Ok(
                query::one::<i64>(sql::RUNS_OF_WORKER, &[launch_id.into(), worker.into()])?
                    .unwrap_or(0),
            )
        };
        // what became of the workers started at the last look: at work, or gone after a
        // run of their own, or gone before beginning one (which backs off)
        let at_work = super::start::held(Space::Worker)?;
        for (&(launch_id, worker), s) in started.iter_mut().filter(|(_, s)| s.unseen) {
            s.unseen = false;
            if at_work.contains(&slot(launch_id, worker))
                || runs(launch_id, worker)? > s.runs_before
            {
                s.failures = 0;
                continue;
            }
            s.failures += 1;
            let wait = (NAPTIME * 2u32.pow(s.failures.min(8))).min(Duration::from_secs(300));
            s.not_before = now + wait;
            warning!(
                "etc_batch: worker {worker} of launch {launch_id} ended before it began its run ({} time(s) in a row); it is started again in {} s",
                s.failures,
                wait.as_secs()
            );
        }
        let resumed = resume(true, |launch_id, worker| {
            started
                .get(&(launch_id, worker))
                .is_some_and(|s| now < s.not_before)
        })?;
        for r in resumed {
            let before = runs(r.launch_id, r.worker)?;
            let s = started.entry((r.launch_id, r.worker)).or_insert(Started {
                runs_before: before,
                unseen: true,
                failures: 0,
                not_before: now,
            });
            s.runs_before = before;
            s.unseen = true;
        }
        Ok(Some(
            query::one::<i64>(sql::RUNNING_COUNT, &[])?.unwrap_or(0) as usize,
        ))
    })
}

fn reload_configuration() {
    // SAFETY: reads and clears the flag pgrx's SIGHUP handler sets, as a backend would
    unsafe {
        if pg_sys::ConfigReloadPending != 0 {
            pg_sys::ConfigReloadPending = 0;
            pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
        }
    }
}
