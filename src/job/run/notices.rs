//! What a drain tells its caller: each chunk as it commits, where the call stands at
//! most once per etc_batch.progress_interval, and how it ended (progress_notices.rs).

use super::ending::{Drained, Ended};
use crate::progress_notices::{self as told, Teller};
use pgrx::prelude::*;

impl Drained {
    /// Where a call stands, at most once per etc_batch.progress_interval.
    pub(super) fn progress_notice(&self, job_id: &str, number: i32, total: i32, teller: &Teller) {
        let elapsed = teller.elapsed(std::time::Instant::now());
        let to_go = told::time_to_go(self.chunks.into(), (total - number).into(), elapsed)
            .map(|left| format!(", about {} to go", told::human(left)))
            .unwrap_or_default();
        notice!(
            "job \"{job_id}\": chunk {number} of {total} committed; this call: {}, {}, {} items/s{to_go}",
            told::counted(self.chunks.into(), "chunk", "chunks"),
            told::counted(self.items, "item", "items"),
            told::per_second(self.items, elapsed),
        );
    }

    /// How the call ended, once, when its chunks are not told one by one.
    pub(super) fn end_notice(&self, job_id: &str) {
        let done = match (&self.first_key, &self.last_key) {
            (Some(first), Some(last)) if self.chunks > 0 => format!(
                "committed {}, {}, keys {first} to {last}{}",
                told::counted(self.chunks.into(), "chunk", "chunks"),
                told::counted(self.items, "item", "items"),
                if self.skipped == 0 {
                    String::new()
                } else {
                    format!(
                        ", {} of them skipped (their rows had drifted)",
                        self.skipped
                    )
                },
            ),
            _ => "committed nothing".to_string(),
        };
        // the job's status, but that a paused job is told as paused
        let status = match self.ended {
            paused @ Ended::Paused => paused.as_str(),
            ended => ended.job_status().as_str(),
        };
        notice!("job \"{job_id}\": this call {done}; the job is {status}");
    }
}

/// The NOTICE of a committed chunk, at etc_batch.progress_interval 0.
pub(super) fn committed_notice(
    number: i32,
    total: i32,
    items: i64,
    skipped: usize,
    first_key: &str,
    last_key: &str,
) {
    notice!(
        "chunk {number} of {total} committed: {items} item{}, keys {first_key} to {last_key}{}",
        if items == 1 { "" } else { "s" },
        if skipped == 0 {
            String::new()
        } else {
            format!(", {skipped} of them skipped (their rows had drifted)")
        },
    );
}
