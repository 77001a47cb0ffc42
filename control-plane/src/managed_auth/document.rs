//! What the store keeps of a connection (`Document`, its `Flow` and their statuses),
//! the `managed_auth_state` event built from it, and the URL helpers that judge where a
//! page is.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::page::DiscoveredField;
use crate::error::{ServiceError, ServiceResult};
use crate::store::AuthConnectionRecord;

/// A URL without its query and fragment (which may carry a form's values), for messages.
pub(super) fn strip_query(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_query(None);
            parsed.set_fragment(None);
            parsed.to_string()
        }
        Err(_) => String::new(),
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthStatus {
    Authenticated,
    NeedsAuth,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FlowType {
    Login,
    Reauth,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FlowStatus {
    InProgress,
    Success,
    Failed,
    Expired,
    Canceled,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FlowStep {
    Discovering,
    AwaitingInput,
    Submitting,
    Completed,
}

/// A connection's settings and durable workflow state (the store's `document`).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Document {
    pub profile_id: String,
    pub login_url: Option<String>,
    pub allowed_domains: Vec<String>,
    pub health_check_interval: i64,
    pub proxy_id: Option<String>,
    pub save_credentials: bool,
    /// Whether health checks run every `health_check_interval`.
    #[serde(default = "yes")]
    pub health_checks: bool,
    /// Whether a health check that finds the profile logged out logs in again by itself
    /// (with saved values); otherwise the connection just turns NEEDS_AUTH.
    #[serde(default = "yes")]
    pub auto_reauth: bool,
    /// Whether the connection's browsers (logins, health checks) run in stealth mode.
    #[serde(default = "yes")]
    pub stealth: bool,
    pub status: AuthStatus,
    pub last_auth_at: Option<DateTime<Utc>>,
    pub post_login_url: Option<String>,
    pub next_health_check_at: DateTime<Utc>,
    /// The most recent login flow.
    pub flow: Option<Flow>,
    /// Where logins take their values from, besides those saved from earlier logins.
    #[serde(default)]
    pub credential: Option<CredentialRef>,
    /// Whether login flows record their browser as a replay.
    #[serde(default)]
    pub record_session: bool,
    /// Flows and health checks, oldest first.
    #[serde(default)]
    pub timeline: Vec<TimelineEvent>,
    /// The telemetry the connection's browsers start with (as on `POST /browsers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub browser_telemetry: Option<crate::telemetry::settings::TelemetryRequest>,
}

/// A connection's credential, as the SDK names one: `{name}` (a stored credential, by
/// name or id), `{provider, path}` (an item of a credential provider, `Vault/Item`), or
/// `{provider, auto: true}` (the provider's item for the connection's domain).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct CredentialRef {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<bool>,
    /// The credential `name` resolved to when the connection was given it (a rename
    /// does not break the connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
    /// Likewise for `provider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
}

impl CredentialRef {
    /// As the SDK reads it (without the resolved ids).
    pub fn view(&self) -> serde_json::Value {
        let mut view = serde_json::json!({});
        for (key, value) in
            [("name", &self.name), ("provider", &self.provider), ("path", &self.path)]
        {
            if let Some(value) = value {
                view[key] = serde_json::json!(value);
            }
        }
        if let Some(auto) = self.auto {
            view["auto"] = serde_json::json!(auto);
        }
        view
    }
}

/// Documents stored before a setting existed have it on, as the SDK's default.
fn yes() -> bool {
    true
}

/// A validated change of a connection's settings (PATCH); `None` leaves a field as it is.
#[derive(Clone, Debug, Default)]
pub struct SettingsChange {
    /// `Some(None)` clears it.
    pub login_url: Option<Option<String>>,
    pub allowed_domains: Option<Vec<String>>,
    pub health_check_interval: Option<i64>,
    pub health_checks: Option<bool>,
    pub auto_reauth: Option<bool>,
    pub save_credentials: Option<bool>,
    pub stealth: Option<bool>,
    /// A proxy id; `Some(None)` goes direct.
    pub proxy_id: Option<Option<String>>,
    /// A new credential to log in with; `Some(None)` removes it.
    pub credential: Option<Option<CredentialRef>>,
    pub record_session: Option<bool>,
    /// `Some(None)` turns the browsers' telemetry off.
    pub browser_telemetry: Option<Option<crate::telemetry::settings::TelemetryRequest>>,
}

impl SettingsChange {
    /// Applies the change; a new interval, or health checks turned on, schedule the next
    /// check one interval from `now`.
    pub fn apply(self, document: &mut Document, now: DateTime<Utc>) {
        let reschedule = self
            .health_check_interval
            .is_some_and(|interval| interval != document.health_check_interval)
            || (self.health_checks == Some(true) && !document.health_checks);
        if let Some(login_url) = self.login_url {
            document.login_url = login_url;
        }
        if let Some(allowed_domains) = self.allowed_domains {
            document.allowed_domains = allowed_domains;
        }
        if let Some(interval) = self.health_check_interval {
            document.health_check_interval = interval;
        }
        if let Some(health_checks) = self.health_checks {
            document.health_checks = health_checks;
        }
        if let Some(auto_reauth) = self.auto_reauth {
            document.auto_reauth = auto_reauth;
        }
        if let Some(save_credentials) = self.save_credentials {
            document.save_credentials = save_credentials;
        }
        if let Some(stealth) = self.stealth {
            document.stealth = stealth;
        }
        if let Some(proxy_id) = self.proxy_id {
            document.proxy_id = proxy_id;
        }
        if let Some(credential) = self.credential {
            document.credential = credential;
        }
        if let Some(record_session) = self.record_session {
            document.record_session = record_session;
        }
        if let Some(browser_telemetry) = self.browser_telemetry {
            document.browser_telemetry = browser_telemetry;
        }
        if reschedule {
            document.next_health_check_at =
                now + chrono::Duration::seconds(document.health_check_interval);
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Flow {
    /// Names the flow in the timeline (empty for flows stored before it existed).
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    /// The replay recording the flow's browser (`record_session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_id: Option<String>,
    /// This flow's `record_session`, where its login asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_session: Option<bool>,
    pub flow_type: FlowType,
    pub status: FlowStatus,
    pub step: FlowStep,
    pub expires_at: DateTime<Utc>,
    pub discovered_fields: Option<Vec<DiscoveredField>>,
    pub website_error: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// The flow's browser session.
    pub session_id: Option<String>,
    /// The page that showed the form the flow waits for input on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_url: Option<String>,
    /// Saved values were submitted by the flow itself already (tried once only).
    #[serde(default)]
    pub auto_submitted: bool,
    /// Steps the flow has filled by itself from the connection's credential.
    #[serde(default)]
    pub auto_steps: u32,
    /// The selectors of the form the flow last filled by itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auto_filled: Vec<String>,
}

impl Flow {
    pub fn in_progress(&self) -> bool {
        self.status == FlowStatus::InProgress
    }
}

impl Document {
    pub fn parse(record: &AuthConnectionRecord) -> ServiceResult<Self> {
        serde_json::from_str(&record.document).map_err(|error| {
            ServiceError::internal(format!("auth connection {}: {error}", record.id))
        })
    }

    pub fn flow_in_progress(&self) -> Option<&Flow> {
        self.flow.as_ref().filter(|flow| flow.in_progress())
    }
}

/// The `managed_auth_state` event of the connection's current flow.
pub fn state_event(document: &Document, hosted_url: Option<String>) -> Option<Value> {
    let flow = document.flow.as_ref()?;
    let mut event = json!({
        "event": "managed_auth_state",
        "timestamp": Utc::now(),
        "flow_type": flow.flow_type,
        "flow_status": flow.status,
        "flow_step": flow.step,
    });
    let optional = [
        ("discovered_fields", serde_json::to_value(&flow.discovered_fields).ok()),
        ("website_error", flow.website_error.clone().map(Value::from)),
        ("error_code", flow.error_code.clone().map(Value::from)),
        ("error_message", flow.error_message.clone().map(Value::from)),
        ("hosted_url", hosted_url.filter(|_| flow.in_progress()).map(Value::from)),
        (
            "post_login_url",
            (flow.status == FlowStatus::Success)
                .then(|| document.post_login_url.clone())
                .flatten()
                .map(Value::from),
        ),
    ];
    for (key, value) in optional {
        if let Some(value) = value.filter(|v| !v.is_null()) {
            event[key] = value;
        }
    }
    Some(event)
}

/// Whether `url` lies inside the connection's domain or one of its allowed domains.
/// A domain may name a port (`127.0.0.1:8080`) and allowed domains may start with `*.`.
pub fn in_domains(url: &str, domain: &str, allowed: &[String]) -> bool {
    let Ok(url) = url::Url::parse(url) else {
        return false;
    };
    let (Some(host), port) = (url.host_str(), url.port_or_known_default()) else {
        return false;
    };
    std::iter::once(domain).chain(allowed.iter().map(String::as_str)).any(|candidate| {
        let candidate = candidate.strip_prefix("*.").unwrap_or(candidate);
        let Ok(parsed) = url::Url::parse(&format!("http://{candidate}/")) else {
            return false;
        };
        let Some(expected) = parsed.host_str() else {
            return false;
        };
        let host_matches = host == expected || host.ends_with(&format!(".{expected}"));
        let port_matches = parsed.port().is_none() || parsed.port() == port;
        host_matches && port_matches
    })
}

/// One flow or health check, as the SDK reads it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct TimelineEvent {
    pub id: String,
    /// `login`, `reauth` or `health_check`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A flow's status, or the state a health check saw.
    pub status: String,
    pub timestamp: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub browser_session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// The state before a health check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_status: Option<String>,
    /// The step a flow reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The recording of a flow's browser.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_match_hosts_subdomains_ports_and_wildcards() {
        let allowed = vec!["*.okta.com".to_owned(), "login.example.net".to_owned()];
        for inside in [
            "https://example.com/home",
            "https://www.example.com/",
            "https://corp.okta.com/x",
            "https://login.example.net/",
        ] {
            assert!(in_domains(inside, "example.com", &allowed), "{inside}");
        }
        for outside in
            ["https://example.org/", "https://notexample.com/", "about:blank", "nonsense"]
        {
            assert!(!in_domains(outside, "example.com", &allowed), "{outside}");
        }
        assert!(in_domains("http://127.0.0.1:8080/", "127.0.0.1:8080", &[]));
        assert!(!in_domains("http://127.0.0.1:9090/", "127.0.0.1:8080", &[]));
    }
}
