//! Chunks committed together: how many consecutive chunks one transaction of a drain
//! takes when the job has a time target for its transactions (pace_job's
//! transaction_time), judged from the chunks it has just run.
//!
//! A group is one transaction: its chunks are run one after the other, each with its own
//! audit rows and its own move of the checkpoint (or its own chunk row), and the group
//! commits whole once the next chunk would not fit the target, at least one chunk in it.
//! Nothing of a group is told before it commits. When a round in a group comes to
//! anything but a chunk done (a lock timeout, a deadlock, a row that drifted, a failure),
//! the whole group is rolled back, and its chunks and the one at fault run one per
//! transaction, as a job without a target runs them, so that the chunk at fault is found
//! and everything after behaves as it always does: its conflict, its retries, its
//! NOTICEs, its events. Grouping resumes after them.

use std::time::{Duration, Instant};

/// The group of chunks in the drain's open transaction, and what it was sized by.
pub(super) struct Group<C> {
    /// The chunks done in the open transaction, told once it commits.
    chunks: Vec<C>,
    /// When the group's first chunk began.
    started: Option<Instant>,
    /// How long its last chunk took.
    last_chunk: Duration,
    /// The target of the open transaction: read when its first chunk began, so that a
    /// pace_job while it runs applies from the next transaction.
    target: Option<Duration>,
    /// After a group was rolled back: how many chunks run one per transaction yet.
    solo: usize,
}

impl<C> Default for Group<C> {
    fn default() -> Self {
        Group {
            chunks: Vec::new(),
            started: None,
            last_chunk: Duration::ZERO,
            target: None,
            solo: 0,
        }
    }
}

impl<C> Group<C> {
    /// Whether chunks done in the open transaction wait for its commit.
    pub(super) fn is_open(&self) -> bool {
        !self.chunks.is_empty()
    }

    /// A chunk begins at `now`, under `target` (the job's transaction_time now): the
    /// first of a transaction takes the target for the whole transaction.
    pub(super) fn chunk_begins(&mut self, now: Instant, target: Option<Duration>) {
        if self.started.is_none() {
            self.started = Some(now);
            self.target = target.filter(|_| self.solo == 0);
        }
    }

    /// Whether the chunks of the open transaction may share it: it has a target.
    pub(super) fn shared(&self) -> bool {
        self.target.is_some()
    }

    /// The chunk that began last is done, at `now`, its transaction still open.
    pub(super) fn chunk_done(&mut self, chunk: C, began: Instant, now: Instant) {
        self.last_chunk = now.saturating_duration_since(began);
        self.chunks.push(chunk);
    }

    /// Whether one more chunk, taking as long as the last one did, still fits the
    /// target at `now`. Without a target, or in the chunks after a rollback, never.
    pub(super) fn has_room(&self, now: Instant) -> bool {
        match (self.target, self.started) {
            (Some(target), Some(started)) => {
                now.saturating_duration_since(started) + self.last_chunk <= target
            }
            _ => false,
        }
    }

    /// The group committed: its chunks, in the order they ran, to be told.
    pub(super) fn committed(&mut self) -> Vec<C> {
        self.solo = self.solo.saturating_sub(self.chunks.len());
        self.started = None;
        std::mem::take(&mut self.chunks)
    }

    /// The group's transaction was rolled back, before a chunk after its `done` ones
    /// came to anything but done: those chunks and that one run one per transaction next.
    /// Returns how many chunks of the group were rolled back.
    pub(super) fn rolled_back(&mut self) -> usize {
        let done = self.chunks.len();
        if done > 0 {
            self.solo = done + 1;
        }
        self.chunks.clear();
        self.started = None;
        done
    }

    /// A round that was not a chunk done ended the transaction, committed (a pause, the
    /// job found done, every chunk held by others): a group is never open then.
    pub(super) fn transaction_ended(&mut self) {
        debug_assert!(self.chunks.is_empty());
        self.started = None;
    }

