//! Records calls in the audit log (`crate::audit`): a layer around every route that
//! notes the request, lets the `Org` extractor say who called and what the route needs
//! (`AuditSlot`), and after the answer keeps a record of every state-changing call and
//! every refused one of a known organization. Each answer carries its `X-Request-Id`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::state::AppState;
use crate::audit::now_us;
use crate::store::AuditRecord;

/// Who made a call and what its route needs, as the `Org` extractor found out.
#[derive(Clone, Debug, Default)]
pub struct Actor {
    pub org_id: String,
    /// `api_key`, `invocation_key` or `session_token`.
    pub auth_strategy: &'static str,
    pub api_key_id: String,
    /// A person's subject and email, when a person signed in calls.
    pub user_id: String,
    pub email: String,
    pub action: String,
    pub resource: String,
}

/// Filled by the `Org` extractor for the audit layer.
#[derive(Clone, Default)]
pub struct AuditSlot(Arc<Mutex<Option<Actor>>>);

impl AuditSlot {
    pub fn fill(&self, actor: Actor) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(actor);
        }
    }

    fn take(&self) -> Option<Actor> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Whether a call is recorded: it may change something, or it was refused.
fn is_recorded(method: &Method, status: StatusCode) -> bool {
    let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    !reads || status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
}

fn outcome(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 | 403 => "denied",
        400.. => "failed",
        _ => "allowed",
    }
}

/// A header's text, at most 512 characters; empty when absent.
fn header_text(headers: &HeaderMap, name: header::HeaderName) -> String {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(|value| value.chars().take(512).collect())
        .unwrap_or_default()
}

pub async fn record_calls(
    State(state): State<AppState>, mut request: Request, next: Next,
) -> Response {
    let slot = AuditSlot::default();
    request.extensions_mut().insert(slot.clone());
    let request_id = crate::ids::random_lowercase(20);
    let started = Instant::now();
    let ts_us = now_us();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| path.clone(), |matched| matched.as_str().to_owned());
    // The TCP peer; calls from app sandboxes come over a Unix socket and have none.
    let client_ip = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip().to_string())
        .unwrap_or_default();
    let user_agent = header_text(request.headers(), header::USER_AGENT);
    let domain = header_text(request.headers(), header::HOST);
    let mut response = next.run(request).await;
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    let status = response.status();
    if is_recorded(&method, status)
        && let Some(actor) = slot.take()
    {
        let record = AuditRecord {
            id: crate::ids::new_id("aud"),
            org_id: actor.org_id,
            ts_us,
            method: method.to_string(),
            path,
            route,
            status: i64::from(status.as_u16()),
            duration_ms: started.elapsed().as_millis() as i64,
            client_ip,
            user_agent,
            domain,
            auth_strategy: actor.auth_strategy.to_owned(),
            api_key_id: actor.api_key_id,
            user_id: actor.user_id,
            email: actor.email,
            action: actor.action,
            resource: actor.resource,
            outcome: outcome(status).to_owned(),
            request_id,
        };
        state.audit.record(record);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_and_refusals_are_recorded_reads_are_not() {
        assert!(is_recorded(&Method::POST, StatusCode::OK));
        assert!(is_recorded(&Method::DELETE, StatusCode::NOT_FOUND));
        assert!(is_recorded(&Method::GET, StatusCode::FORBIDDEN));
        assert!(is_recorded(&Method::GET, StatusCode::UNAUTHORIZED));
        assert!(!is_recorded(&Method::GET, StatusCode::OK));
        assert!(!is_recorded(&Method::GET, StatusCode::NOT_FOUND));
        assert_eq!(outcome(StatusCode::FORBIDDEN), "denied");
        assert_eq!(outcome(StatusCode::CONFLICT), "failed");
        assert_eq!(outcome(StatusCode::NO_CONTENT), "allowed");
    }
}
