//! `GET /metrics` for Prometheus, and the middleware that counts every request. Metrics
//! are for operators, not tenants: on the API's address they need the metrics token
//! (`--metrics-token`); `--metrics-listen` serves them without one on an address of the
//! operator's choosing. Not part of the OpenAPI document.

use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::state::AppState;
use crate::metrics::{self, METRICS, RequestLabels};

pub const PATH: &str = "/metrics";

/// Counts the request and how long its answer took, by the route's template.
pub async fn count_requests(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = match *request.method() {
        Method::GET | Method::POST | Method::PUT | Method::PATCH | Method::DELETE => {
            request.method().as_str().to_owned()
        }
        // Any other word is a method too: one label for all, or each would be a series.
        _ => "other".to_owned(),
    };
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let response = next.run(request).await;
    if response.extensions().get::<super::forward::ForwardedElsewhere>().is_some() {
        return response;
    }
    METRICS
        .http_request(RequestLabels { method, route, status: response.status().as_u16() }, started);
    response
}

/// `GET /metrics` on the API's address: with the metrics token only.
pub async fn with_token(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(token) = &state.settings.metrics.token else {
        return ApiError::NotFound(
            "metrics are not served on this address (see --metrics-token and --metrics-listen)"
                .into(),
        )
        .into_response();
    };
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !bool::from(presented.as_bytes().ct_eq(token.as_bytes())) {
        return ApiError::Unauthorized(
            "GET /metrics needs the metrics token as a Bearer token".into(),
        )
        .into_response();
    }
    exposition(&state).await
}

/// The router of `--metrics-listen`: metrics without a token, nothing else.
pub fn operator_router(state: AppState) -> Router {
    Router::new()
        .route(PATH, get(|State(state): State<AppState>| async move { exposition(&state).await }))
        .with_state(state)
}

async fn exposition(state: &AppState) -> Response {
    match metrics::render(state.services.store.as_ref(), state.settings.metrics.capacity).await {
        Ok(text) => ([(CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        Err(error) => ApiError::from(error).into_response(),
    }
}
