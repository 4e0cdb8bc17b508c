//! What a drain tells its caller: each chunk as it commits, where the call stands at
//! most once per etc_batch.progress_interval, and how it ended (progress_notices.rs).

use super::ending::{Committed, Drained, Ended};
use crate::progress_notices::{self as told, Teller};
use pgrx::prelude::*;

impl Drained {
    /// The chunks of a transaction that committed, counted and told in the order they
    /// ran (each one at etc_batch.progress_interval 0). Returns the last one's number,
    /// the job's chunks and whether the job is done with it.
    pub(super) fn tell(
        &mut self,
        chunks: Vec<Committed>,
        teller: &Teller,
    ) -> Option<(i32, i32, bool)> {
        let mut last = None;
        for chunk in chunks {
            // only now: a client told of a chunk finds it committed, whatever happens
            // to the server next
            if teller.tells_each() {
                committed_notice(&chunk);
            }
            self.chunks += 1;
            self.items += chunk.items;
            self.skipped += chunk.skipped as i64;
            self.first_key.get_or_insert(chunk.first_key);
            self.last_key = Some(chunk.last_key);
            last = Some((chunk.number, chunk.total, chunk.last));
        }
        last
    }

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
fn committed_notice(chunk: &Committed) {
    let Committed {
        number,
        total,
        items,
        skipped,
        first_key,
        last_key,
        ..
    } = chunk;
    notice!(
        "chunk {number} of {total} committed: {items} item{}, keys {first_key} to {last_key}{}",
        if *items == 1 { "" } else { "s" },
        if *skipped == 0 {
            String::new()
        } else {
            format!(", {skipped} of them skipped (their rows had drifted)")
        },
    );
}

/// The chunks of one transaction, as an error names them: "chunk 7 of job "x"", or
/// "chunks 7 to 9 of job "x"".
pub(super) fn chunks_named(chunks: &[Committed], job_id: &str) -> String {
    match (chunks.first(), chunks.last()) {
        (Some(first), Some(last)) if first.number != last.number => {
            format!(
                "chunks {} to {} of job \"{job_id}\"",
                first.number, last.number
            )
        }
        (Some(only), _) => format!("chunk {} of job \"{job_id}\"", only.number),
        _ => format!("job \"{job_id}\""),
    }
}
