//! Checkpointed jobs: register_job, register_job_from_query, drain_job, job_report,
//! job_summary, verify_job, abort_job.

use crate::error::{required, BatchError, OrRaise, Result};
use crate::job::{abort, approval, drain, pace, register, report};
use crate::lease::Fence;
use crate::pauses;
use crate::procedure::{c_procedure, Arg, Mode, Signature};
use pgrx::datum::Internal;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;

type Registration = TableIterator<
    'static,
    (
        name!(job_id, String),
        name!(created, bool),
        name!(items, i32),
        name!(chunks, i32),
    ),
>;

// pgrx reads the return type of a #[pg_extern] as written, so the two registrations
// spell it out; the helper below them names it.
/// The approval's columns are `name`s and its target a `regclass`, as a DBA would write
/// them, so the declaration is written out here rather than derived from Rust types.
#[allow(clippy::too_many_arguments)]
#[pg_extern(
    volatile,
    parallel_unsafe,
    sql = r#"
CREATE FUNCTION etc_batch.register_job(
    job_id text, tenant text, target regclass, items jsonb, chunk_size integer,
    set_values jsonb, expect jsonb DEFAULT '{}', key_column name DEFAULT 'id',
    tenant_column name DEFAULT 'tenant', revision_column name DEFAULT 'revision',
    handler regprocedure DEFAULT NULL, parallel boolean DEFAULT false)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_wrapper';
"#
)]
fn register_job(
    job_id: Option<String>,
    tenant: Option<String>,
    target: Option<pg_sys::Oid>,
    items: Option<Internal>,
    chunk_size: Option<i32>,
    set_values: Option<Internal>,
    expect: Option<Internal>,
    key_column: Option<&CStr>,
    tenant_column: Option<&CStr>,
    revision_column: Option<&CStr>,
    handler: Option<pg_sys::Oid>,
    parallel: Option<bool>,
) -> TableIterator<
    'static,
    (
        name!(job_id, String),
        name!(created, bool),
        name!(items, i32),
        name!(chunks, i32),
    ),
> {
    crate::standby::refuse_writes("etc_batch.register_job").or_raise();
    register(
        || {
            Ok(register::Items::Json(required(
                jsonb_text(items, "items")?,
                "items",
            )?))
        },
        job_id,
        tenant,
        target,
        chunk_size,
        set_values,
        expect,
        [key_column, tenant_column, revision_column],
        handler,
        parallel,
    )
}

/// As register_job, with the items the rows of a SELECT, read set-based in key order.
#[allow(clippy::too_many_arguments)]
#[pg_extern(
    volatile,
    parallel_unsafe,
    sql = r#"
CREATE FUNCTION etc_batch.register_job_from_query(
    job_id text, tenant text, target regclass, items_query text, chunk_size integer,
    set_values jsonb, expect jsonb DEFAULT '{}', key_column name DEFAULT 'id',
    tenant_column name DEFAULT 'tenant', revision_column name DEFAULT 'revision',
    handler regprocedure DEFAULT NULL, parallel boolean DEFAULT false)
RETURNS TABLE (job_id text, created boolean, items integer, chunks integer)
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'register_job_from_query_wrapper';
"#
)]
fn register_job_from_query(
    job_id: Option<String>,
    tenant: Option<String>,
    target: Option<pg_sys::Oid>,
    items_query: Option<String>,
    chunk_size: Option<i32>,
    set_values: Option<Internal>,
    expect: Option<Internal>,
    key_column: Option<&CStr>,
    tenant_column: Option<&CStr>,
    revision_column: Option<&CStr>,
    handler: Option<pg_sys::Oid>,
    parallel: Option<bool>,
) -> TableIterator<
    'static,
    (
        name!(job_id, String),
        name!(created, bool),
        name!(items, i32),
        name!(chunks, i32),
    ),
> {
    crate::standby::refuse_writes("etc_batch.register_job_from_query").or_raise();
    register(
        || {
            Ok(register::Items::Query(required(
                items_query,
                "items_query",
            )?))
        },
        job_id,
        tenant,
        target,
        chunk_size,
        set_values,
        expect,
        [key_column, tenant_column, revision_column],
        handler,
        parallel,
    )
}

/// Both registrations, once their items are read: the arguments checked in the order
/// they are declared, the job registered, its one row returned.
#[allow(clippy::too_many_arguments)]
fn register(
    items: impl FnOnce() -> Result<register::Items>,
    job_id: Option<String>,
    tenant: Option<String>,
    target: Option<pg_sys::Oid>,
    chunk_size: Option<i32>,
    set_values: Option<Internal>,
    expect: Option<Internal>,
    [key_column, tenant_column, revision_column]: [Option<&CStr>; 3],
    handler: Option<pg_sys::Oid>,
    parallel: Option<bool>,
) -> Registration {
    let name = |v: Option<&CStr>, arg| required(v, arg).map(|c| c.to_string_lossy().into_owned());
    let request = (|| -> Result<register::Request> {
        let job_id = required(job_id, "job_id")?;
        let tenant = required(tenant, "tenant")?;
        let target = required(target, "target")?;
        let items = items()?;
        Ok(register::Request {
            job_id,
            tenant,
            target,
            items,
            chunk_size: required(chunk_size, "chunk_size")?,
            set_values: jsonb_arg(set_values, "set_values")?.filter(|v| !v.is_null()),
            expect: required(jsonb_arg(expect, "expect")?, "expect")?,
            key_column: name(key_column, "key_column")?,
            tenant_column: name(tenant_column, "tenant_column")?,
            revision_column: name(revision_column, "revision_column")?,
            handler,
            parallel: required(parallel, "parallel")?,
        })
    })()
    .or_raise();
    let job_id = request.job_id.clone();
    let registered = register::register(request).or_raise();
    crate::memory::hand_back();
    TableIterator::once((
        job_id,
        registered.created,
        registered.items,
        registered.chunks,
    ))
}

