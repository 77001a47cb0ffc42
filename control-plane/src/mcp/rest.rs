//! Calls of the REST API made in process for a tool: a request built like the caller's
//! own (its credentials, its project, its address) and answered by the REST router with
//! all its layers, so a tool can do exactly what the caller could do over HTTP.

use std::net::SocketAddr;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use axum::http::{HeaderName, Method, Request, StatusCode, header};
use serde_json::Value;
use tower::ServiceExt;

/// The caller's headers a REST call carries along: who calls, and in which project.
const FORWARDED_HEADERS: [&str; 4] =
    ["authorization", "x-kernel-project-id", "x-kernel-project", "user-agent"];

/// The largest answer a tool reads (a screenshot of a large screen, a long listing).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

#[derive(Clone)]
pub struct Rest {
    router: Router,
}

/// A REST answer that succeeded.
pub struct Answer {
    pub content_type: Option<String>,
    pub body: Bytes,
}

/// Why a REST call failed, as a model should read it: the status and the API's message.
#[derive(Debug)]
pub struct Failure(pub String);

impl Rest {
    pub fn new(router: Router) -> Self {
        Self { router }
    }

    /// Makes one REST call for the caller whose MCP request `caller` is.
    pub async fn call(
        &self, caller: &Parts, method: Method, path_and_query: &str, body: Option<&Value>,
    ) -> Result<Answer, Failure> {
        self.call_within(caller, method, path_and_query, body, MAX_ANSWER_BYTES).await
    }

    /// `call`, refusing an answer longer than `max_bytes` (without reading it all).
    pub async fn call_within(
        &self, caller: &Parts, method: Method, path_and_query: &str, body: Option<&Value>,
        max_bytes: usize,
    ) -> Result<Answer, Failure> {
        let mut request = Request::builder().method(method).uri(path_and_query);
        for name in FORWARDED_HEADERS {
            if let Some(value) = caller.headers.get(HeaderName::from_static(name)) {
                request = request.header(name, value);
            }
        }
        if let Some(peer) = caller.extensions.get::<ConnectInfo<SocketAddr>>() {
            request = request.extension(*peer);
        }
        let request = match body {
            Some(json) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json.to_string())),
            None => request.body(Body::empty()),
        }
        .map_err(|error| Failure(format!("invalid request: {error}")))?;
        let response =
            self.router.clone().oneshot(request).await.map_err(|never| match never {})?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let declared_length = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok()?.parse::<usize>().ok());
        if status.is_success() && declared_length.is_some_and(|length| length > max_bytes) {
            let mib = max_bytes >> 20;
            return Err(Failure(format!("the answer is larger than {mib} MiB")));
        }
        let body = axum::body::to_bytes(response.into_body(), max_bytes)
            .await
            .map_err(|error| Failure(format!("reading the answer failed: {error}")))?;
        if status.is_success() {
            Ok(Answer { content_type, body })
        } else {
            Err(Failure(failure_text(status, &body)))
        }
    }

    /// A REST call whose answer is JSON (`null` for an empty answer, such as a 204).
    pub async fn json(
        &self, caller: &Parts, method: Method, path_and_query: &str, body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let answer = self.call(caller, method, path_and_query, body).await?;
        if answer.body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&answer.body)
            .map_err(|error| Failure(format!("the answer is not JSON: {error}")))
    }
}

/// `404 Not Found: browser session x not found`, from the API's Error shape.
fn failure_text(status: StatusCode, body: &[u8]) -> String {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|error| error.get("message")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(500).collect());
    format!("{status}: {message}")
}

/// A path segment with everything but letters, digits, `-`, `_` and `~` escaped (dots too,
/// so `..` stays a name), so an identifier a model passes cannot reach another route.
pub fn segment(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_~".contains(&byte) {
            escaped.push(byte as char);
        } else {
            escaped.push_str(&format!("%{byte:02X}"));
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identifier_stays_one_segment() {
        assert_eq!(segment("ses_abc-1"), "ses_abc-1");
        assert_eq!(segment("../../profiles"), "%2E%2E%2F%2E%2E%2Fprofiles");
        assert_eq!(segment("a?b#c d%"), "a%3Fb%23c%20d%25");
    }

    #[test]
    fn a_failure_reads_the_api_message() {
        let body = br#"{"code":"not_found","message":"browser session x not found"}"#;
        assert_eq!(
            failure_text(StatusCode::NOT_FOUND, body),
            "404 Not Found: browser session x not found"
        );
        assert_eq!(failure_text(StatusCode::BAD_GATEWAY, b"upstream"), "502 Bad Gateway: upstream");
    }
}
