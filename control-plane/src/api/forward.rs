//! Requests for the work one replica runs (managed-auth flows, apps: their state lives in
//! that replica's memory) are forwarded to that replica when another one receives them,
//! streams (SSE) and WebSocket upgrades included. Behind a load balancer, any replica
//! then serves any request.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{
    CONNECTION, CONTENT_LENGTH, HOST, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, RETRY_AFTER, TE,
    TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;

use super::error::ApiError;
use super::state::AppState;
use crate::replicas::WORKFLOWS;

/// Marks a forwarded request: the replica that receives it serves it, whatever it
/// believes about who runs the workflows (no request goes back and forth).
const FORWARDED: &str = "x-browser-service-forwarded";

/// The routes whose work runs on the workflows replica.
fn runs_on_workflows_replica(path: &str) -> bool {
    path.starts_with("/auth/")
        || path == "/apps"
        || ["/deployments", "/invocations"]
            .iter()
            .any(|prefix| path == *prefix || path.starts_with(&format!("{prefix}/")))
}

/// The client forwarded requests go through: no overall timeout (streams last), a
/// short one to connect.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}

pub async fn to_workflows_replica(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    if !runs_on_workflows_replica(request.uri().path()) || request.headers().contains_key(FORWARDED)
    {
        return next.run(request).await;
    }
    match state
        .services
        .replica
        .duty_holder_elsewhere(WORKFLOWS)
        .await
    {
        Ok(Some(address)) => forward(&state.forwarder, &address, request).await,
        // Here, or nowhere yet (then this replica is about to take them).
        Ok(None) => next.run(request).await,
        Err(error) => ApiError::from(error).into_response(),
    }
}

/// Headers of one hop, not to be passed on (RFC 9110 7.6.1); `Connection` and `Upgrade`
/// are set again for upgrades.
fn end_to_end(
    headers: &HeaderMap,
) -> impl Iterator<Item = (&HeaderName, &axum::http::HeaderValue)> {
    const HOP: [HeaderName; 8] = [
        CONNECTION,
        HOST,
        PROXY_AUTHENTICATE,
        PROXY_AUTHORIZATION,
        TE,
        TRAILER,
        TRANSFER_ENCODING,
        UPGRADE,
    ];
    headers
        .iter()
        .filter(|(name, _)| !HOP.contains(name) && name.as_str() != "keep-alive")
}

async fn forward(client: &reqwest::Client, address: &str, mut request: Request) -> Response {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .to_owned();
    let upgrade = request.headers().get(UPGRADE).cloned();
    let incoming = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let mut outgoing = client
        .request(parts.method, format!("{address}{path}"))
        .header(FORWARDED, "1");
    for (name, value) in end_to_end(&parts.headers) {
        outgoing = outgoing.header(name, value);
    }
    outgoing = match &upgrade {
        Some(protocol) => outgoing
            .header(CONNECTION, "upgrade")
            .header(UPGRADE, protocol),
        None => outgoing.body(reqwest::Body::wrap_stream(body.into_data_stream())),
    };
    let answer = match outgoing.send().await {
        Ok(answer) => answer,
        Err(error) => {
            tracing::warn!(address, %error, "the replica running workflows did not answer");
            return (
                [(RETRY_AFTER, "2")],
                ApiError::BadGateway(
                    "the replica running managed-auth flows and apps did not answer; retry".into(),
                ),
            )
                .into_response();
        }
    };
    let status = answer.status();
    let mut response = Response::builder().status(status);
    for (name, value) in end_to_end(answer.headers()) {
        if name != CONTENT_LENGTH || upgrade.is_none() {
            response = response.header(name, value);
        }
    }
    if status == StatusCode::SWITCHING_PROTOCOLS
        && let (Some(protocol), Some(incoming)) = (upgrade, incoming)
    {
        tokio::spawn(async move {
            let (Ok(upstream), Ok(downstream)) = (answer.upgrade().await, incoming.await) else {
                return;
            };
            let (mut upstream, mut downstream) = (upstream, TokioIo::new(downstream));
            let _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await;
        });
        return response
            .header(CONNECTION, "upgrade")
            .header(UPGRADE, protocol)
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response());
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

#[cfg(test)]
mod tests {
    use super::runs_on_workflows_replica;

    #[test]
    fn only_workflow_routes_are_forwarded() {
        for path in [
            "/auth/connections",
            "/auth/connections/x/live/ws",
            "/apps",
            "/deployments",
            "/deployments/d/events",
            "/invocations/i",
        ] {
            assert!(runs_on_workflows_replica(path), "{path}");
        }
        for path in [
            "/browsers",
            "/appsx",
            "/deploymentsx",
            "/credentials",
            "/browser_pools",
        ] {
            assert!(!runs_on_workflows_replica(path), "{path}");
        }
    }
}
