//! The hours a job may run (pace_job's `windows`): each entry days and a time of day
//! range, e.g. `mon-fri 22:00-06:00` or `sat,sun 00:00-24:00`, read in the pace's time
//! zone. A range whose end is not after its start runs past midnight into the next day,
//! so `fri 22:00-06:00` is Friday night to Saturday morning, and a week wraps: `sun
//! 23:00-01:00` ends on Monday.
//!
//! Plain logic over minutes of the week (Monday 00:00 is 0), so that the parsing, the
//! refusals and the question "inside or not, and for how long" are unit tested here; the
//! pace reads the minute of the week now in its time zone from PostgreSQL.

use crate::error::{BatchError, Result};

const DAY: u32 = 24 * 60;
pub const WEEK: u32 = 7 * DAY;
const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// The windows of a pace, as spans of minutes of the week: [start, end), none
/// overlapping another, sorted by start, none crossing the end of the week (a span that
/// does is kept as two).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    spans: Vec<(u32, u32)>,
}

impl Windows {
    /// Parses `entries`; refuses an empty list, an entry that does not parse, an empty
    /// range and windows that overlap, naming the entry.
    pub fn parse(entries: &[String]) -> Result<Windows> {
        if entries.is_empty() {
            return Err(BatchError::invalid_because(
                "windows is empty",
                "Give at least one window, e.g. 'mon-fri 22:00-06:00', or NULL for no windows (the job may run at any hour).",
            ));
        }
        // each span with the entry it came from, to name both of two that overlap
        let mut spans: Vec<(u32, u32, usize)> = Vec::new();
        for (n, entry) in entries.iter().enumerate() {
            let (days, start, end) = parse_entry(entry)?;
            for day in days {
                let from = day * DAY + start;
                let to = day * DAY + if end > start { end } else { DAY + end };
                if to > WEEK {
                    spans.push((from, WEEK, n));
                    spans.push((0, to - WEEK, n));
                } else {
                    spans.push((from, to, n));
                }
            }
        }
        spans.sort();
        for pair in spans.windows(2) {
            let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
            if start < end {
                let detail = if a == b {
                    format!("Window '{}' covers some hours twice.", entries[a])
                } else {
                    format!(
                        "Windows '{}' and '{}' share some hours.",
                        entries[a.min(b)],
                        entries[a.max(b)]
                    )
                };
                return Err(BatchError::invalid_because("windows overlap", detail));
            }
        }
        Ok(Windows {
            spans: spans.into_iter().map(|(s, e, _)| (s, e)).collect(),
        })
    }

    /// Whether `minute` of the week is inside a window.
    pub fn inside(&self, minute: u32) -> bool {
        self.spans.iter().any(|&(s, e)| s <= minute && minute < e)
    }

    /// How many minutes from `minute` of the week until the next window opens (0 when
    /// it is inside one).
    pub fn opens_in(&self, minute: u32) -> u32 {
        if self.inside(minute) {
            return 0;
        }
        self.spans
            .iter()
            .map(|&(s, _)| (s + WEEK - minute) % WEEK)
            .min()
            .unwrap_or(0)
    }
}

impl Windows {
    /// The minutes of the week the windows hold, in all.
    fn open_per_week(&self) -> u32 {
        self.spans.iter().map(|&(s, e)| e - s).sum()
    }

    /// How many minutes of the clock it takes, from `minute` of the week, for `work`
    /// minutes of work done only inside the windows: the waits for the windows to open
    /// counted, as a job's estimated finish counts them.
    pub fn wall_minutes(&self, minute: u32, work: f64) -> f64 {
        let per_week = self.open_per_week();
        if per_week == 0 || work <= 0.0 {
            return work.max(0.0);
        }
        // whole weeks of work at once, all but the last: a backfill of months is not
        // walked a span at a time, and what is left (at most a week's windows) is
        let weeks = ((work / f64::from(per_week)).ceil() - 1.0).max(0.0);
        let (mut work, mut wall) = (work - weeks * f64::from(per_week), weeks * f64::from(WEEK));
        let mut at = minute % WEEK;
        while work > 0.0 {
            match self.spans.iter().find(|&&(s, e)| s <= at && at < e) {
                Some(&(_, end)) => {
                    let here = f64::from(end - at);
                    if work <= here {
                        return wall + work;
                    }
                    wall += here;
                    work -= here;
                    at = end % WEEK;
                }
                None => {
                    let wait = self.opens_in(at);
                    wall += f64::from(wait);
                    at = (at + wait) % WEEK;
                }
            }
        }
        wall
    }
}

