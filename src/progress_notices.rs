//! How often a long call tells its caller where it stands: `etc_batch.progress_interval`.
//!
//! A drain of a hundred thousand chunks that told of every chunk printed a hundred
//! thousand lines into a psql session, and a chain that told of every step ran a tenth
//! slower for it under PostgreSQL's default client_min_messages. So a call tells at most
//! once per interval (1 s by default) where it stands, and always once at the end how it
//! ended; 0 tells every chunk and step as it commits, as etc_batch 0.3.0 did, and says
//! nothing more at the end. What goes wrong is told at once whatever the setting: a
//! step's or a chunk's error, a retry, a pause, a wait for the replicas.
//!
//! No message is put together when nobody would receive it (client_min_messages and
//! log_min_messages both above NOTICE).

use pgrx::{pg_sys, GucContext, GucFlags, GucRegistry, GucSetting};
use std::time::{Duration, Instant};

/// At most how often, in milliseconds, a call tells where it stands; 0: every chunk and
/// step.
pub static PROGRESS_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(1000);

pub fn register() {
    GucRegistry::define_int_guc(
        c"etc_batch.progress_interval",
        c"At most how often a drain or a chain tells its caller where it stands.",
        c"A NOTICE at most this often while a call works (chunks or steps committed, the rate, the estimated time to go), and one at the end saying how the call ended. 0 sends a NOTICE for every chunk and step instead.",
        &PROGRESS_INTERVAL,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
}

/// Whether a NOTICE would reach anyone, the client or the server's log.
pub fn are_sent() -> bool {
    // SAFETY: reads two settings.
    unsafe { pg_sys::message_level_is_interesting(pg_sys::NOTICE as i32) }
}

/// The pace of one call's progress notices.
#[derive(Debug, Clone, Copy)]
pub struct Teller {
    interval: Duration,
    started: Instant,
    last: Instant,
    /// Whether NOTICEs reach anyone, read when the call begins.
    heard: bool,
}

impl Teller {
    /// For a call beginning now, at the session's etc_batch.progress_interval.
    pub fn begin() -> Teller {
        let millis = u64::try_from(PROGRESS_INTERVAL.get()).unwrap_or(0);
        Teller::new(Duration::from_millis(millis), Instant::now(), are_sent())
    }

    pub fn new(interval: Duration, now: Instant, heard: bool) -> Teller {
        Teller {
            interval,
            started: now,
            last: now,
            heard,
        }
    }

    /// Each chunk and step is told as it commits (the setting is 0).
    pub fn tells_each(&self) -> bool {
        self.heard && self.interval.is_zero()
    }

    /// Whether where the call stands is to be told now: an interval has passed since the
    /// call began or since the last time it was told.
    pub fn due(&mut self, now: Instant) -> bool {
        if !self.heard || self.interval.is_zero() || now.duration_since(self.last) < self.interval {
            return false;
        }
        self.last = now;
        true
    }

    /// Whether the call says at its end how it ended.
    pub fn tells_the_end(&self) -> bool {
        self.heard && !self.interval.is_zero()
    }

    /// How long the call has been at work.
    pub fn elapsed(&self, now: Instant) -> Duration {
        now.duration_since(self.started)
    }
}

/// `count` things done in `elapsed`, per second, as a whole number ("0" for none yet).
pub fn per_second(count: i64, elapsed: Duration) -> String {
    let seconds = elapsed.as_secs_f64();
    if count <= 0 || seconds <= 0.0 {
        return "0".to_string();
    }
    format!("{:.0}", count as f64 / seconds)
}

/// The time `left` more things take at the pace of `done` in `elapsed`; None before
/// anything was done.
pub fn time_to_go(done: i64, left: i64, elapsed: Duration) -> Option<Duration> {
    if done <= 0 || left < 0 {
        return None;
    }
    Some(elapsed.mul_f64(left as f64 / done as f64))
}

/// A duration as a person reads it: "850 ms", "12 s", "4 min 10 s", "2 h 5 min".
pub fn human(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0 => format!("{} ms", duration.as_millis()),
        1..=59 => format!("{seconds} s"),
        60..=3599 => format!("{} min {} s", seconds / 60, seconds % 60),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

/// "1 item", "2 items".
pub fn counted(count: i64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, millis: u64) -> Instant {
        start + Duration::from_millis(millis)
    }

    #[test]
    fn at_most_once_per_interval() {
        let start = Instant::now();
        let mut teller = Teller::new(Duration::from_secs(1), start, true);
        assert!(!teller.tells_each() && teller.tells_the_end());
        assert!(!teller.due(at(start, 999)));
        assert!(teller.due(at(start, 1000)));
        // counted from the last notice, not from the start
        assert!(!teller.due(at(start, 1500)));
        assert!(!teller.due(at(start, 1999)));
        assert!(teller.due(at(start, 2600)));
        assert!(!teller.due(at(start, 3500)));
        assert!(teller.due(at(start, 3600)));
        assert_eq!(teller.elapsed(at(start, 3600)), Duration::from_millis(3600));
    }

    #[test]
    fn zero_tells_each_and_no_summary() {
        let start = Instant::now();
        let mut teller = Teller::new(Duration::ZERO, start, true);
        assert!(teller.tells_each() && !teller.tells_the_end());
        assert!(!teller.due(at(start, 5000)));
    }

    #[test]
    fn nobody_listening_nothing_told() {
        let start = Instant::now();
        for interval in [Duration::ZERO, Duration::from_millis(1)] {
            let mut teller = Teller::new(interval, start, false);
            assert!(!teller.tells_each() && !teller.tells_the_end());
            assert!(!teller.due(at(start, 5000)));
        }
    }

    #[test]
    fn rates_and_estimates() {
        assert_eq!(per_second(0, Duration::from_secs(3)), "0");
        assert_eq!(per_second(10, Duration::ZERO), "0");
        assert_eq!(per_second(24_000, Duration::from_millis(2000)), "12000");
        assert_eq!(time_to_go(0, 10, Duration::from_secs(1)), None);
        assert_eq!(
            time_to_go(100, 300, Duration::from_secs(2)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(
            time_to_go(5, 0, Duration::from_secs(2)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn durations_as_people_read_them() {
        assert_eq!(human(Duration::from_millis(850)), "850 ms");
        assert_eq!(human(Duration::from_secs(12)), "12 s");
        assert_eq!(human(Duration::from_secs(250)), "4 min 10 s");
        assert_eq!(human(Duration::from_secs(7500)), "2 h 5 min");
        assert_eq!(counted(1, "item", "items"), "1 item");
        assert_eq!(counted(3, "chunk", "chunks"), "3 chunks");
    }
}
