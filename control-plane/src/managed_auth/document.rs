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
    pub status: AuthStatus,
    pub last_auth_at: Option<DateTime<Utc>>,
    pub post_login_url: Option<String>,
    pub next_health_check_at: DateTime<Utc>,
    /// The most recent login flow.
    pub flow: Option<Flow>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Flow {
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
    /// Saved values were submitted by the flow itself already (tried once only).
    #[serde(default)]
    pub auto_submitted: bool,
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
        (
            "discovered_fields",
            serde_json::to_value(&flow.discovered_fields).ok(),
        ),
        ("website_error", flow.website_error.clone().map(Value::from)),
        ("error_code", flow.error_code.clone().map(Value::from)),
        ("error_message", flow.error_message.clone().map(Value::from)),
        (
            "hosted_url",
            hosted_url.filter(|_| flow.in_progress()).map(Value::from),
        ),
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
    std::iter::once(domain)
        .chain(allowed.iter().map(String::as_str))
        .any(|candidate| {
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
        for outside in [
            "https://example.org/",
            "https://notexample.com/",
            "about:blank",
            "nonsense",
        ] {
            assert!(!in_domains(outside, "example.com", &allowed), "{outside}");
        }
        assert!(in_domains("http://127.0.0.1:8080/", "127.0.0.1:8080", &[]));
        assert!(!in_domains("http://127.0.0.1:9090/", "127.0.0.1:8080", &[]));
    }
}
