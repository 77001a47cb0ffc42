//! The events that say a page has come to rest, which no single CDP event reports, timed
//! per target as the SDK documents them:
//! - `network_idle`: 500 ms without an HTTP request in flight;
//! - `page_layout_settled`: 1 s after `load` without a layout shift (each shift restarts
//!   the wait);
//! - `page_navigation_settled`: DOMContentLoaded and layout settled, both for the same
//!   navigation.
//!
//! The monitor tells this what its targets do and wakes at `next_deadline`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

const NETWORK_QUIET: Duration = Duration::from_millis(500);
const LAYOUT_QUIET: Duration = Duration::from_secs(1);
/// Requests followed per target; a page past this many at once is not judged idle until
/// they are done.
const MAX_IN_FLIGHT: usize = 4096;

#[derive(Default)]
struct TargetRest {
    in_flight: HashSet<String>,
    /// Requests not followed (past `MAX_IN_FLIGHT`) that may still be in flight.
    untracked: usize,
    idle_at: Option<Instant>,
    nav_seq: u64,
    dom_content_loaded: bool,
    layout_settles_at: Option<Instant>,
}

/// What the targets (by CDP session) are waiting for.
#[derive(Default)]
pub struct Settling {
    targets: HashMap<String, TargetRest>,
}

/// An event that came due: its type, and the CDP session of its target.
pub struct Settled {
    pub session: String,
    pub kind: &'static str,
}

impl Settling {
    /// Notes a CDP event of the target reached through `session`, whose navigation is
    /// now `nav_seq`, received at `now`.
    pub fn observe(
        &mut self, session: &str, method: &str, params: &Value, nav_seq: u64, now: Instant,
    ) {
        let rest = self.targets.entry(session.to_owned()).or_default();
        if rest.nav_seq != nav_seq {
            rest.nav_seq = nav_seq;
            rest.dom_content_loaded = false;
            rest.layout_settles_at = None;
        }
        match method {
            "Network.requestWillBeSent" => {
                let id = params["requestId"].as_str().unwrap_or_default();
                if rest.in_flight.len() < MAX_IN_FLIGHT {
                    rest.in_flight.insert(id.to_owned());
                } else if !rest.in_flight.contains(id) {
                    rest.untracked += 1;
                }
                rest.idle_at = None;
            }
            "Network.loadingFinished" | "Network.loadingFailed" => {
                let id = params["requestId"].as_str().unwrap_or_default();
                if !rest.in_flight.remove(id) {
                    rest.untracked = rest.untracked.saturating_sub(1);
                }
                if rest.in_flight.is_empty() && rest.untracked == 0 {
                    rest.idle_at = Some(now + NETWORK_QUIET);
                }
            }
            "Page.domContentEventFired" => rest.dom_content_loaded = true,
            "Page.loadEventFired" => rest.layout_settles_at = Some(now + LAYOUT_QUIET),
            "PerformanceTimeline.timelineEventAdded"
                if params["event"]["type"] == "layout-shift"
                    && rest.layout_settles_at.is_some() =>
            {
                rest.layout_settles_at = Some(now + LAYOUT_QUIET);
            }
            _ => {}
        }
    }

    /// The target behind `session` is gone.
    pub fn forget(&mut self, session: &str) {
        self.targets.remove(session);
    }

    /// When the next event comes due, if any waits.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.targets
            .values()
            .flat_map(|rest| [rest.idle_at, rest.layout_settles_at])
            .flatten()
            .min()
    }

    /// The events due by `now`, each reported once.
    pub fn due(&mut self, now: Instant) -> Vec<Settled> {
        let mut settled = Vec::new();
        for (session, rest) in &mut self.targets {
            let mut report = |kind| settled.push(Settled { session: session.clone(), kind });
            if rest.idle_at.is_some_and(|at| at <= now) {
                rest.idle_at = None;
                report("network_idle");
            }
            if rest.layout_settles_at.is_some_and(|at| at <= now) {
                rest.layout_settles_at = None;
                report("page_layout_settled");
                if rest.dom_content_loaded {
                    report("page_navigation_settled");
                }
            }
        }
        settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds(settled: Vec<Settled>) -> Vec<&'static str> {
        settled.into_iter().map(|s| s.kind).collect()
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn the_network_is_idle_half_a_second_after_the_last_request() {
        let t0 = Instant::now();
        let mut settling = Settling::default();
        let request = |id: &str| json!({ "requestId": id });
        settling.observe("s", "Network.requestWillBeSent", &request("1"), 1, t0);
        settling.observe("s", "Network.requestWillBeSent", &request("2"), 1, t0);
        settling.observe("s", "Network.loadingFinished", &request("1"), 1, t0);
        assert_eq!(settling.next_deadline(), None);
        settling.observe("s", "Network.loadingFailed", &request("2"), 1, t0);
        assert!(kinds(settling.due(t0 + ms(400))).is_empty());
        // A new request within the quiet period starts it again.
        settling.observe("s", "Network.requestWillBeSent", &request("3"), 1, t0 + ms(400));
        settling.observe("s", "Network.loadingFinished", &request("3"), 1, t0 + ms(400));
        assert!(kinds(settling.due(t0 + ms(800))).is_empty());
        assert_eq!(kinds(settling.due(t0 + ms(900))), ["network_idle"]);
        assert!(kinds(settling.due(t0 + ms(900))).is_empty());
    }

    #[test]
    fn layout_settles_a_second_after_load_and_each_shift_restarts_the_wait() {
        let t0 = Instant::now();
        let mut settling = Settling::default();
        let shift = json!({ "event": { "type": "layout-shift" } });
        settling.observe("s", "Page.domContentEventFired", &json!({}), 1, t0);
        settling.observe("s", "Page.loadEventFired", &json!({}), 1, t0);
        let shifted = t0 + ms(800);
        settling.observe("s", "PerformanceTimeline.timelineEventAdded", &shift, 1, shifted);
        assert!(kinds(settling.due(shifted + ms(800))).is_empty());
        assert_eq!(
            kinds(settling.due(shifted + ms(1000))),
            ["page_layout_settled", "page_navigation_settled"]
        );
        // A new navigation forgets the old one's DOMContentLoaded.
        let loaded = shifted + ms(1000);
        settling.observe("s", "Page.loadEventFired", &json!({}), 2, loaded);
        assert_eq!(kinds(settling.due(loaded + LAYOUT_QUIET)), ["page_layout_settled"]);
        settling.forget("s");
        assert_eq!(settling.next_deadline(), None);
    }
}
