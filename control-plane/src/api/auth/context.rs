//! `GET /auth/context`: who the caller is and what it may reach (the SDK's
//! `AuthContext`). Open to every authenticated caller whatever its policy.

use axum::Json;
use serde_json::{Value, json};

use crate::api::error::ApiError;
use crate::api::org::{Caller, Org};

/// The identity and scope resolved for this request.
#[utoipa::path(get, path = "/auth/context", responses((status = 200, description = "AuthContext")))]
pub async fn context(org: Org) -> Result<Json<Value>, ApiError> {
    let key = org.caller.key();
    let project_id = key.and_then(|key| key.project_id.clone());
    // Presented keys are API keys; an action's invocation key and a browser's token are
    // signed tokens (JWTs).
    let method = match &org.caller {
        Caller::Key { invocation: false, .. } => "api_key",
        _ => "jwt",
    };
    let (principal_id, principal_type, source) = match (org.caller.person(), key) {
        (Some(person), _) => (person.sub.clone(), "user", "oauth"),
        (None, Some(key)) => (key.id.clone(), "api_key", "api_key"),
        (None, None) => (
            org.invocation_id.clone().unwrap_or_else(|| "session".to_owned()),
            "api_key",
            "api_key",
        ),
    };
    // What this server adds: a signed-in person's role and email.
    let person = org
        .caller
        .person()
        .map(|person| json!({ "role": person.role, "email": person.email, "name": person.name }));
    Ok(Json(json!({
        "authentication": {
            "credential_id": key.map(|key| key.id.clone()),
            "method": method,
            "source": source,
        },
        "authorization": {
            "credential_scope": { "project_id": project_id },
            "effective_scope": {
                "project_id": org.project.as_ref().map(|project| project.id.clone()),
            },
        },
        "organization": { "id": org.id },
        "principal": { "id": principal_id, "type": principal_type },
        "person": person,
    })))
}