/// One entry: its days (0 Monday to 6 Sunday), and its range's start and end in minutes
/// of the day (the end up to 24:00).
fn parse_entry(entry: &str) -> Result<(Vec<u32>, u32, u32)> {
    let bad = |why: &str| {
        BatchError::invalid_because(
            format!("invalid window \"{entry}\""),
            format!("{why} A window is days and a time range, as in 'mon-fri 22:00-06:00' or 'sat,sun 00:00-24:00'."),
        )
    };
    let mut words = entry.split_whitespace();
    let (Some(days), Some(range), None) = (words.next(), words.next(), words.next()) else {
        return Err(bad("It is not days followed by one time range."));
    };
    let mut out = Vec::new();
    for part in days.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (day(a), day(b)),
            None => (day(part), day(part)),
        };
        let (Some(first), Some(last)) = (first, last) else {
            return Err(bad(&format!(
                "\"{part}\" is not a day or a range of days (mon, tue, wed, thu, fri, sat, sun)."
            )));
        };
        let mut d = first;
        loop {
            out.push(d);
            if d == last {
                break;
            }
            d = (d + 1) % 7;
        }
    }
    let Some((start, end)) = range.split_once('-') else {
        return Err(bad(&format!("\"{range}\" is not a time range.")));
    };
    let (Some(start), Some(end)) = (time(start), time(end)) else {
        return Err(bad(&format!(
            "\"{range}\" is not a range of two times of day, HH:MM-HH:MM."
        )));
    };
    if start == DAY {
        return Err(bad("A range begins before 24:00."));
    }
    if start == end {
        return Err(bad("Its range is empty: it begins where it ends."));
    }
    Ok((out, start, end))
}

fn day(name: &str) -> Option<u32> {
    let name = name.to_ascii_lowercase();
    DAYS.iter().position(|d| *d == name).map(|p| p as u32)
}

/// HH:MM, 00:00 to 24:00, in minutes of the day.
fn time(text: &str) -> Option<u32> {
    let (h, m) = text.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    match (h, m) {
        (24, 0) => Some(DAY),
        (0..=23, 0..=59) => Some(h * 60 + m),
        _ => None,
    }
}

