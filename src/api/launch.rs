//! Launches: launch_job, launch_batch, stop_launch, resume_launches.

use crate::error::{required, OrRaise};
use crate::launch::start::{self, Work};
use pgrx::prelude::*;

/// Starts `workers` background workers that drain the job to the end, with no client
/// session held; they act once the calling transaction commits.
#[pg_extern(volatile, parallel_unsafe)]
fn launch_job(
    job_id: Option<String>,
    workers: default!(Option<i32>, 1),
) -> TableIterator<
    'static,
    (
        name!(launch_id, i64),
        name!(workers, i32),
        name!(pids, Vec<i32>),
    ),
> {
    crate::standby::refuse_writes("etc_batch.launch_job").or_raise();
    let job_id = required(job_id, "job_id").or_raise();
    let workers = required(workers, "workers").or_raise();
    let l = start::launch(Work::Job(&job_id), workers).or_raise();
    TableIterator::once((l.launch_id, l.workers, l.pids))
}

/// Starts a background worker that runs the chain from `step_id` to its end, as
/// exec_batch_from_id would, with no client session held.
#[pg_extern(volatile, parallel_unsafe)]
fn launch_batch(
    step_id: Option<i64>,
) -> TableIterator<
    'static,
    (
        name!(launch_id, i64),
        name!(workers, i32),
        name!(pids, Vec<i32>),
    ),
> {
    crate::standby::refuse_writes("etc_batch.launch_batch").or_raise();
    let step_id = required(step_id, "step_id").or_raise();
    let l = start::launch(Work::Chain(step_id), 1).or_raise();
    TableIterator::once((l.launch_id, l.workers, l.pids))
}

/// Stops a launch: its workers end after the chunk or step in flight. Whether it ran.
#[pg_extern(volatile, parallel_unsafe)]
fn stop_launch(launch_id: Option<i64>) -> bool {
    crate::standby::refuse_writes("etc_batch.stop_launch").or_raise();
    start::stop(required(launch_id, "launch_id").or_raise()).or_raise()
}

/// Starts again the workers of this database's running launches that are not at work,
/// and its supervisor if none runs: what the launcher does after a restart when the
/// library is preloaded, for a server where it is not.
#[pg_extern(volatile, parallel_unsafe)]
fn resume_launches(
) -> TableIterator<'static, (name!(launch_id, i64), name!(worker, i32), name!(pid, i32))> {
    crate::standby::refuse_writes("etc_batch.resume_launches").or_raise();
    let resumed = start::resume_launches().or_raise();
    TableIterator::new(resumed.into_iter().map(|r| (r.launch_id, r.worker, r.pid)))
}
