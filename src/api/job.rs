//! Checkpointed jobs: register_job, register_job_from_query, drain_job, job_report,
//! job_summary, verify_job, abort_job.

use super::types::{Jsonb, Name, Names, RegClass, RegProcedure};
use crate::error::{required, BatchError, OrRaise, Result};
use crate::halt;
use crate::job::change::Asked;
use crate::job::from_jobs::{remainder, revert};
use crate::job::rules::approval;
use crate::job::rules::approval::OnDrift;
use crate::job::run::{abort, drain};
use crate::job::{pace, register, report};
use crate::lease::Fence;
use crate::pauses;
use crate::procedure::{c_procedure, results};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

/// Declares register_job and register_job_from_query, which differ only in where the
/// items come from: the argument `$items` of SQL type `$items_type`, made into
/// register::Items by `$read`.
macro_rules! registration {
    ($(#[$doc:meta])* $name:ident, $items:ident: $items_type:ident, $read:expr) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        #[pg_extern(volatile, parallel_unsafe)]
        fn $name(
            job_id: Option<String>,
            tenant: Option<String>,
            target: Option<RegClass>,
            $items: Option<$items_type>,
            chunk_size: Option<i32>,
            set_values: Option<Jsonb>,
            expect: default!(Option<Jsonb>, "'{}'"),
            key_column: default!(Option<Name>, "NULL"),
            tenant_column: default!(Option<Name>, "'tenant'"),
            revision_column: default!(Option<Name>, "'revision'"),
            handler: default!(Option<RegProcedure>, "NULL"),
            parallel: default!(Option<bool>, false),
            key_columns: default!(Option<Names>, "NULL"),
            guard: default!(Option<String>, "NULL"),
            on_drift: default!(Option<String>, "'stop'"),
            record_before: default!(Option<bool>, false),
            set_expressions: default!(Option<Jsonb>, "NULL"),
            action: default!(Option<String>, "'update'"),
            archive: default!(Option<RegClass>, "NULL"),
            keep_deleted: default!(Option<bool>, true),
            set_from_query: default!(Option<Names>, "NULL"),
        ) -> TableIterator<
            'static,
            (
                name!(job_id, String),
                name!(created, bool),
                name!(items, i32),
                name!(chunks, i32),
            ),
        > {
            crate::standby::refuse_writes(concat!("etc_batch.", stringify!($name))).or_raise();
            // the arguments checked in the order they are declared
            let request = (|| -> Result<register::Request> {
                Ok(register::Request {
                    job_id: required(job_id, "job_id")?,
                    tenant,
                    target: required(target, "target")?.0,
                    items: ($read)(required($items, stringify!($items))?)?,
                    chunk_size: required(chunk_size, "chunk_size")?,
                    set_values: jsonb_arg(set_values, "set_values")?.filter(|v| !v.is_null()),
                    expect: required(jsonb_arg(expect, "expect")?, "expect")?,
                    key_column: key_column.map(|n| n.0),
                    key_columns: key_columns.map(|n| n.0),
                    tenant_column: tenant_column.map(|n| n.0),
                    revision_column: revision_column.map(|n| n.0),
                    guard,
                    handler: handler.map(|h| h.0),
                    parallel: required(parallel, "parallel")?,
                    on_drift: OnDrift::parse(&required(on_drift, "on_drift")?)?,
                    record_before: required(record_before, "record_before")?,
                    set_from_items: set_from_query.map(|n| n.0).unwrap_or_default(),
                    set_expressions: jsonb_arg(set_expressions, "set_expressions")?
                        .filter(|v| !v.is_null()),
                    action: Asked::parse(
                        &required(action, "action")?,
                        archive.map(|a| a.0),
                    )?,
                    keep_deleted: required(keep_deleted, "keep_deleted")?,
                })
            })()
            .or_raise();
            let job_id = request.job_id.clone();
            let registered = register::register(request).or_raise();
            crate::memory::hand_back();
            TableIterator::once((job_id, registered.created, registered.items, registered.chunks))
        }
    };
}

registration!(
    /// Freezes an approved list of items, given as a jsonb array, for a job.
    register_job,
    items: Jsonb,
    |items: Jsonb| Ok::<_, BatchError>(register::Items::List(Box::new(items.list("items"))))
);

registration!(
    /// As register_job, with the items the rows of a SELECT, read set-based in key order.
    register_job_from_query,
    items_query: String,
    |query: String| Ok::<_, BatchError>(register::Items::Query(query))
);

/// Approves again what a job did not change, as a new job, and ends the job: continued.
#[pg_extern(volatile, parallel_unsafe)]
fn register_remainder(
    job_id: Option<String>,
    new_job_id: Option<String>,
    chunk_size: default!(Option<i32>, "NULL"),
    include_drifted: default!(Option<bool>, false),
    parallel: default!(Option<bool>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(job_id, String),
        name!(created, bool),
        name!(items, i32),
        name!(chunks, i32),
    ),
> {
    crate::standby::refuse_writes("etc_batch.register_remainder").or_raise();
    let request = (|| -> Result<remainder::Remainder> {
        Ok(remainder::Remainder {
            job_id: required(job_id, "job_id")?,
            new_job_id: required(new_job_id, "new_job_id")?,
            chunk_size,
            include_drifted: required(include_drifted, "include_drifted")?,
            parallel,
        })
    })()
    .or_raise();
    let new_job_id = request.new_job_id.clone();
    let registered = remainder::register_remainder(request).or_raise();
    crate::memory::hand_back();
    TableIterator::once((
        new_job_id,
        registered.created,
        registered.items,
        registered.chunks,
    ))
}

/// Registers a revert of a job: a new approved job that sets the job's committed items
/// back to what they were before it, each expected as the job's change left it. The job
/// itself is stopped first and ends reverted.
#[pg_extern(volatile, parallel_unsafe)]
fn register_revert(
    job_id: Option<String>,
    revert_job_id: Option<String>,
    chunk_size: default!(Option<i32>, "NULL"),
    parallel: default!(Option<bool>, "NULL"),
    inverse: default!(Option<RegProcedure>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(job_id, String),
        name!(created, bool),
        name!(items, i32),
        name!(chunks, i32),
    ),
> {
    crate::standby::refuse_writes("etc_batch.register_revert").or_raise();
    let request = (|| -> Result<revert::Revert> {
        Ok(revert::Revert {
            job_id: required(job_id, "job_id")?,
            revert_job_id: required(revert_job_id, "revert_job_id")?,
            chunk_size,
            parallel,
            inverse: inverse.map(|h| h.0),
        })
    })()
    .or_raise();
    let revert_job_id = request.revert_job_id.clone();
    let registered = revert::register_revert(request).or_raise();
    crate::memory::hand_back();
    TableIterator::once((
        revert_job_id,
        registered.created,
        registered.items,
        registered.chunks,
    ))
}

/// What register_revert would do, without doing it: how many committed items it would
/// set back, how many drifted, are gone or are another tenant's since (the keys from
/// revert_preview_left_out), and which columns go back to which values (set_back), or
/// each to its row's own value recorded before the change (set_back_per_item).
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn revert_preview(
    job_id: Option<String>,
    inverse: default!(Option<RegProcedure>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(items, i32),
        name!(drifted, i32),
        name!(gone, i32),
        name!(another_tenant, i32),
        name!(taken, i32),
        name!(set_back, Option<pgrx::JsonB>),
        name!(set_back_per_item, Vec<String>),
        name!(expected, pgrx::JsonB),
        name!(inverse, Option<String>),
    ),
> {
    let job_id = required(job_id, "job_id").or_raise();
    let p = revert::preview(&job_id, inverse.map(|h| h.0)).or_raise();
    TableIterator::once((
        p.items,
        p.drifted,
        p.gone,
        p.another_tenant,
        p.taken,
        p.set_back.map(pgrx::JsonB),
        p.set_back_per_item,
        pgrx::JsonB(p.expected),
        p.inverse,
    ))
}

/// The committed items a revert registered now would leave out, one row each, in their
/// order in the job: what revert_preview counts.
#[pg_extern(volatile, parallel_unsafe)]
fn revert_preview_left_out(
    job_id: Option<String>,
    inverse: default!(Option<RegProcedure>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(position, i32),
        name!(item_key, String),
        name!(state, String),
    ),
> {
    let job_id = required(job_id, "job_id").or_raise();
    let left_out = revert::preview_left_out(&job_id, inverse.map(|h| h.0)).or_raise();
    TableIterator::new(
        left_out
            .into_iter()
            .map(|l| (l.position, l.key, l.because.as_str().to_string())),
    )
}

/// How many seconds of the clock, from now, `work_seconds` of work take when done only
/// inside `windows` read in `time_zone` (a pace's): the waits for the windows to open
/// counted, as job_progress's estimated_finish counts them.
#[pg_extern(stable, parallel_safe)]
fn wall_seconds_in_windows(
    work_seconds: Option<f64>,
    windows: Option<Vec<String>>,
    time_zone: Option<String>,
) -> Option<f64> {
    let (work, windows, time_zone) = (work_seconds?, windows?, time_zone?);
    let windows = crate::job::rules::window::Windows::parse(&windows).or_raise();
    let minute = crate::job::pace::signals::minute_of_week(&time_zone).or_raise();
    Some(windows.wall_minutes(minute, work / 60.0) * 60.0)
}

/// A jsonb argument read as JSON.
fn jsonb_arg(arg: Option<Jsonb>, what: &str) -> Result<Option<serde_json::Value>> {
    arg.map(|a| approval::read_json(what, &a.text(what)?))
        .transpose()
}

/// Every approved item of a job: unprocessed, skipped, or committed and now matching,
/// drifted or missing; read in one snapshot, the target with the caller's privileges.
/// (Its result's columns are named in the signature, as pgrx declares them.)
#[allow(clippy::type_complexity)]
#[pg_extern(stable, parallel_unsafe)]
fn job_report(
    job_id: Option<String>,
) -> TableIterator<
    'static,
    (
        name!(position, Option<i32>),
        name!(item_key, String),
        name!(state, String),
        name!(revision_committed, Option<i64>),
        name!(revision_now, Option<i64>),
    ),
> {
    let job_id = required(job_id, "job_id").or_raise();
    let rows = report::report(&job_id).or_raise();
    TableIterator::new(rows.into_iter().map(|r| {
        (
            r.position,
            r.item_key,
            r.state,
            r.revision_committed,
            r.revision_now,
        )
    }))
}

/// A job's status and counts of its items by state.
#[allow(clippy::type_complexity)]
#[pg_extern(stable, parallel_unsafe)]
fn job_summary(
    job_id: Option<String>,
) -> TableIterator<
    'static,
    (
        name!(status, String),
        name!(approved, i32),
        name!(committed, i32),
        name!(unprocessed, i32),
        name!(matching, i32),
        name!(drifted, i32),
        name!(missing, i32),
        name!(parallel, bool),
        name!(skipped, i32),
        name!(failed_at, Option<TimestampWithTimeZone>),
        name!(failure_sqlstate, Option<String>),
        name!(failure_message, Option<String>),
    ),
> {
    let job_id = required(job_id, "job_id").or_raise();
    let s = report::summary(&job_id).or_raise();
    TableIterator::once((
        s.status,
        s.approved,
        s.committed,
        s.unprocessed,
        s.matching,
        s.drifted,
        s.missing,
        s.parallel,
        s.skipped,
        s.failed_at,
        s.failure_sqlstate,
        s.failure_message,
    ))
}

/// The full check of a job's progress against its approved list.
#[pg_extern(volatile, parallel_unsafe)]
fn verify_job(
    job_id: Option<String>,
) -> TableIterator<
    'static,
    (
        name!(check_name, String),
        name!(ok, bool),
        name!(detail, String),
    ),
> {
    crate::standby::refuse_writes("etc_batch.verify_job").or_raise();
    let job_id = required(job_id, "job_id").or_raise();
    let checks = report::verify(&job_id).or_raise();
    TableIterator::new(
        checks
            .into_iter()
            .map(|c| (c.name.to_string(), c.ok, c.detail)),
    )
}

/// Stops a job for good; its approval, audit and checkpoint stay.
#[pg_extern(volatile, parallel_unsafe)]
fn abort_job(job_id: Option<String>, reason: Option<String>) {
    crate::standby::refuse_writes("etc_batch.abort_job").or_raise();
    let job_id = required(job_id, "job_id").or_raise();
    let reason = required(reason, "reason").or_raise();
    abort::abort(&job_id, &reason).or_raise()
}

/// Pauses a job: its drainers stop before their next chunk and return with status
/// paused, until resume_job. Pausing changes nothing committed.
#[pg_extern(volatile, parallel_unsafe)]
fn pause_job(job_id: Option<String>) {
    crate::standby::refuse_writes("etc_batch.pause_job").or_raise();
    let job_id = required(job_id, "job_id").or_raise();
    if !pauses::pause_job(&job_id).or_raise() {
        notice!("job \"{job_id}\" was already paused; nothing changed");
    }
}

/// Sets a job's whole pace: how fast it may go (rows per second for all its drainers
/// together), the signals of the system its drainers wait for (replica lag, WAL archive
/// backlog, a VACUUM of its table, its windows, a throttle query) and those that pause it
/// (pause_above_*, critical_query). What a call does not name has no limit afterwards;
/// pace_job(job_id) clears it all. transaction_time sizes the drains' transactions: as
/// many chunks as fit go in one. Read by every drainer at its next transaction, the
/// signals at most once per etc_batch.signal_interval.
#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, parallel_unsafe)]
fn pace_job(
    job_id: Option<String>,
    rows_per_second: default!(Option<i32>, "NULL"),
    max_replica_lag_bytes: default!(Option<i64>, "NULL"),
    max_archive_backlog: default!(Option<i32>, "NULL"),
    yield_to_vacuum: default!(Option<bool>, "false"),
    windows: default!(Option<Vec<String>>, "NULL"),
    time_zone: default!(Option<String>, "NULL"),
    throttle_query: default!(Option<String>, "NULL"),
    pause_above_replica_lag_bytes: default!(Option<i64>, "NULL"),
    pause_above_archive_backlog: default!(Option<i32>, "NULL"),
    critical_query: default!(Option<String>, "NULL"),
    transaction_time: default!(Option<pgrx::datum::Interval>, "NULL"),
) {
    crate::standby::refuse_writes("etc_batch.pace_job").or_raise();
    let job_id = required(job_id, "job_id").or_raise();
    pace::set(
        &job_id,
        pace::Pace {
            rows_per_second,
            max_replica_lag_bytes,
            max_archive_backlog,
            yield_to_vacuum: yield_to_vacuum.unwrap_or(false),
            windows,
            time_zone,
            throttle_query,
            pause_above_replica_lag_bytes,
            pause_above_archive_backlog,
            critical_query,
            transaction_time: transaction_time
                .map(pace::transaction_time)
                .transpose()
                .or_raise(),
        },
    )
    .or_raise()
}

/// Lets a paused job go on from its checkpoint.
#[pg_extern(volatile, parallel_unsafe)]
fn resume_job(job_id: Option<String>) {
    crate::standby::refuse_writes("etc_batch.resume_job").or_raise();
    let job_id = required(job_id, "job_id").or_raise();
    if !pauses::resume_job(&job_id).or_raise() {
        notice!("job \"{job_id}\" was not paused; nothing changed");
    }
    crate::launch::start::resume_paused(Some(&job_id), None).or_raise();
}

results! {
    /// What one CALL of drain_job did: the chunks and items it committed, the first and
    /// last key of them, and the job's status after it.
    pub struct DrainResult {
        pub committed_chunks: i32,
        pub committed_items: i64,
        pub first_key: Option<String>,
        pub last_key: Option<String>,
        pub status: &'static str,
    }
}

// `CALL etc_batch.drain_job(...)`, declared in sql/procedures.sql.
c_procedure!(
    etc_batch_drain_job,
    pg_finfo_etc_batch_drain_job,
    |args, tx| {
        let job_id: String = args.required("job_id")?;
        let fence = Fence::from_args(
            args.get("lease_name")?,
            args.get("lease_holder")?,
            args.get("lease_generation")?,
        )?;
        let options = drain::Options {
            max_chunks: args.get("max_chunks")?,
            fence,
            at_window_close: drain::AtWindowClose::Return,
            halt: &halt::Never,
        };
        let d = drain::drain(tx, &job_id, options)?;
        Ok(DrainResult {
            committed_chunks: d.chunks,
            committed_items: d.items,
            first_key: d.first_key,
            last_key: d.last_key,
            status: d.ended.as_str(),
        })
    }
);
