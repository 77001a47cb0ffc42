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
#[utoipa::path(get, path = "/healthz", security(()), responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

#[derive(Serialize, ToSchema)]
pub struct Readiness {
    pub status: &'static str,
    /// How browsers are kept apart from the host and each other here, and what is not
    /// enforced on this host.
    pub isolation: IsolationReport,
    pub admission: Admission,
}

/// How full the host is, as creates see it.
#[derive(Serialize, ToSchema)]
pub struct Admission {
    /// Browser VMs the deployment holds at once (`--capacity-browsers`); `null` where
    /// none is enforced (Kubernetes without the flag).
    pub capacity_browsers: Option<u64>,
    /// Creates this replica holds until the host has room.
    pub queued_creates: i64,
}

/// Readiness: the store answers. Also reports the browsers' isolation.
#[utoipa::path(get, path = "/readyz", security(()),
    responses((status = 200, body = Readiness), (status = 500, body = ErrorBody)))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    state.store.api_key_count().await?;
    Ok(Json(Readiness {
        status: "ready",
        isolation: state.runtime.isolation(),
        admission: Admission {
            capacity_browsers: Some(state.sessions.host_limits().browsers)
                .filter(|&browsers| browsers != u64::MAX),
            queued_creates: crate::metrics::METRICS.admission_queue_length(),
        },
    }))
}