/// A number of minutes as a person says it: "45 min", "3 h 20 min".
pub fn human_minutes(minutes: u32) -> String {
    match (minutes / 60, minutes % 60) {
        (0, m) => format!("{m} min"),
        (h, 0) => format!("{h} h"),
        (h, m) => format!("{h} h {m} min"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(entries: &[&str]) -> Result<Windows> {
        Windows::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>())
    }

    fn at(day: u32, hour: u32, minute: u32) -> u32 {
        day * DAY + hour * 60 + minute
    }

    #[test]
    fn a_night_range_runs_into_the_next_day() {
        let windows = w(&["mon-fri 22:00-06:00"]).unwrap();
        assert!(windows.inside(at(0, 22, 0)));
        assert!(windows.inside(at(1, 5, 59)));
        assert!(!windows.inside(at(1, 6, 0)));
        assert!(!windows.inside(at(0, 12, 0)));
        // Friday night runs into Saturday morning
        assert!(windows.inside(at(5, 3, 0)));
        // nothing opened on Sunday, so Monday morning is outside
        assert!(!windows.inside(at(0, 3, 0)));
        assert_eq!(windows.opens_in(at(0, 12, 0)), 10 * 60);
        assert_eq!(windows.opens_in(at(5, 6, 0)), 2 * DAY + 16 * 60);
    }

    #[test]
    fn work_waits_for_the_windows() {
        // one hour a night, asked at noon: the window opens in 15 h
        let windows = w(&["mon-sun 03:00-04:00"]).unwrap();
        assert_eq!(windows.wall_minutes(at(0, 12, 0), 10.0), 15.0 * 60.0 + 10.0);
        // inside it, work that fits finishes at once
        assert_eq!(windows.wall_minutes(at(0, 3, 10), 30.0), 30.0);
        // 90 minutes of work: the 50 minutes left tonight, then 40 tomorrow night
        assert_eq!(
            windows.wall_minutes(at(0, 3, 10), 90.0),
            50.0 + 23.0 * 60.0 + 40.0
        );
        // fourteen nightly hours from Thursday's window: the fourteenth night ends at
        // 04:00 thirteen days later
        assert_eq!(
            windows.wall_minutes(at(3, 3, 0), 14.0 * 60.0),
            f64::from(13 * DAY + 60)
        );
        // a week of nightly hours from noon: the first opens in 15 h, the seventh closes
        // six days after the first
        assert_eq!(
            windows.wall_minutes(at(0, 12, 0), 7.0 * 60.0),
            f64::from(15 * 60 + 6 * DAY + 60)
        );
        // a window that wraps the week is one stretch of work
        let windows = w(&["sun 23:00-01:00"]).unwrap();
        assert_eq!(windows.wall_minutes(at(6, 23, 0), 120.0), 120.0);
        assert_eq!(windows.wall_minutes(at(6, 23, 0), 0.0), 0.0);
    }

    #[test]
    fn the_week_wraps() {
        let windows = w(&["sun 23:00-01:00"]).unwrap();
        assert!(windows.inside(at(6, 23, 30)));
        assert!(windows.inside(at(0, 0, 30)));
        assert!(!windows.inside(at(0, 1, 0)));
        assert_eq!(windows.opens_in(at(0, 1, 0)), WEEK - 2 * 60);
    }

    #[test]
    fn whole_days_and_day_lists() {
        let windows = w(&["sat,sun 00:00-24:00", "Wed 12:00-13:00"]).unwrap();
        assert!(windows.inside(at(5, 0, 0)));
        assert!(windows.inside(at(6, 23, 59)));
        assert!(!windows.inside(at(0, 0, 0)));
        assert!(windows.inside(at(2, 12, 59)));
        assert!(!windows.inside(at(2, 13, 0)));
        // a range of days that wraps: Friday to Monday
        let windows = w(&["fri-mon 08:00-09:00"]).unwrap();
        for day in [4, 5, 6, 0] {
            assert!(windows.inside(at(day, 8, 30)), "day {day}");
        }
        assert!(!windows.inside(at(1, 8, 30)));
    }

    #[test]
    fn windows_that_touch_do_not_overlap() {
        assert!(w(&["mon 00:00-12:00", "mon 12:00-24:00"]).is_ok());
        assert!(w(&["mon-sun 00:00-24:00"]).is_ok());
    }

    #[test]
    fn refusals() {
        let message = |e: &[&str]| {
            let err = w(e).unwrap_err();
            format!("{} / {}", err.message(), err.detail().unwrap_or_default())
        };
        assert!(message(&[]).starts_with("windows is empty"));
        assert!(message(&["mon 10:00-10:00"]).contains("empty"));
        assert!(message(&["mon 10:00-12:00", "mon 11:00-13:00"]).contains("share some hours"));
        assert!(message(&["mon,mon 10:00-12:00"]).contains("covers some hours twice"));
        assert!(message(&["mon-fri 22:00-06:00", "sat 05:00-07:00"]).contains("share"));
        assert!(message(&["funday 10:00-12:00"]).contains("\"funday\" is not a day"));
        assert!(message(&["mon 25:00-26:00"]).contains("two times of day"));
        assert!(message(&["mon 24:00-02:00"]).contains("begins before 24:00"));
        assert!(message(&["mon 10:00"]).contains("not a time range"));
        assert!(message(&["10:00-12:00"]).contains("not days followed by"));
        assert!(message(&["mon 9:00-12:00"]).contains("HH:MM"));
    }

    #[test]
    fn minutes_as_said() {
        assert_eq!(human_minutes(45), "45 min");
        assert_eq!(human_minutes(120), "2 h");
        assert_eq!(human_minutes(200), "3 h 20 min");
    }
}
