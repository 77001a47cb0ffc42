//! The authenticated caller of a request: `Authorization: Bearer <api key>` resolved to
//! its organization, or a session token on one of that session's own routes
//! (`session_token`).

use std::ops::Deref;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::{ApiError, OrNotFound};
use super::session_token::SessionCaller;
use super::state::AppState;
use crate::agent::AgentClient;
use crate::api_keys::organization_for_key;
use crate::store::SessionRecord;

/// The caller's organization, from `Authorization: Bearer <key>`, with the services that
/// act for it. Handlers that take it are authenticated; everything they touch is scoped
/// to `id`.
#[derive(Clone)]
pub struct Org {
    pub id: String,
    /// Set when the caller is an action, with its invocation's short-lived key.
    pub invocation_id: Option<String>,
    state: AppState,
}

impl FromRequestParts<AppState> for Org {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let org = Self::authenticate(parts, state).await?;
        if let Some(slot) = parts.extensions.get::<super::telemetry_calls::CallerOrg>() {
            slot.set(&org.id);
        }
        Ok(org)
    }
}

impl Org {
    async fn authenticate(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Some(caller) = parts.extensions.get::<SessionCaller>() {
            return Ok(Self {
                id: caller.org.clone(),
                invocation_id: None,
                state: state.clone(),
            });
        }
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
        let key = key.trim();
        if let Some(claims) = state.tokens.verify_invocation_key(key) {
            // Honoured only while its invocation runs.
            if !state.apps.is_unfinished(&claims.org, &claims.sub).await? {
                return Err(ApiError::Unauthorized(
                    "this invocation's API key expired with its invocation".into(),
                ));
            }
            return Ok(Self {
                id: claims.org,
                invocation_id: Some(claims.sub),
                state: state.clone(),
            });
        }
        match organization_for_key(state.store.as_ref(), &state.key_cache, key).await? {
            Some(id) => Ok(Self {
                id,
                invocation_id: None,
                state: state.clone(),
            }),
            None => Err(ApiError::Unauthorized("invalid API key".into())),
        }
    }
}

impl Org {
    /// One of the organization's browser sessions, live or ended.
    pub async fn session(&self, session_id: &str) -> Result<SessionRecord, ApiError> {
        let found = self.store.session(&self.id, session_id).await?;
        found.or_not_found("browser session", session_id)
    }

    /// The agent of one of the organization's live sessions.
    pub async fn agent(&self, session_id: &str) -> Result<AgentClient, ApiError> {
        let session = self.sessions.live(&self.id, session_id).await?;
        Ok(self.sessions.agent(&session)?)
    }
}

/// Handlers reach the services as `org.sessions`, `org.store`, …
impl Deref for Org {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.state
    }
}