    /// How many chunks are done in the open transaction.
    pub(super) fn len(&self) -> usize {
        self.chunks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Group;
    use std::time::{Duration, Instant};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn without_a_target_every_chunk_is_a_transaction() {
        let t0 = Instant::now();
        let mut g: Group<i32> = Group::default();
        g.chunk_begins(t0, None);
        g.chunk_done(1, t0, t0 + ms(1));
        assert!(!g.has_room(t0 + ms(1)));
        assert_eq!(g.committed(), vec![1]);
    }

    #[test]
    fn chunks_join_while_the_next_one_fits_the_target() {
        let t0 = Instant::now();
        let mut g: Group<i32> = Group::default();
        let target = Some(ms(200));
        // chunks of 60 ms: after 1 (60) and 2 (120) a third fits (180); after it, not
        g.chunk_begins(t0, target);
        g.chunk_done(1, t0, t0 + ms(60));
        assert!(g.has_room(t0 + ms(60)));
        g.chunk_begins(t0 + ms(60), target);
        g.chunk_done(2, t0 + ms(60), t0 + ms(120));
        assert!(g.has_room(t0 + ms(120)));
        g.chunk_begins(t0 + ms(120), target);
        g.chunk_done(3, t0 + ms(120), t0 + ms(180));
        assert!(!g.has_room(t0 + ms(180)));
        assert_eq!(g.committed(), vec![1, 2, 3]);
        assert!(!g.is_open());
    }

    #[test]
    fn a_chunk_longer_than_the_target_is_a_transaction_of_its_own() {
        let t0 = Instant::now();
        let mut g: Group<i32> = Group::default();
        g.chunk_begins(t0, Some(ms(200)));
        g.chunk_done(1, t0, t0 + ms(350));
        assert!(!g.has_room(t0 + ms(350)));
    }

    #[test]
    fn the_target_of_a_transaction_is_the_one_its_first_chunk_began_under() {
        let t0 = Instant::now();
        let mut g: Group<i32> = Group::default();
        g.chunk_begins(t0, Some(ms(200)));
        g.chunk_done(1, t0, t0 + ms(10));
        // pace_job cleared the target meanwhile: this transaction keeps its own
        g.chunk_begins(t0 + ms(10), None);
        g.chunk_done(2, t0 + ms(10), t0 + ms(20));
        assert!(g.has_room(t0 + ms(20)));
        g.committed();
        g.chunk_begins(t0 + ms(20), None);
        g.chunk_done(3, t0 + ms(20), t0 + ms(30));
        assert!(!g.has_room(t0 + ms(30)));
    }

    #[test]
    fn after_a_rollback_the_group_and_the_chunk_at_fault_run_one_per_transaction() {
        let t0 = Instant::now();
        let target = Some(ms(200));
        let mut g: Group<i32> = Group::default();
        g.chunk_begins(t0, target);
        g.chunk_done(1, t0, t0 + ms(1));
        g.chunk_begins(t0, target);
        g.chunk_done(2, t0, t0 + ms(1));
        g.chunk_begins(t0, target);
        // chunk 3 timed out: 1, 2 and 3 again, each alone
        assert_eq!(g.rolled_back(), 2);
        for n in 1..=3 {
            g.chunk_begins(t0, target);
            g.chunk_done(n, t0, t0 + ms(1));
            assert!(!g.has_room(t0 + ms(1)), "chunk {n} runs alone");
            assert_eq!(g.committed(), vec![n]);
        }
        // then the target again
        g.chunk_begins(t0, target);
        g.chunk_done(4, t0, t0 + ms(1));
        assert!(g.has_room(t0 + ms(1)));
    }

    #[test]
    fn a_rollback_of_a_lone_chunk_changes_nothing_after_it() {
        let t0 = Instant::now();
        let mut g: Group<i32> = Group::default();
        g.chunk_begins(t0, Some(ms(200)));
        assert_eq!(g.rolled_back(), 0);
        g.chunk_begins(t0, Some(ms(200)));
        g.chunk_done(1, t0, t0 + ms(1));
        assert!(g.has_room(t0 + ms(1)));
    }
}
