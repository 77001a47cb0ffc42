//! The control plane's MCP server: Model Context Protocol over Streamable HTTP at `/mcp`,
//! for AI assistants that reach browsers through tools rather than SDK code.
//!
//! Every tool call is made of calls of the REST API, dispatched in process through the
//! very router that serves it (`rest::Rest`) with the caller's own credentials: the same
//! authentication, project scoping, policies, limits, audit records and forwarding to the
//! replica that serves a browser. MCP is another way in, never a side door.
//!
//! The server is stateless (no MCP session is kept between requests), so any replica
//! answers any request, and a control plane restart loses nothing.

mod params;
mod resources;
mod rest;
mod tools;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::api::error::ApiError;
use crate::api::org::Org;
use crate::api::state::AppState;

pub use rest::Rest;

/// Where the MCP server answers.
pub const PATH: &str = "/mcp";

/// The `/mcp` route. `api` is the REST router the tools call through.
pub fn routes(state: AppState, api: Router) -> Router {
    let rest = Rest::new(api);
    let config = StreamableHttpServerConfig::default()
        // No session between requests: any replica serves any request.
        .with_legacy_session_mode(false)
        .with_json_response(true)
        // Callers authenticate with a bearer credential on every request and never with
        // a cookie (see `authenticate`), so a page that rebinds a name of its own to this
        // server gains nothing: the Host check rmcp adds against DNS rebinding would only
        // refuse the names operators publish the service under.
        .disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(tools::BrowserTools::new(rest.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    Router::new()
        .route_service(PATH, service)
        .layer(axum::middleware::from_fn_with_state(state, authenticate))
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

/// Admits a request with a valid bearer credential (an API key, an OIDC access token);
/// what each tool may then do is decided by the REST routes it calls. A signed-in
/// console's cookie is not accepted: another site's page could make a browser send it.
async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    parts.headers.remove(header::COOKIE);
    if !parts.headers.contains_key(header::AUTHORIZATION) {
        return ApiError::Unauthorized(
            "send your API key as `Authorization: Bearer <key>` to use the MCP server".into(),
        )
        .into_response();
    }
    if let Err(error) = Org::from_request_parts(&mut parts, &state).await {
        return error.into_response();
    }
    next.run(Request::from_parts(parts, body)).await
}
