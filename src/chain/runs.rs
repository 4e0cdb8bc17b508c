//! Chains that run every night: a definition (define_chain, its steps added with
//! add_step under the chain's name) and its runs (run_chain), each a batch
//! "<chain>/<run key>" holding copies of the definition's steps with ids of their own.
//!
//! A run is made once, under a transaction lock on its chain, and committed before any
//! of its steps runs, so that callers at the same moment (two pg_cron ticks, two
//! servers' schedules) make one run; running it is exec_batch_from_id's, with every
//! guarantee of a chain. The definition's steps never run themselves, and an abandoned
//! run never runs again.

use super::sql;
use super::step;
use crate::error::{BatchError, Result};
use crate::query;
use crate::roles::{as_owner, current_user};
use crate::status::{ChainRunStatus, StepStatus};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use std::cell::RefCell;

thread_local! {
    /// The run key of the run whose steps this backend is running, for current_run().
    static CURRENT: RefCell<Option<String>> = const { RefCell::new(None) };
}

query::row_reader! {
    /// A chain definition: what run_chain needs of it, as CHAIN_DEFINITION reads it.
    struct Definition {
        time_zone: String = String::new(),
        overlap: bool = false,
    }
}

query::row_reader! {
    /// A run as FIND_RUN reads it.
    struct FoundRun {
        batch: String = String::new(),
        first_step: i64 = 0,
        run_number: i64 = 0,
        abandoned_by: Option<String>,
        abandoned_at: Option<TimestampWithTimeZone>,
    }
}

query::row_reader! {
    /// An earlier run that is not finished, as UNFINISHED_BEFORE reads it.
    struct UnfinishedRow {
        batch: String = String::new(),
        run_key: String = String::new(),
        step: i64 = 0,
        status: String = String::new(),
        error: Option<String>,
    }
}

query::row_reader! {
    /// A run as RUN_STATE reads it.
    struct RunState {
        batch: String = String::new(),
        abandoned: bool = false,
        /// Whether every step of it is done.
        done: bool = false,
    }
}

query::row_reader! {
    /// A batch as BATCH_KIND reads it.
    struct KindRow {
        /// Whether it is a chain's definition.
        definition: bool = false,
        chain: Option<String>,
        run_key: Option<String>,
        abandoned_by: Option<String>,
        abandoned_at: Option<TimestampWithTimeZone>,
    }
}

/// A run of a chain, made or found by run_chain.
pub struct Run {
    pub batch: String,
    pub first_step: i64,
    /// Runs of the chain in the order they were made.
    number: i64,
}

/// An earlier run that is not finished, and the step it stopped at.
struct Unfinished {
    batch: String,
    run_key: String,
    step: i64,
    status: StepStatus,
    error: Option<String>,
}

/// What run_chain found to do.
pub enum Start {
    /// Run the run's steps from its first.
    Run(Run),
    /// An earlier run is unfinished and the chain does not overlap runs: nothing runs.
    Wait(Run),
}

/// Defines chain `chain` (or defines it again): its steps are the batch of that name's,
/// added with add_step; `time_zone` is the one a run's default key is taken in (the
/// caller's TimeZone when None).
pub fn define(chain: &str, time_zone: Option<&str>, overlap: bool) -> Result<()> {
    step::check_batch_name(chain)?;
    let time_zone = match time_zone {
        Some(zone) => zone.to_string(),
        None => query::one::<String>(sql::SESSION_TIME_ZONE, &[])?.unwrap_or_else(|| "UTC".into()),
    };
    if !query::one::<bool>(sql::TIME_ZONE_KNOWN, &[time_zone.as_str().into()])?.unwrap_or(false) {
        return Err(BatchError::invalid_because(
            format!("time zone \"{time_zone}\" is not known"),
            "Give a name of pg_timezone_names, such as 'Europe/Moscow' or 'UTC'.",
        ));
    }
    let definer = current_user();
    as_owner(|| {
        if let Some(run_of) = query::one::<String>(sql::RUN_OF_BATCH, &[chain.into()])? {
            return Err(BatchError::invalid_because(
                format!("batch \"{chain}\" is a run of chain \"{run_of}\""),
                "A chain is defined under a name of its own; its runs are made by etc_batch.run_chain.",
            ));
        }
        query::run(
            sql::DEFINE_CHAIN,
            &[
                chain.into(),
                time_zone.as_str().into(),
                overlap.into(),
                definer.into(),
            ],
        )
    })
}

