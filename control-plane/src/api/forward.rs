//! Requests for state that lives in one replica's memory are forwarded to that replica
//! when another one receives them, streams (SSE) and WebSocket upgrades included: the
//! work one replica runs (managed-auth flows, apps), and a browser's filesystem watches
//! (kept by the replica that serves the browser). Behind a load balancer, any replica
//! then serves any request.

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
use crate::replicas::{Place, WORKFLOWS};

/// Marks a forwarded request (with the replicas' shared proof, `Tokens::forwarding_proof`):
/// the replica that receives it serves it, whatever it believes about where the state
/// lives (no request goes back and forth). A client's own value is dropped.
const FORWARDED: &str = "x-browser-service-forwarded";

/// Where a route's state lives.
#[derive(Debug, PartialEq, Eq)]
enum Home<'a> {
    /// Wherever the request lands (the store has it all).
    Anywhere,
    /// The replica that runs workflows.
    Workflows,
    /// The replica that serves this browser.
    Browser(&'a str),
}

fn home(path: &str) -> Home<'_> {
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    if path.starts_with("/auth/")
        || path == "/apps"
        || under("/deployments")
        || under("/invocations")
    {
        return Home::Workflows;
    }
    let mut parts = path.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(""), Some("browsers"), Some(id), Some("fs"), Some("watch")) => Home::Browser(id),
        _ => Home::Anywhere,
    }
}

/// Marks a response another replica gave: that replica counted the request.
#[derive(Clone, Copy, Debug)]
pub struct ForwardedElsewhere;

/// Serves a request here, or forwards it to the replica that must serve it: workflows'
/// routes to the holder of the workflows lease, a browser's `fs/watch` routes to its
/// owner.
pub async fn to_home_replica(
    State(state): State<AppState>, mut request: Request, next: Next,
) -> Response {
    if let Some(presented) = request.headers_mut().remove(FORWARDED)
        && state.tokens.is_forwarded(presented.as_bytes())
    {
        return next.run(request).await;
    }
    let replica = &state.services.replica;
    let place = match home(request.uri().path()) {
        Home::Anywhere => return next.run(request).await,
        Home::Workflows => replica.duty_holder(WORKFLOWS).await,
        Home::Browser(id) => {
            replica.owner_elsewhere(id).await.map(|found| found.map_or(Place::Here, Place::At))
        }
    };
    match place {
        Ok(Place::Here) => next.run(request).await,
        Ok(Place::At(address)) => {
            let proof = state.tokens.forwarding_proof().to_owned();
            let mut response = forward(&state.forwarder, &address, &proof, request).await;
            // The replica that served it counts it.
            response.extensions_mut().insert(ForwardedElsewhere);
            response
        }
        // Between two holders (one died, the next takes over within seconds).
        Ok(Place::Nowhere) => (
            [(RETRY_AFTER, "2")],
            ApiError::BadGateway(
                "no replica runs managed-auth flows and apps at this moment; retry".into(),
            ),
        )
            .into_response(),
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
    headers.iter().filter(|(name, _)| !HOP.contains(name) && name.as_str() != "keep-alive")
}

async fn forward(
    client: &reqwest::Client, address: &str, proof: &str, mut request: Request,
) -> Response {
    let path = request.uri().path_and_query().map_or("/", |path| path.as_str()).to_owned();
    let upgrade = request.headers().get(UPGRADE).cloned();
    let incoming = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let mut outgoing =
        client.request(parts.method, format!("{address}{path}")).header(FORWARDED, proof);
    for (name, value) in end_to_end(&parts.headers) {
        outgoing = outgoing.header(name, value);
    }
    outgoing = match &upgrade {
        Some(protocol) => outgoing.header(CONNECTION, "upgrade").header(UPGRADE, protocol),
        None => outgoing.body(reqwest::Body::wrap_stream(body.into_data_stream())),
    };
    let answer = match outgoing.send().await {
        Ok(answer) => answer,
        Err(error) => {
            tracing::warn!(address, %error, "the replica serving this request did not answer");
            return (
                [(RETRY_AFTER, "2")],
                ApiError::BadGateway(
                    "the replica that serves this request did not answer; retry".into(),
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
    use super::{Home, home};

    #[test]
    fn routes_are_served_where_their_state_lives() {
        for path in [
            "/auth/connections",
            "/auth/connections/x/live/ws",
            "/apps",
            "/deployments",
            "/deployments/d/events",
            "/invocations/i",
        ] {
            assert_eq!(home(path), Home::Workflows, "{path}");
        }
        for path in ["/browsers/b1/fs/watch", "/browsers/b1/fs/watch/w/events"] {
            assert_eq!(home(path), Home::Browser("b1"), "{path}");
        }
        for path in [
            "/browsers",
            "/browsers/b1",
            "/browsers/b1/fs/read_file",
            "/appsx",
            "/deploymentsx",
            "/credentials",
            "/browser_pools",
        ] {
            assert_eq!(home(path), Home::Anywhere, "{path}");
        }
    }
}
