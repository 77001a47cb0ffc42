//! API calls on a browser as its telemetry (`api_call`, or `platform_api_call` for calls
//! that manage the VM): recorded once answered, with the operation, status and duration.
//! The organization is known only once the handler authenticated the caller (`Org` puts
//! it in the slot this layer leaves in the request).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::state::AppState;
use crate::telemetry::event;

/// Filled with the caller's organization by the `Org` extractor.
#[derive(Clone, Default)]
pub struct CallerOrg(Arc<Mutex<Option<String>>>);

impl CallerOrg {
    pub fn set(&self, org_id: &str) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(org_id.to_owned());
        }
    }

    fn take(&self) -> Option<String> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

/// The browser a path is about, and the call's operation id
/// (`browsers.computer.click_mouse`, `browsers.update`, …).
fn browser_call(method: &str, path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/browsers/")?;
    let mut segments = rest.split('/').filter(|s| !s.is_empty());
    let browser = segments.next()?.to_owned();
    let more: Vec<&str> = segments.collect();
    // Streams and connections are not calls (they are `connection` events or long-lived).
    if matches!(more.first(), Some(&"cdp" | &"live" | &"webdriver"))
        || more.last() == Some(&"stream")
    {
        return None;
    }
    let operation = if more.is_empty() {
        match method {
            "GET" => "browsers.retrieve".to_owned(),
            "PATCH" => "browsers.update".to_owned(),
            "DELETE" => "browsers.delete".to_owned(),
            _ => return None,
        }
    } else {
        let named: Vec<&str> = more
            .iter()
            .copied()
            .filter(|segment| segment.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_'))
            .collect();
        format!("browsers.{}", named.join("."))
    };
    Some((browser, operation))
}

pub async fn record_browser_calls(
    State(state): State<AppState>, mut request: Request, next: Next,
) -> Response {
    let Some((browser, operation)) = browser_call(request.method().as_str(), request.uri().path())
    else {
        return next.run(request).await;
    };
    let caller = CallerOrg::default();
    request.extensions_mut().insert(caller.clone());
    let started = Instant::now();
    let response = next.run(request).await;
    let Some(org_id) = caller.take() else {
        return response;
    };
    let status = response.status().as_u16();
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    tokio::spawn(async move {
        // Not `live`: recording a call must not count as the session's activity.
        if let Some(session) = state.sessions.peek(&org_id, &browser).await {
            let request_id = crate::ids::random_lowercase(16);
            state
                .telemetry
                .record(&session, event::api_call(&operation, &request_id, status, duration_ms));
        }
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_browser_and_operation() {
        assert_eq!(
            browser_call("POST", "/browsers/abc/computer/click_mouse"),
            Some(("abc".into(), "browsers.computer.click_mouse".into()))
        );
        assert_eq!(
            browser_call("PATCH", "/browsers/abc"),
            Some(("abc".into(), "browsers.update".into()))
        );
        assert_eq!(browser_call("GET", "/browsers/abc/telemetry/stream"), None);
        assert_eq!(browser_call("GET", "/browsers"), None);
        assert_eq!(
            browser_call("GET", "/browsers/abc/replays/r1/download"),
            Some(("abc".into(), "browsers.replays.download".into()))
        );
    }
}
