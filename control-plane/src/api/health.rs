//! Operator endpoints, without authentication.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::runtime::IsolationReport;

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

#[derive(Serialize, ToSchema)]
pub struct Readiness {
    pub status: &'static str,
    /// How browsers are kept apart from the host and each other here, and what is not
    /// enforced on this host.
    pub isolation: IsolationReport,
}

/// Readiness: the store answers. Also reports the browsers' isolation.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, body = Readiness), (status = 500, body = ErrorBody)))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    state.store.api_key_count().await?;
    Ok(Json(Readiness {
        status: "ready",
        isolation: state.runtime.isolation(),
    }))
}
