//! `GET /auth/context`: who the caller is and what it may reach (the SDK's
//! `AuthContext`). Open to every authenticated caller whatever its policy.

use axum::Json;
use serde_json::{Value, json};

use super::error::{ApiError, ErrorBody};
use super::org::{Caller, Org};

/// The identity and scope resolved for this request.
#[utoipa::path(get, path = "/auth/context", tag = "auth", security(("bearer" = [])),
    responses((status = 200, description = "AuthContext"), (status = 401, body = ErrorBody)))]
pub async fn context(org: Org) -> Result<Json<Value>, ApiError> {
    let key = org.caller.key();
    let project_id = key.and_then(|key| key.project_id.clone());
    // Presented keys are API keys; an action's invocation key and a browser's token are
    // signed tokens (JWTs).
    let method = match &org.caller {
        Caller::Key {
            invocation: false, ..
        } => "api_key",
        _ => "jwt",
    };
    let principal_id = match (key, &org.invocation_id) {
        (Some(key), _) => key.id.clone(),
        (None, Some(invocation)) => invocation.clone(),
        (None, None) => "session".to_owned(),
    };
    Ok(Json(json!({
        "authentication": {
            "credential_id": key.map(|key| key.id.clone()),
            "method": method,
            "source": "api_key",
        },
        "authorization": {
            "credential_scope": { "project_id": project_id },
            "effective_scope": {
                "project_id": org.project.as_ref().map(|project| project.id.clone()),
            },
        },
        "organization": { "id": org.id },
        "principal": { "id": principal_id, "type": "api_key" },
    })))
}
