//! Requests the egress proxies refused or could not carry, kept briefly per session so
//! that its telemetry can name the browser request each one failed (`proxy_error`).
//!
//! The proxy knows why a request failed but not which of the browser's requests it was;
//! the VM's network monitor knows the request but sees only a refused tunnel. The
//! session's telemetry joins the two: a `network_loading_failed` or `network_response`
//! event of the VM becomes a `proxy_error` only when the proxy noted a failure for that
//! destination, and each noted failure is used once, so a VM cannot make up errors.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a noted failure waits for the browser's event that names its request.
const KEPT_FOR: Duration = Duration::from_secs(30);
/// Most failures kept per session (a page retrying a dead host keeps the newest).
const KEPT_PER_SESSION: usize = 64;

/// One refused or failed request, as the proxy saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyFailure {
    /// The SDK's code (`network_policy_denied`, `upstream_dns_failure`, …), also sent to
    /// the browser in `X-Kernel-Proxy-Error`.
    pub code: &'static str,
    /// The status the proxy answered (403 or 502).
    pub status: u16,
    pub method: String,
    /// Without brackets.
    pub host: String,
    pub port: u16,
}

#[derive(Default)]
pub struct ProxyFailures {
    by_session: Mutex<HashMap<String, VecDeque<(Instant, ProxyFailure)>>>,
}

impl ProxyFailures {
    pub fn note(&self, session_id: &str, failure: ProxyFailure) {
        let Ok(mut by_session) = self.by_session.lock() else {
            return;
        };
        let noted = by_session.entry(session_id.to_owned()).or_default();
        noted.retain(|(at, _)| at.elapsed() < KEPT_FOR);
        if noted.len() == KEPT_PER_SESSION {
            noted.pop_front();
        }
        noted.push_back((Instant::now(), failure));
    }

    /// The oldest failure still kept for a request of the session to `url`'s host and
    /// port, taken (it is reported once).
    pub fn take(&self, session_id: &str, url: &str) -> Option<ProxyFailure> {
        let url = url::Url::parse(url).ok()?;
        let host = url.host_str()?.trim_start_matches('[').trim_end_matches(']');
        let port = url.port_or_known_default()?;
        let mut by_session = self.by_session.lock().ok()?;
        let noted = by_session.get_mut(session_id)?;
        noted.retain(|(at, _)| at.elapsed() < KEPT_FOR);
        let index = noted.iter().position(|(_, failure)| {
            failure.port == port && failure.host.eq_ignore_ascii_case(host)
        })?;
        noted.remove(index).map(|(_, failure)| failure)
    }

    /// Drops what is kept of a session whose VM is gone.
    pub fn forget(&self, session_id: &str) {
        if let Ok(mut by_session) = self.by_session.lock() {
            by_session.remove(session_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(host: &str, port: u16) -> ProxyFailure {
        ProxyFailure {
            code: "network_policy_denied",
            status: 403,
            method: "CONNECT".into(),
            host: host.into(),
            port,
        }
    }

    #[test]
    fn a_failure_is_matched_by_host_and_port_once() {
        let failures = ProxyFailures::default();
        failures.note("s1", refused("blocked.example", 443));
        assert_eq!(failures.take("s2", "https://blocked.example/"), None);
        assert_eq!(failures.take("s1", "http://blocked.example/"), None);
        assert_eq!(
            failures.take("s1", "https://BLOCKED.example/a?b"),
            Some(refused("blocked.example", 443))
        );
        assert_eq!(failures.take("s1", "https://blocked.example/"), None);
        failures.note("s1", refused("::1", 8080));
        assert!(failures.take("s1", "http://[::1]:8080/").is_some());
    }

    #[test]
    fn only_the_newest_are_kept() {
        let failures = ProxyFailures::default();
        for port in 0..(KEPT_PER_SESSION as u16 + 10) {
            failures.note("s1", refused("h", port));
        }
        assert_eq!(failures.take("s1", "http://h:5/"), None);
        assert!(failures.take("s1", "http://h:20/").is_some());
        failures.forget("s1");
        assert!(failures.take("s1", "http://h:30/").is_none());
    }
}
