//! The browser's own telemetry, captured in the VM: a CDP monitor (`monitor`) turns what
//! Chromium reports into the SDK's events (`cdp_events`), and Chromium's crashes become
//! `service_crashed`. Events wait in a bounded ring until the control plane reads them
//! (`TelemetryEvents`); a reader that falls behind the ring sees a jump in `seq`.

mod cdp_events;
pub mod monitor;
mod settle;

use std::collections::VecDeque;
use std::sync::Mutex;

use browser_agent_proto::v1::{TelemetryCapture, TelemetryRecord};
use serde_json::Value;
use tokio::sync::{broadcast, watch};

/// Events kept for a reader that comes late or reconnects; the oldest go first.
const RING_EVENTS: usize = 20_000;
/// Live events a reader may lag behind before it reads from the ring instead.
const FOLLOWER_BACKLOG: usize = 4096;
/// How long the live events after a first one are gathered to cross with it.
const COALESCE: std::time::Duration = std::time::Duration::from_millis(20);
/// Longest text kept in one field of an event (console text, a URL, a header).
pub const MAX_TEXT_BYTES: usize = 8 * 1024;

pub struct Telemetry {
    capture: watch::Sender<TelemetryCapture>,
    /// What the monitor has applied to every page it is attached to (`None`: it is not
    /// attached), for `SetTelemetry` to answer once capture really runs.
    applied: watch::Sender<Option<TelemetryCapture>>,
    ring: Mutex<Ring>,
    live: broadcast::Sender<TelemetryRecord>,
}

#[derive(Default)]
struct Ring {
    next_seq: u64,
    events: VecDeque<TelemetryRecord>,
}

/// One event as produced: its SDK type and category, its `data` object and the source
/// event it came from.
pub struct Captured {
    pub category: &'static str,
    pub kind: &'static str,
    pub data: Value,
    pub source_event: String,
    pub truncated: bool,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            capture: watch::channel(TelemetryCapture::default()).0,
            applied: watch::channel(None).0,
            ring: Mutex::new(Ring { next_seq: 1, events: VecDeque::new() }),
            live: broadcast::channel(FOLLOWER_BACKLOG).0,
        }
    }
}

impl Telemetry {
    pub fn set_capture(&self, capture: TelemetryCapture) {
        self.capture.send_replace(capture);
    }

    pub fn capture(&self) -> watch::Receiver<TelemetryCapture> {
        self.capture.subscribe()
    }

    /// Marks `capture` as applied by the monitor (`None`: detached).
    pub fn applied(&self, capture: Option<TelemetryCapture>) {
        self.applied.send_replace(capture);
    }

    /// Waits (at most `wait`) until the monitor applies `capture`, when it has anything
    /// to apply: a browser created with telemetry captures its first page.
    pub async fn until_applied(&self, capture: &TelemetryCapture, wait: std::time::Duration) {
        if !monitor::any_cdp_category(capture) {
            return;
        }
        let mut applied = self.applied.subscribe();
        let _ =
            tokio::time::timeout(wait, applied.wait_for(|now| now.as_ref() == Some(capture))).await;
    }

    /// Stamps an event with the next `seq` and the time, and keeps it.
    pub fn record(&self, captured: Captured) {
        let ts_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_micros() as i64)
            .unwrap_or_default();
        let Ok(mut ring) = self.ring.lock() else {
            return;
        };
        let record = TelemetryRecord {
            seq: ring.next_seq,
            ts_us,
            category: captured.category.to_owned(),
            r#type: captured.kind.to_owned(),
            data_json: captured.data.to_string(),
            source_event: captured.source_event,
            truncated: captured.truncated,
        };
        ring.next_seq += 1;
        if ring.events.len() == RING_EVENTS {
            ring.events.pop_front();
        }
        ring.events.push_back(record.clone());
        // Sent while the ring is locked, so a reader that subscribed under the lock sees
        // every later event exactly once.
        let _ = self.live.send(record);
    }

    /// The events kept after `after_seq`, and a subscription to the later ones.
    pub fn follow(
        &self, after_seq: u64,
    ) -> (Vec<TelemetryRecord>, broadcast::Receiver<TelemetryRecord>) {
        let Ok(ring) = self.ring.lock() else {
            return (Vec::new(), self.live.subscribe());
        };
        let kept = ring.events.iter().filter(|record| record.seq > after_seq).cloned().collect();
        (kept, self.live.subscribe())
    }
}

