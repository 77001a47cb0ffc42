//! What `GET /deployments/{id}/events` and `GET /invocations/{id}/events` stream: each
//! deployment's and invocation's events (log lines and state changes, as the SDK's event
//! objects), kept in this process while they happen and for a while after, so that a
//! follower that comes late (or asks `since`) gets them all in order.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::broadcast;

/// Most bytes of events kept per deployment or invocation: the oldest log lines go first.
const MAX_LOG_BYTES: usize = 1024 * 1024;
/// Ended logs kept for late followers; the oldest are forgotten first.
const MAX_ENDED_LOGS: usize = 200;
/// Live events a slow follower may lag behind before it is cut off.
const FOLLOWER_BACKLOG: usize = 4096;

/// One event as streamed: the SDK's object (`event`, `timestamp`, …).
#[derive(Clone, Debug)]
pub struct Event {
    pub at: DateTime<Utc>,
    pub body: Value,
    /// The last event of its log (a terminal state).
    pub last: bool,
}

struct Log {
    events: VecDeque<Event>,
    bytes: usize,
    live: broadcast::Sender<Event>,
    ended: bool,
}

/// Everyone's event logs, by deployment or invocation id.
#[derive(Default)]
pub struct EventLogs {
    logs: Mutex<HashMap<String, Log>>,
    ended: Mutex<VecDeque<String>>,
}

/// What a follower gets: the events so far, then the live ones (`None` once the log has
/// ended).
pub struct Following {
    pub past: Vec<Event>,
    pub live: Option<broadcast::Receiver<Event>>,
}

impl EventLogs {
    /// Appends an event; `last` ends the log (nothing is appended after).
    pub fn push(&self, id: &str, body: Value, last: bool) {
        let event = Event { at: Utc::now(), body, last };
        let Ok(mut logs) = self.logs.lock() else {
            return;
        };
        let log = logs.entry(id.to_owned()).or_insert_with(|| Log {
            events: VecDeque::new(),
            bytes: 0,
            live: broadcast::channel(FOLLOWER_BACKLOG).0,
            ended: false,
        });
        if log.ended {
            return;
        }
        log.bytes += event.body.to_string().len();
        log.events.push_back(event.clone());
        while log.bytes > MAX_LOG_BYTES && log.events.len() > 1 {
            if let Some(dropped) = log.events.pop_front() {
                log.bytes -= dropped.body.to_string().len();
            }
        }
        let _ = log.live.send(event);
        if last {
            log.ended = true;
            drop(logs);
            self.remember_ended(id);
        }
    }

    fn remember_ended(&self, id: &str) {
        let Ok(mut ended) = self.ended.lock() else {
            return;
        };
        ended.push_back(id.to_owned());
        while ended.len() > MAX_ENDED_LOGS {
            if let Some(oldest) = ended.pop_front()
                && let Ok(mut logs) = self.logs.lock()
            {
                logs.remove(&oldest);
            }
        }
    }

    /// The log's events at or after `since`, and the live ones to come; `None` when this
    /// process has no log of `id` (ended long ago, or before a restart).
    pub fn follow(&self, id: &str, since: Option<DateTime<Utc>>) -> Option<Following> {
        let logs = self.logs.lock().ok()?;
        let log = logs.get(id)?;
        let past = log
            .events
            .iter()
            .filter(|event| since.is_none_or(|since| event.at >= since))
            .cloned()
            .collect();
        Some(Following { past, live: (!log.ended).then(|| log.live.subscribe()) })
    }

    /// Forgets a log (its deployment or invocation was deleted): an empty, ended log
    /// stands in for it, so that what is still pushed is dropped, until it is evicted
    /// like any ended log.
    pub fn forget(&self, id: &str) {
        let Ok(mut logs) = self.logs.lock() else {
            return;
        };
        let was_ended = logs.get(id).is_some_and(|log| log.ended);
        logs.insert(
            id.to_owned(),
            Log { events: VecDeque::new(), bytes: 0, live: broadcast::channel(1).0, ended: true },
        );
        drop(logs);
        if !was_ended {
            self.remember_ended(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_follower_gets_everything_and_an_ended_log_nothing_live() {
        let logs = EventLogs::default();
        logs.push("d1", serde_json::json!({"n": 1}), false);
        let early = logs.follow("d1", None).expect("log");
        assert_eq!(early.past.len(), 1);
        let mut live = early.live.expect("live");
        logs.push("d1", serde_json::json!({"n": 2}), true);
        assert_eq!(live.try_recv().expect("event").body["n"], 2);
        let late = logs.follow("d1", None).expect("log");
        assert_eq!(late.past.len(), 2);
        assert!(late.live.is_none());
        logs.push("d1", serde_json::json!({"n": 3}), false);
        assert_eq!(logs.follow("d1", None).expect("log").past.len(), 2);
        assert!(logs.follow("d2", None).is_none());
        logs.push("d3", serde_json::json!({"n": 1}), false);
        logs.forget("d3");
        logs.push("d3", serde_json::json!({"n": 2}), false);
        let forgotten = logs.follow("d3", None).expect("log");
        assert!(forgotten.past.is_empty() && forgotten.live.is_none());
    }
}
