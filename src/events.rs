//! What etc_batch tells listeners: `NOTIFY etc_batch` with a JSON payload, when a job,
//! a chain or a launch changes state (docs/operations.md lists the events).
//!
//! A notification is queued in the transaction that makes the change and delivered when
//! it commits (PostgreSQL's NOTIFY), so a listener never hears of something that rolled
//! back; never per chunk or step, only at changes of state. LISTEN needs a session of its
//! own: a transaction-mode pooler hands a listener's connection to others between
//! transactions, and the notifications go with it.

use crate::query;
use serde_json::{json, Map, Value};

/// The channel every event is sent on.
pub const CHANNEL: &str = "etc_batch";

/// An event of job `job_id`: `event` (registered, started, paused, resumed, waiting,
/// waited, conflict, corrupt, done, failed, aborted, continued) and what more it says.
pub fn job(job_id: &str, event: &str, more: Value) {
    send(
        json!({"kind": "job", "job_id": job_id, "event": event}),
        more,
    );
}

/// An event of the chain of batch `batch`: a step failed, or the chain is done.
pub fn chain(batch: &str, event: &str, more: Value) {
    send(
        json!({"kind": "chain", "batch": batch, "event": event}),
        more,
    );
}

/// An event of launch `launch_id`: started, or ended (with how).
pub fn launch(launch_id: i64, event: &str, more: Value) {
    send(
        json!({"kind": "launch", "launch_id": launch_id, "event": event}),
        more,
    );
}

fn send(mut payload: Value, more: Value) {
    if let (Value::Object(payload), Value::Object(more)) = (&mut payload, more) {
        payload.extend(more);
    }
    // queued in the transaction's notifications, sent when it commits and dropped when
    // it rolls back
    let sent = query::run(
        "SELECT pg_catalog.pg_notify($1, $2)",
        &[CHANNEL.into(), truncated(payload).into()],
    );
    if let Err(error) = sent {
        // a listener missing an event never stops the work that made it
        pgrx::warning!("etc_batch could not send an event: {}", error.message());
    }
}

/// The payload as text, under PostgreSQL's limit for a notification's payload (8000
/// bytes): a long message or reason is cut short, with "…" at its end.
fn truncated(payload: Value) -> String {
    const LIMIT: usize = 7900;
    let text = payload.to_string();
    if text.len() <= LIMIT {
        return text;
    }
    let Value::Object(fields) = payload else {
        return text;
    };
    let mut out = Map::new();
    for (key, value) in fields {
        let value = match value {
            Value::String(s) if s.len() > 1000 => {
                let mut end = 1000;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                Value::String(format!("{}…", &s[..end]))
            }
            v => v,
        };
        out.insert(key, value);
    }
    Value::Object(out).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_payload_is_cut_below_the_limit() {
        let long = "é".repeat(5000);
        let text = truncated(json!({"kind": "job", "message": long, "reason": long}));
        assert!(text.len() < 8000, "{}", text.len());
        let back: Value = serde_json::from_str(&text).unwrap();
        assert!(back["message"].as_str().unwrap().ends_with('…'));
        assert_eq!(back["kind"], "job");
    }

    #[test]
    fn a_short_payload_is_kept_whole() {
        let payload = json!({"kind": "job", "job_id": "j", "event": "done"});
        assert_eq!(truncated(payload.clone()), payload.to_string());
    }
}
