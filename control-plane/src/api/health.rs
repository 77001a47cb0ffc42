//! Operator endpoints, without authentication.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::state::AppState;

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: the store answers.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, body = Health), (status = 500, body = ErrorBody)))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.store.api_key_count().await?;
    Ok(Json(Health { status: "ready" }))
}
