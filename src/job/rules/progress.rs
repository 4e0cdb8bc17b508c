//! The promise a checkpoint makes, and how it is checked before it is trusted.
//!
//! `next_index` says: every approved item at a position below it is committed, the
//! business change and its audit row together, and nothing at or beyond it is. Before a
//! drainer advances a job it checks that promise, in a way that costs the same at the
//! first and at the millionth chunk, because of how the records can change:
//! - next_index sits on a chunk boundary or at the end, never past it (arithmetic);
//! - the checkpoint carries a seal, a hash of the job id, next_index and the chunk count
//!   written with every checkpoint: a checkpoint moved by hand, forward, backward or
//!   onto another boundary, no longer matches it (one column);
//! - no audit row exists at or beyond next_index (one index probe); one below it
//!   cannot be inserted, since the primary key (job, position) already holds one there,
//!   and the sealed checkpoint cannot have been moved past positions never audited;
//! - no audit row and no approved item was updated, deleted or truncated since it was
//!   written: triggers on job_audit and job_item count every such change on the job's
//!   row, and the count must be zero (one column).
//!
//! Together these are exact for every change made through SQL that does not forge the
//! seal. A superuser who disables the triggers, or recomputes the seal, can hide a
//! change from the per-chunk check; `etc_batch.verify_job` compares every row and finds
//! it anyway.

use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub next_index: i32,
    pub item_count: i32,
    pub chunk_size: i32,
}

impl Progress {
    /// The positions of the next chunk, or None when the job is complete.
    pub fn next_chunk(&self) -> Option<Range<i32>> {
        if self.next_index >= self.item_count {
            return None;
        }
        let end = self
            .next_index
            .saturating_add(self.chunk_size)
            .min(self.item_count);
        Some(self.next_index..end)
    }

    /// 1-based number of the chunk starting at next_index, and how many chunks there are.
    pub fn chunk_number(&self) -> (i32, i32) {
        (
            self.next_index / self.chunk_size + 1,
            chunk_count(self.item_count, self.chunk_size),
        )
    }

    /// The arithmetic part of the check.
    pub fn check_position(&self) -> Result<(), String> {
        if self.next_index < 0 || self.next_index > self.item_count {
            return Err(format!(
                "The checkpoint next_index is {}, outside the approved list of {} items.",
                self.next_index, self.item_count
            ));
        }
        if self.next_index != self.item_count && self.next_index % self.chunk_size != 0 {
            return Err(format!(
                "The checkpoint next_index is {}, which is not a chunk boundary (chunk size {}).",
                self.next_index, self.chunk_size
            ));
        }
        Ok(())
    }
}

/// How many chunks `items` approved items make at `chunk_size` (the last may be short).
pub fn chunk_count(items: i32, chunk_size: i32) -> i32 {
    ((items as i64 + chunk_size as i64 - 1) / chunk_size as i64) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(next_index: i32) -> Progress {
        Progress {
            next_index,
            item_count: 25,
            chunk_size: 10,
        }
    }

    #[test]
    fn chunks_follow_the_frozen_list() {
        assert_eq!(p(0).next_chunk(), Some(0..10));
        assert_eq!(p(20).next_chunk(), Some(20..25));
        assert_eq!(p(25).next_chunk(), None);
        assert_eq!(p(20).chunk_number(), (3, 3));
        assert_eq!(chunk_count(25, 10), 3);
        assert_eq!(chunk_count(30, 10), 3);
        assert_eq!(chunk_count(1, 10), 1);
    }

    #[test]
    fn checkpoints_sit_on_boundaries_or_at_the_end() {
        for ok in [0, 10, 20, 25] {
            assert!(p(ok).check_position().is_ok(), "{ok}");
        }
        assert!(p(15)
            .check_position()
            .unwrap_err()
            .contains("not a chunk boundary"));
        assert!(p(30)
            .check_position()
            .unwrap_err()
            .contains("outside the approved list"));
        assert!(p(-1).check_position().is_err());
    }

    #[test]
    fn huge_chunk_sizes_do_not_overflow() {
        let q = Progress {
            next_index: 0,
            item_count: 3,
            chunk_size: i32::MAX,
        };
        assert_eq!(q.next_chunk(), Some(0..3));
        assert_eq!(q.chunk_number(), (1, 1));
    }
}
