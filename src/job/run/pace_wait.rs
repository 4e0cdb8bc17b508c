//! The wait before a chunk: until the job's pace (job/pace/) lets it go, holding nothing.

use super::drainer::Drainer;
use super::ending::AtWindowClose;
use crate::error::{BatchError, Result};
use crate::halt::Halt;
use crate::job::pace::signals;
use crate::job::pace::{self, Signal, Wait};
use crate::job::sql;
use crate::pauses::Paused;
use crate::query;
use crate::txn::Transactions;
use pgrx::prelude::*;

/// What the pace let the next chunk do.
pub(super) enum BeforeChunk {
    Go,
    /// A critical signal paused the job (who paused it, as its pause row says).
    Paused(Option<Paused>),
    OutsideWindows {
        opens_in: u32,
    },
}

impl Drainer {
    /// Waits until the job's pace (job/pace) lets its next chunk go: while a signal holds
    /// it back (saying so once per kind of wait), then for its slot of the rate. Every
    /// wait begins with a COMMIT, so that it holds nothing. A critical signal pauses the
    /// job instead; outside its windows, a call returns at once (`at_window_close`). The
    /// job's pause, or `halt`, ends a wait.
    pub(super) fn wait_for_pace(
        &mut self,
        tx: &mut impl Transactions,
        at_window_close: AtWindowClose,
        halt: &dyn Halt,
    ) -> Result<BeforeChunk> {
        let mut told: Option<Wait> = None;
        let mut since_told = std::time::Instant::now();
        loop {
            let now = std::time::Instant::now();
            let waiting = told.is_some();
            let (pace, due, signal, slot) = tx.item(|_| {
                self.owner(|| {
                    let pace = pace::of(self.id())?;
                    let due = pace.has_signals()
                        && (waiting
                            || pace != self.signals.pace
                            || self
                                .signals
                                .read_at
                                .is_none_or(|at| now.duration_since(at) >= signals::interval()));
                    let signal = if due {
                        pace::read_signals(&pace, self.def.target, |text| {
                            self.as_author(|| signals::ask(text))
                        })?
                    } else {
                        Signal::Go
                    };
                    if let Signal::Pause(reason) = &signal {
                        if let Some(waited) = &told {
                            self.end_wait(waited, since_told.elapsed())?;
                        }
                        pace::pause_for(&self.def, self.bookkeeper, reason)?;
                        let paused = crate::pauses::of_job(self.id())?;
                        return Ok((pace, due, Signal::Go, Err(paused)));
                    }
                    let slot = match signal {
                        Signal::Go => pace::take_slot(self.id(), &pace, self.def.chunk_size)?,
                        _ => None,
                    };
                    Ok((pace, due, signal, Ok(slot)))
                })
            })?;
            self.transaction_time = pace.transaction_target();
            if due {
                self.signals.read_at = Some(now);
                self.signals.pace = pace.clone();
            }
            let slot = match slot {
                Ok(slot) => slot,
                Err(paused) => {
                    tx.commit();
                    if let Some(paused) = &paused {
                        log!(
                            "etc_batch paused job \"{}\": {}",
                            self.id(),
                            paused.reason.as_deref().unwrap_or("paused")
                        );
                    }
                    return Ok(BeforeChunk::Paused(paused));
                }
            };
            // a slot taken locks the pace's row: let it go before the chunk, so that
            // other drainers take theirs meanwhile
            if !matches!(signal, Signal::Go) || pace.rows_per_second.is_some() {
                tx.commit();
            }
            match signal {
                Signal::Pause(_) => unreachable!("a pause is returned above"),
                Signal::Go => {
                    if let Some(waited) = told.take() {
                        // the wait is over: said in a transaction of its own
                        tx.item(|_| self.end_wait(&waited, since_told.elapsed()))?;
                        tx.commit();
                    }
                    if let Some(delay) = slot {
                        self.activity.report(&format!(
                            "job \"{}\": {}",
                            self.id(),
                            Wait::Slot(delay).reason()
                        ));
                        crate::txn::sleep(delay);
                    }
                    return Ok(BeforeChunk::Go);
                }
                Signal::Wait(Wait::OutsideWindows { opens_in })
                    if at_window_close == AtWindowClose::Return =>
                {
                    return Ok(BeforeChunk::OutsideWindows { opens_in });
                }
                Signal::Wait(wait) => {
                    if !told.as_ref().is_some_and(|t| t.same_kind(&wait)) {
                        notice!("job \"{}\" waits: {}", self.id(), wait.reason());
                        tx.item(|_| {
                            // a wait of another kind before it is over
                            if let Some(waited) = &told {
                                self.end_wait(waited, since_told.elapsed())?;
                            }
                            crate::events::job(
                                self.def.tables.number,
                                self.id(),
                                "waiting",
                                serde_json::json!({"for": wait.kind(), "reason": wait.reason()}),
                            );
                            Ok::<_, BatchError>(())
                        })?;
                        tx.commit();
                        told = Some(wait.clone());
                        since_told = std::time::Instant::now();
                    }
                    // a pause_job, or the halt (a stop_launch of a worker's launch), ends
                    // the wait as it would before a chunk: a window may be hours away
                    let held = tx.item(|_| {
                        let held =
                            self.owner(|| crate::job::run::chunk::held_back(self.id(), halt))?;
                        if held.is_some() {
                            self.end_wait(&wait, since_told.elapsed())?;
                        }
                        Ok::<_, BatchError>(held)
                    })?;
                    // the wait holds nothing, not even the snapshot of that look
                    tx.commit();
                    if let Some(paused) = held {
                        return Ok(BeforeChunk::Paused(Some(paused)));
                    }
                    self.activity
                        .report(&format!("job \"{}\": {}", self.id(), wait.activity()));
                    let pause = match wait {
                        // a worker outside its windows sleeps until they open, looking
                        // again each interval (the pace may change meanwhile)
                        Wait::OutsideWindows { opens_in } => signals::recheck().min(
                            std::time::Duration::from_secs(u64::from(opens_in.max(1)) * 60),
                        ),
                        _ => signals::recheck(),
                    };
                    crate::txn::sleep(pause);
                }
            }
        }
    }

    /// A wait that is over, after `lasted`: counted in job_wait (the metrics) and told to
    /// listeners, in the current transaction. Run as anyone: it switches to the owner.
    pub(super) fn end_wait(&self, waited: &Wait, lasted: std::time::Duration) -> Result<()> {
        let seconds = lasted.as_secs_f64();
        self.owner(|| {
            query::run(
                sql::RECORD_WAIT,
                &[self.id().into(), waited.kind().into(), seconds.into()],
            )
        })?;
        crate::events::job(
            self.def.tables.number,
            self.id(),
            "waited",
            serde_json::json!({"for": waited.kind(), "seconds": seconds}),
        );
        Ok(())
    }
}