/// Sends the kept events, then the live ones, to `sender` until its receiver is gone.
/// A reader that falls behind the live events reads the ring again from where it was.
/// Live events go in bursts: after the first of a burst, the others that come within
/// `COALESCE` are sent with it, so that a page's dozens of events cross to the control
/// plane in a few writes (and wake both sides a few times) rather than one each: the
/// CPU this saves is the page's, on a host whose cores the browsers share.
pub async fn forward(
    telemetry: std::sync::Arc<Telemetry>, sender: tokio::sync::mpsc::Sender<TelemetryRecord>,
) {
    let mut last_seq = 0;
    'follow: loop {
        let (kept, mut live) = telemetry.follow(last_seq);
        for record in kept {
            last_seq = record.seq;
            if sender.send(record).await.is_err() {
                return;
            }
        }
        loop {
            let first = tokio::select! {
                () = sender.closed() => return,
                record = live.recv() => record,
            };
            // The rest of the burst, taken as it is handled.
            tokio::time::sleep(COALESCE).await;
            let mut next = Some(first);
            while let Some(record) = next.take() {
                match record {
                    Ok(record) if record.seq <= last_seq => {}
                    Ok(record) => {
                        last_seq = record.seq;
                        if sender.send(record).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue 'follow,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
                next = match live.try_recv() {
                    Ok(record) => Some(Ok(record)),
                    Err(broadcast::error::TryRecvError::Empty) => None,
                    Err(broadcast::error::TryRecvError::Lagged(n)) => {
                        Some(Err(broadcast::error::RecvError::Lagged(n)))
                    }
                    Err(broadcast::error::TryRecvError::Closed) => {
                        Some(Err(broadcast::error::RecvError::Closed))
                    }
                };
            }
        }
    }
}

/// `text` cut to at most `MAX_TEXT_BYTES` at a character boundary; whether it was cut.
pub fn bounded(text: &str) -> (String, bool) {
    if text.len() <= MAX_TEXT_BYTES {
        return (text.to_owned(), false);
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

/// Reports each unexpected exit of Chromium (the supervisor restarts it) as the system
/// event `service_crashed`.
pub async fn watch_crashes(
    telemetry: std::sync::Arc<Telemetry>,
    mut browser: watch::Receiver<crate::chromium::BrowserState>,
) {
    let mut restarts = browser.borrow().restarts;
    let mut last_pid = browser.borrow().pid;
    let mut gave_up = false;
    while browser.changed().await.is_ok() {
        let state = browser.borrow_and_update().clone();
        if state.pid != 0 {
            last_pid = state.pid;
        }
        let failed = state.devtools == browser_agent_proto::v1::DevtoolsState::Failed;
        let phase = if state.restarts > restarts {
            "running"
        } else if failed && !gave_up {
            "gave_up"
        } else {
            continue;
        };
        restarts = state.restarts;
        gave_up = failed;
        telemetry.record(Captured {
            category: "system",
            kind: "service_crashed",
            data: serde_json::json!({
                "service_name": "chromium",
                "phase": phase,
                "pid": last_pid,
            }),
            source_event: "chromium_exit".into(),
            truncated: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u64) -> Captured {
        Captured {
            category: "console",
            kind: "console_log",
            data: serde_json::json!({ "text": n.to_string() }),
            source_event: String::new(),
            truncated: false,
        }
    }

    #[test]
    fn a_late_reader_gets_what_the_ring_kept_then_the_live_events() {
        let telemetry = Telemetry::default();
        for n in 0..3 {
            telemetry.record(event(n));
        }
        let (kept, mut live) = telemetry.follow(1);
        assert_eq!(kept.iter().map(|r| r.seq).collect::<Vec<_>>(), [2, 3]);
        telemetry.record(event(3));
        assert_eq!(live.try_recv().map(|r| r.seq).ok(), Some(4));
    }

    #[test]
    fn the_ring_forgets_the_oldest_and_seq_shows_the_gap() {
        let telemetry = Telemetry::default();
        for n in 0..(RING_EVENTS as u64 + 5) {
            telemetry.record(event(n));
        }
        let (kept, _) = telemetry.follow(0);
        assert_eq!(kept.len(), RING_EVENTS);
        assert_eq!(kept[0].seq, 6);
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let text = "é".repeat(MAX_TEXT_BYTES);
        let (cut, was_cut) = bounded(&text);
        assert!(was_cut);
        assert!(cut.len() <= MAX_TEXT_BYTES);
        assert_eq!(bounded("short"), ("short".into(), false));
    }
}