/// A jsonb argument (declared so in the SQL above), read from its text form. pgrx's
/// JsonB turns jsonb that serde_json cannot hold (nesting deeper than it reads, a number
/// beyond double precision) into an internal error; this refuses it with a clear one.
fn jsonb_arg(arg: Option<Internal>, what: &str) -> Result<Option<serde_json::Value>> {
    jsonb_text(arg, what)?
        .map(|text| approval::read_json(what, &text))
        .transpose()
}

/// A jsonb argument as JSON text (jsonb_out), for reading an item at a time.
fn jsonb_text(arg: Option<Internal>, what: &str) -> Result<Option<String>> {
    let Some(datum) = arg.and_then(Internal::unwrap) else {
        return Ok(None);
    };
    // SAFETY: the datum is a jsonb argument of this call; jsonb_out detoasts it and
    // returns a C string palloc'd in the current memory context, freed below.
    unsafe {
        let text = pgrx::direct_function_call::<&CStr>(pg_sys::jsonb_out, &[Some(datum)])
            .ok_or_else(|| BatchError::Internal(format!("jsonb_out returned NULL for {what}")))?;
        let value = match text.to_str() {
            Ok(text) => Ok(text.to_string()),
            Err(_) => Err(BatchError::Unsupported {
                message: format!("{what} is not valid UTF-8"),
                detail: "etc_batch reads approvals in UTF8 databases only.".into(),
            }),
        };
        pg_sys::pfree(text.as_ptr() as *mut std::ffi::c_void);
        value.map(Some)
    }
}

/// Every approved item of a job: unprocessed, or committed and now matching, drifted
/// or missing; read in one snapshot with the caller's privileges.
#[pg_extern(stable, parallel_unsafe)]
fn job_report(
    job_id: Option<String>,
) -> TableIterator<
    'static,
    (
        name!(position, i32),
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

/// Sets how fast a job may go: rows per second for all its drainers together, and how
/// many WAL bytes the slowest standby or replication slot may be behind before they
/// wait; NULL: no limit. Read by every drainer at its next chunk.
#[pg_extern(
    volatile,
    parallel_unsafe,
    sql = r#"
CREATE FUNCTION etc_batch.pace_job(
    job_id text, rows_per_second integer, max_replica_lag_bytes bigint DEFAULT NULL)
RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'pace_job_wrapper';
"#
)]
fn pace_job(
    job_id: Option<String>,
    rows_per_second: Option<i32>,
    max_replica_lag_bytes: Option<i64>,
) {
    crate::standby::refuse_writes("etc_batch.pace_job").or_raise();
    let job_id = required(job_id, "job_id").or_raise();
    pace::set(
        &job_id,
        pace::Pace {
            rows_per_second,
            max_replica_lag_bytes,
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
}

/// `CALL etc_batch.drain_job(...)`, declared in sql/procedures.sql.
pub const DRAIN_JOB: Signature = Signature {
    name: "etc_batch.drain_job",
    args: &[
        Arg {
            name: "job_id",
            sql_type: "text",
            default: None,
            mode: Mode::In,
        },
        Arg {
            name: "max_chunks",
            sql_type: "integer",
            default: Some("NULL::integer"),
            mode: Mode::In,
        },
        Arg {
            name: "lease_name",
            sql_type: "text",
            default: Some("NULL::text"),
            mode: Mode::In,
        },
        Arg {
            name: "lease_holder",
            sql_type: "text",
            default: Some("NULL::text"),
            mode: Mode::In,
        },
        Arg {
            name: "lease_generation",
            sql_type: "bigint",
            default: Some("NULL::bigint"),
            mode: Mode::In,
        },
        Arg {
            name: "committed_chunks",
            sql_type: "integer",
            default: Some("NULL::integer"),
            mode: Mode::InOut,
        },
        Arg {
            name: "committed_items",
            sql_type: "bigint",
            default: Some("NULL::bigint"),
            mode: Mode::InOut,
        },
        Arg {
            name: "first_key",
            sql_type: "text",
            default: Some("NULL::text"),
            mode: Mode::InOut,
        },
        Arg {
            name: "last_key",
            sql_type: "text",
            default: Some("NULL::text"),
            mode: Mode::InOut,
        },
        Arg {
            name: "status",
            sql_type: "text",
            default: Some("NULL::text"),
            mode: Mode::InOut,
        },
    ],
};

c_procedure!(
    etc_batch_drain_job,
    pg_finfo_etc_batch_drain_job,
    DRAIN_JOB,
    |args, tx| {
        let job_id: String = args.required("job_id")?;
        let fence = Fence::from_args(
            args.get("lease_name")?,
            args.get("lease_holder")?,
            args.get("lease_generation")?,
        )?;
        let d = drain::drain(tx, &job_id, args.get("max_chunks")?, fence)?;
        Ok((
            d.chunks,
            d.items,
            d.first_key,
            d.last_key,
            if d.paused {
                "paused"
            } else {
                d.status.as_str()
            },
        ))
    }
);