/// Finds run `run_key` of `chain` (today's date in the chain's time zone when None), or
/// makes it with copies of the definition's steps; says whether it may run now. Runs in
/// the caller's transaction, which must commit before the run's steps run.
pub fn start(chain: &str, run_key: Option<&str>) -> Result<Start> {
    let caller = current_user();
    as_owner(|| {
        query::run(sql::LOCK_CHAIN, &[chain.into()])?;
        let definition = query::row(sql::CHAIN_DEFINITION, &[chain.into()], Definition::read)?
            .ok_or_else(|| BatchError::UnknownChain {
                chain: chain.into(),
            })?;
        let run_key = match run_key {
            Some(key) => key.to_string(),
            None => query::one::<String>(sql::TODAY_IN, &[definition.time_zone.as_str().into()])?
                .unwrap_or_default(),
        };
        step::check_run_key(&run_key)?;
        let run = match find(chain, &run_key)? {
            Some(run) => run,
            None => make(chain, &run_key, caller)?,
        };
        if !definition.overlap {
            if let Some(earlier) = unfinished_before(chain, run.number)? {
                notice_waiting(chain, &run.batch, &earlier);
                return Ok(Start::Wait(run));
            }
        }
        Ok(Start::Run(run))
    })
}

/// The run, unless there is none; refused when it was abandoned.
fn find(chain: &str, run_key: &str) -> Result<Option<Run>> {
    let found = query::row(sql::FIND_RUN, &[chain.into(), run_key.into()], |r| {
        let found = FoundRun::read(r)?;
        Ok((
            Run {
                batch: found.batch,
                first_step: found.first_step,
                number: found.run_number,
            },
            found.abandoned_by,
            found.abandoned_at,
        ))
    })?;
    match found {
        None => Ok(None),
        Some((run, None, _)) => Ok(Some(run)),
        Some((_, Some(by), at)) => Err(BatchError::RunAbandoned {
            chain: chain.into(),
            run_key: run_key.into(),
            by,
            at: at.map(|t| t.to_string()).unwrap_or_default(),
        }),
    }
}

/// Makes the run: the definition's steps copied, in their order, with new ids after the
/// highest, each keeping its author, search_path, commits, timeout and max_attempts.
fn make(chain: &str, run_key: &str, caller: pg_sys::Oid) -> Result<Run> {
    let batch = format!("{chain}/{run_key}");
    if query::one::<bool>(sql::BATCH_EXISTS, &[batch.as_str().into()])?.unwrap_or(false) {
        return Err(BatchError::invalid_because(
            format!("batch \"{batch}\" already exists and is not a run of chain \"{chain}\""),
            "Give the run another key, or rename that batch's steps.",
        ));
    }
    query::run(sql::LOCK_STEP_IDS, &[])?;
    let after = query::one::<i64>(sql::NEXT_FREE_ID, &[])?.unwrap_or(0);
    let first_step = query::one::<i64>(
        sql::COPY_STEPS,
        &[chain.into(), batch.as_str().into(), after.into()],
    )?
    .ok_or_else(|| BatchError::EmptyChain {
        chain: chain.into(),
    })?;
    let number = query::one::<i64>(
        sql::INSERT_RUN,
        &[
            chain.into(),
            run_key.into(),
            batch.as_str().into(),
            first_step.into(),
            caller.into(),
        ],
    )?
    .ok_or_else(|| BatchError::Internal("INSERT ... RETURNING returned no row".into()))?;
    Ok(Run {
        batch,
        first_step,
        number,
    })
}

/// The first run of `chain` made before run `number` that is neither done nor abandoned.
fn unfinished_before(chain: &str, number: i64) -> Result<Option<Unfinished>> {
    query::row(
        sql::UNFINISHED_BEFORE,
        &[chain.into(), number.into()],
        |r| {
            let u = UnfinishedRow::read(r)?;
            Ok(Unfinished {
                batch: u.batch,
                run_key: u.run_key,
                step: u.step,
                status: StepStatus::parse(&u.status)?,
                error: u.error,
            })
        },
    )
}

/// What a run that waits its turn says, so that a schedule's log (pg_cron's
/// job_run_details) and the DBA see why.
fn notice_waiting(chain: &str, batch: &str, earlier: &Unfinished) {
    let quoted = |s: &str| s.replace('\'', "''");
    let why = match (earlier.status, &earlier.error) {
        (StepStatus::Failed, Some(error)) => format!("its step {} failed: {error}", earlier.step),
        (StepStatus::Failed, None) => format!("its step {} failed", earlier.step),
        _ => format!("its step {} is not done yet", earlier.step),
    };
    let retry = if earlier.status == StepStatus::Failed {
        format!(
            "retry its step (etc_batch.retry_step({})) and run it again (CALL etc_batch.run_chain('{}', '{}')), ",
            earlier.step,
            quoted(chain),
            quoted(&earlier.run_key)
        )
    } else {
        String::new()
    };
    if !pgrx::PgLogLevel::NOTICE.is_interesting() {
        return;
    }
    pgrx::pg_sys::panic::ErrorReport::new(
        pgrx::PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        format!(
            "run \"{batch}\" waits its turn: the earlier run \"{}\" is not finished",
            earlier.batch
        ),
        "etc_batch",
    )
    .set_detail(format!("{}. Nothing of run \"{batch}\" ran.", capitalized(&why)))
    .set_hint(format!(
        "Finish the earlier run ({retry}or end it with etc_batch.abandon_run('{}', '{}'); then run this one again.",
        quoted(chain),
        quoted(&earlier.run_key)
    ))
    .report(pgrx::PgLogLevel::NOTICE);
}

fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().collect::<String>() + chars.as_str(),
        None => String::new(),
    }
}

/// Ends run `run_key` of `chain` on purpose: it is paused for good and kept, with who
/// ended it and when; a later run no longer waits for it. Returns false when it was
/// abandoned already.
pub fn abandon(chain: &str, run_key: &str) -> Result<bool> {
    let by = current_user();
    as_owner(|| {
        let batch = query::row(sql::RUN_STATE, &[chain.into(), run_key.into()], |r| {
            RunState::read(r).map(|s| (s.batch, s.abandoned, s.done))
        })?;
        match batch {
            None => Err(BatchError::UnknownRun {
                chain: chain.into(),
                run_key: run_key.into(),
            }),
            Some((_, true, _)) => Ok(false),
            Some((batch, false, true)) => Err(BatchError::RunDone {
                chain: chain.into(),
                run_key: run_key.into(),
                batch,
            }),
            Some((batch, false, false)) => {
                query::run(sql::ABANDON_RUN, &[chain.into(), run_key.into(), by.into()])?;
                crate::pauses::pause_batch(&batch)?;
                Ok(true)
            }
        }
    })
}

/// What a batch is: a chain's definition, a run (abandoned or not), or neither.
enum BatchKind {
    Definition,
    Run { run_key: String },
    Abandoned(BatchError),
    Plain,
}

fn kind_of(batch: &str) -> Result<BatchKind> {
    let found = query::row(sql::BATCH_KIND, &[batch.into()], |r| {
        KindRow::read(r).map(|k| {
            (
                k.definition,
                k.chain,
                k.run_key,
                k.abandoned_by,
                k.abandoned_at,
            )
        })
    })?;
    Ok(match found {
        Some((true, ..)) => BatchKind::Definition,
        Some((false, Some(chain), Some(run_key), Some(by), at)) => {
            BatchKind::Abandoned(BatchError::RunAbandoned {
                chain,
                run_key,
                by,
                at: at.map(|t| t.to_string()).unwrap_or_default(),
            })
        }
        Some((false, _, Some(run_key), None, _)) => BatchKind::Run { run_key },
        _ => BatchKind::Plain,
    })
}

/// What the runner must know of a batch before it runs step `first` of it: refused when
/// it is a chain's definition or an abandoned run; the run key, when it is a run.
pub fn runnable(batch: &str, first: i64) -> Result<Option<String>> {
    match kind_of(batch)? {
        BatchKind::Definition => Err(BatchError::DefinitionStep {
            id: first,
            chain: batch.into(),
        }),
        BatchKind::Abandoned(e) => Err(e),
        BatchKind::Run { run_key } => Ok(Some(run_key)),
        BatchKind::Plain => Ok(None),
    }
}

/// resume_batch refuses an abandoned run: it stays paused for good.
pub fn check_resumable(batch: &str) -> Result<()> {
    match as_owner(|| kind_of(batch))? {
        BatchKind::Abandoned(e) => Err(e),
        _ => Ok(()),
    }
}

/// How run batch `batch` stands after its runner returned: done, paused or pending.
pub fn status(batch: &str) -> Result<ChainRunStatus> {
    match as_owner(|| query::one::<String>(sql::RUN_STATUS, &[batch.into()]))? {
        Some(status) => ChainRunStatus::parse(&status),
        None => Ok(ChainRunStatus::Pending),
    }
}

/// Keeps `run_key` as the run this backend runs the steps of until the guard drops.
pub fn enter(run_key: Option<String>) -> CurrentRun {
    CurrentRun(CURRENT.with(|c| c.replace(run_key)))
}

/// Puts back the run that was current before, when a runner is done.
pub struct CurrentRun(Option<String>);

impl Drop for CurrentRun {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = self.0.take());
    }
}

/// The run key of the run whose step this backend is running, None outside one.
pub fn current() -> Option<String> {
    CURRENT.with(|c| c.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::capitalized;

    #[test]
    fn a_reason_starts_a_sentence() {
        assert_eq!(capitalized("its step 24 failed"), "Its step 24 failed");
        assert_eq!(capitalized(""), "");
    }
}
