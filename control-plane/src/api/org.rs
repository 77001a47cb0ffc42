//! The authenticated caller of a request: `Authorization: Bearer <api key>` resolved to
//! its organization, or a session token on one of that session's own routes
//! (`session_token`). Authorization happens here too, for every route at once: a key
//! with a policy passes only if the policy allows the action the route needs
//! (`crate::access::actions`), so no handler checks permissions itself.

use std::ops::Deref;

use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::request::Parts;
use chrono::{DateTime, Utc};

use super::error::{ApiError, OrNotFound};
use super::session_token::SessionCaller;
use super::state::AppState;
use crate::access::actions;
use crate::access::keys::Refused;
use crate::access::policy::Policy;
use crate::agent::AgentClient;
use crate::store::{ApiKeyRecord, SessionRecord};

/// The caller's organization, from `Authorization: Bearer <key>`, with the services that
/// act for it. Handlers that take it are authenticated and authorized; everything they
/// touch is scoped to `id`.
#[derive(Clone)]
pub struct Org {
    pub id: String,
    /// Set when the caller is an action, with its invocation's short-lived key.
    pub invocation_id: Option<String>,
    pub caller: Caller,
    state: AppState,
}

/// Who is calling, and with which rights.
#[derive(Clone, Debug)]
pub enum Caller {
    /// An API key, or an action's invocation key acting with the rights of the key that
    /// started it (`key` is that key; `None` for invocations started before keys had
    /// policies, or by a session token).
    Key {
        key: Option<ApiKeyRecord>,
        invocation: bool,
    },
    /// A browser's own token, on that browser's routes only (`session_token`).
    SessionToken,
}

impl Caller {
    /// The key whose rights the call has, if any.
    pub fn key(&self) -> Option<&ApiKeyRecord> {
        match self {
            Self::Key { key, .. } => key.as_ref(),
            Self::SessionToken => None,
        }
    }

    pub fn policy(&self) -> Option<&Policy> {
        self.key().and_then(|key| key.policy.as_ref())
    }

    /// When the caller's rights end, if they do.
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.key().and_then(|key| key.expires_at)
    }
}

impl FromRequestParts<AppState> for Org {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let org = Self::authenticate(parts, state).await?;
        org.authorize(parts).await?;
        if let Some(slot) = parts.extensions.get::<super::telemetry_calls::CallerOrg>() {
            slot.set(&org.id);
        }
        Ok(org)
    }
}

impl Org {
    async fn authenticate(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let org = |id: String, invocation_id: Option<String>, caller: Caller| Self {
            id,
            invocation_id,
            caller,
            state: state.clone(),
        };
        if let Some(caller) = parts.extensions.get::<SessionCaller>() {
            return Ok(org(caller.org.clone(), None, Caller::SessionToken));
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
            // Honoured only while its invocation runs, and its starter's key lives.
            if !state.apps.is_unfinished(&claims.org, &claims.sub).await? {
                return Err(ApiError::Unauthorized(
                    "this invocation's API key expired with its invocation".into(),
                ));
            }
            let starter = match &claims.key {
                Some(key_id) => Some(state.api_keys.live(key_id).await?.map_err(|_| {
                    ApiError::Unauthorized(
                        "the API key that started this invocation is no longer valid".into(),
                    )
                })?),
                None => None,
            };
            return Ok(org(
                claims.org,
                Some(claims.sub),
                Caller::Key {
                    key: starter,
                    invocation: true,
                },
            ));
        }
        match state.api_keys.authenticate(key).await? {
            Ok(record) => Ok(org(
                record.org_id.clone(),
                None,
                Caller::Key {
                    key: Some(record),
                    invocation: false,
                },
            )),
            Err(Refused::Invalid) => Err(ApiError::Unauthorized("invalid API key".into())),
            Err(Refused::Expired(at)) => Err(ApiError::Unauthorized(format!(
                "this API key expired at {}",
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ))),
        }
    }

    /// Refuses the call (403, naming the action) if the caller's policy does not allow
    /// what the route needs. Keys without a policy may do anything in their organization.
    async fn authorize(&self, parts: &Parts) -> Result<(), ApiError> {
        let Some(policy) = self.caller.policy() else {
            return Ok(());
        };
        let template = parts
            .extensions
            .get::<MatchedPath>()
            .map(|matched| matched.as_str().to_owned())
            .unwrap_or_else(|| parts.uri.path().to_owned());
        let project_id = self.api_keys.default_project(&self.id).await?;
        let Some(required) =
            actions::required(&parts.method, &template, parts.uri.path(), &project_id)
        else {
            return Ok(());
        };
        if policy.allows(&required) {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!(
            "this API key's policy does not allow {} on {}",
            required.action(),
            required.resource
        )))
    }
}

impl Org {
    /// Whether the caller's policy allows `verb` on the organization's `kind` `id`
    /// (always, for a caller without a policy).
    pub async fn allows(
        &self,
        kind: &'static str,
        verb: &'static str,
        id: &str,
    ) -> Result<bool, ApiError> {
        let Some(policy) = self.caller.policy() else {
            return Ok(true);
        };
        let project_id = self.api_keys.default_project(&self.id).await?;
        Ok(policy.allows(&crate::access::policy::Required {
            kind,
            verb,
            resource: format!("projects/{project_id}/{kind}/{id}"),
        }))
    }

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
