//! The authenticated caller of a request: `Authorization: Bearer <api key>` resolved to
//! its organization.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::ApiError;
use super::state::AppState;
use crate::api_keys::organization_for_key;

/// The caller's organization, from `Authorization: Bearer <key>`. Handlers that take it
/// are authenticated; everything they touch is scoped to `org_id`.
#[derive(Clone, Debug)]
pub struct Caller {
    pub org_id: String,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(|| {
                ApiError::Unauthorized("missing Authorization: Bearer <api key> header".into())
            })?;
        let key = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or_else(|| {
                ApiError::Unauthorized("the Authorization header must be `Bearer <api key>`".into())
            })?;
        match organization_for_key(state.store.as_ref(), &state.key_cache, key.trim()).await? {
            Some(org_id) => Ok(Self { org_id }),
            None => Err(ApiError::Unauthorized("invalid API key".into())),
        }
    }
}
