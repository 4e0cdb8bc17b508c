//! What etc_batch tells listeners: `NOTIFY etc_batch` with a JSON payload, when a job,
//! a chain or a launch changes state (docs/operations.md lists the events).
//!
//! A notification is queued in the transaction that makes the change and delivered when
//! it commits (PostgreSQL's NOTIFY), so a listener never hears of something that rolled
//! back; never per chunk or step, only at changes of state. LISTEN needs a session of its
//! own: a transaction-mode pooler hands a listener's connection to others between
//! transactions, and the notifications go with it.
//!
//! Any role that can connect may LISTEN (PostgreSQL checks no privilege for it), while
//! the views show a role only the jobs and launches it may see (access.rs). So by default
//! a payload tells no more than that something happened to a number: the job's number,
//! the step's id, the launch's id, each of which only a role that may see the job, the
//! chain or the launch can turn into its name and details through the views (job_progress,
//! chain_progress and batch_log, launches). `etc_batch.event_detail = full`, which only a
//! superuser sets, adds what happened in full (job ids, batches, roles, reasons, messages,
//! SQLSTATEs), for a database where every listener may know everything.

use crate::query;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use serde_json::{json, Map, Value};

/// The channel every event is sent on.
pub const CHANNEL: &str = "etc_batch";

/// How much a payload tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PostgresGucEnum)]
pub enum Detail {
    /// The kind, the event and the number only.
    #[name = c"private"]
    Private,
    /// What happened in full, besides.
    #[name = c"full"]
    Full,
}

pub static EVENT_DETAIL: GucSetting<Detail> = GucSetting::<Detail>::new(Detail::Private);

pub fn register() {
    GucRegistry::define_enum_guc(
        c"etc_batch.event_detail",
        c"How much an event on the channel etc_batch tells its listeners.",
        c"private: the kind, the event and a number (the job's number, the step's id, the launch's id), which the views turn into a name for a role that may see it. full: job ids, batches, roles, reasons, messages and SQLSTATEs besides, heard by every role that can LISTEN.",
        &EVENT_DETAIL,
        GucContext::Suset,
        GucFlags::default(),
    );
}

/// An event of job `job_id`, whose number is `number`: `event` (registered, started,
/// paused, resumed, waiting, waited, conflict, corrupt, done, failed, aborted, continued)
/// and what more it says.
pub fn job(number: i64, job_id: &str, event: &str, more: Value) {
    send(
        json!({"kind": "job", "job_number": number, "event": event}),
        json!({"job_id": job_id}),
        more,
    );
}

/// An event of the chain of batch `batch`, at step `step`: the step failed, or it was
/// the chain's last and the chain is done.
pub fn chain(step: i64, batch: &str, event: &str, more: Value) {
    send(
        json!({"kind": "chain", "step": step, "event": event}),
        json!({"batch": batch}),
        more,
    );
}

/// An event of launch `launch_id`: started, or ended (with how).
pub fn launch(launch_id: i64, event: &str, more: Value) {
    send(
        json!({"kind": "launch", "launch_id": launch_id, "event": event}),
        Value::Null,
        more,
    );
}

/// The payload as `etc_batch.event_detail` says: `private` alone, or with `names` and
/// `more` added.
fn payload(detail: Detail, mut private: Value, names: Value, more: Value) -> Value {
    if detail == Detail::Full {
        if let Value::Object(payload) = &mut private {
            for added in [names, more] {
                if let Value::Object(added) = added {
                    payload.extend(added);
                }
            }
        }
    }
    private
}

fn send(private: Value, names: Value, more: Value) {
    let payload = payload(EVENT_DETAIL.get(), private, names, more);
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
    fn a_private_payload_tells_only_the_number_and_the_event() {
        let private = json!({"kind": "job", "job_number": 7, "event": "failed"});
        let names = json!({"job_id": "payroll-cut-4711"});
        let more = json!({"sqlstate": "P0001", "message": "salary 9000 refused"});
        assert_eq!(
            payload(
                Detail::Private,
                private.clone(),
                names.clone(),
                more.clone()
            ),
            private
        );
        let full = payload(Detail::Full, private, names, more);
        assert_eq!(full["job_id"], "payroll-cut-4711");
        assert_eq!(full["job_number"], 7);
        assert_eq!(full["message"], "salary 9000 refused");
    }

    #[test]
    fn a_short_payload_is_kept_whole() {
        let payload = json!({"kind": "job", "job_id": "j", "event": "done"});
        assert_eq!(truncated(payload.clone()), payload.to_string());
    }
}
