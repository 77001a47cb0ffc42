//! Browser sessions: `POST/GET/DELETE /browsers`, `GET/DELETE /browsers/{id}`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{JsonBody, PathParam, QueryParams};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ErrorDetail};
use crate::proxies::{self, ProxyRoute};
use crate::sessions::{LibraryExtension, NewSession};
use crate::state::AppState;
use crate::store::{SessionFilter, SessionProfile, SessionRecord, SessionStatus};

pub const DEFAULT_TIMEOUT_SECONDS: i64 = 60;
pub const MIN_TIMEOUT_SECONDS: i64 = 10;
pub const MAX_TIMEOUT_SECONDS: i64 = 259_200;
pub const DEFAULT_VIEWPORT: (i64, i64) = (1920, 1080);
/// Xvfb allocates the whole framebuffer up front; 8K is plenty.
pub const MAX_VIEWPORT_SIDE: i64 = 7680;
pub const MIN_VIEWPORT_SIDE: i64 = 100;
pub const MAX_PERSISTENT_ID_LENGTH: usize = 255;
pub const DEFAULT_LIST_LIMIT: u32 = 20;
pub const MAX_LIST_LIMIT: u32 = 100;

/// Fields of `POST /browsers`, as the Kernel SDKs send them. Unknown fields are refused
/// so that a typo is not silently ignored.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBrowserRequest {
    /// Launch Chromium with `--headless=new` and no display. Default false.
    pub headless: Option<bool>,
    /// Reduce automation fingerprints. Default false.
    pub stealth: Option<bool>,
    /// Seconds without API calls and without an open CDP connection after which the
    /// session is deleted. Default 60, minimum 10, maximum 259200.
    pub timeout_seconds: Option<i64>,
    /// Deprecated: creating with the id of a live session returns that session.
    pub persistence: Option<Persistence>,
    pub viewport: Option<ViewportRequest>,
    /// Start Chromium in kiosk mode (no address bar or tabs).
    pub kiosk_mode: Option<bool>,
    /// GPU acceleration; this server has none, so only `false` is accepted.
    pub gpu: Option<bool>,
    /// Accepted for compatibility; invocations are not part of this server.
    pub invocation_id: Option<String>,
    /// Extensions of the organization's library to load, each by id or by name.
    pub extensions: Option<Vec<ResourceReference>>,
    /// Proxy to route the browser's traffic through.
    pub proxy_id: Option<String>,
    /// Profile to start from, by id or name; with `save_changes` the browser's state is
    /// saved back into it when the session ends.
    pub profile: Option<ProfileReference>,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileReference {
    pub id: Option<String>,
    pub name: Option<String>,
    /// Default false.
    pub save_changes: Option<bool>,
}

/// A resource of the organization, by id or by name.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceReference {
    pub id: Option<String>,
    pub name: Option<String>,
}

/// The id or the name, when exactly one of them is given and not empty.
fn one_of<'a>(id: &'a Option<String>, name: &'a Option<String>) -> Option<&'a str> {
    match (id, name) {
        (Some(key), None) | (None, Some(key)) if !key.is_empty() => Some(key),
        _ => None,
    }
}

/// Most extensions one browser may load.
pub const MAX_EXTENSIONS: usize = 20;

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Persistence {
    pub id: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ViewportRequest {
    pub width: i64,
    pub height: i64,
    pub refresh_rate: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Viewport {
    pub width: i64,
    pub height: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refresh_rate: Option<i64>,
}

/// A browser session as the Kernel SDKs read it.
#[derive(Debug, Serialize, ToSchema)]
pub struct BrowserSession {
    pub session_id: String,
    /// WebSocket URL for Playwright `connect_over_cdp` / Puppeteer `connect`; carries a
    /// token valid for this session while it lives.
    pub cdp_ws_url: String,
    pub created_at: DateTime<Utc>,
    pub headless: bool,
    pub stealth: bool,
    pub timeout_seconds: i64,
    pub kiosk_mode: bool,
    pub gpu: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistence: Option<Persistence>,
    pub viewport: Viewport,
    /// Set once the session has ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<DateTime<Utc>>,
    /// The proxy the browser's traffic goes through (kept if the proxy is deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_id: Option<String>,
    /// The pool the browser belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolRef>,
    /// The profile the browser started from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<SessionProfileRef>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionProfileRef {
    pub id: String,
    pub save_changes: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PoolRef {
    pub id: String,
    pub name: Option<String>,
}

impl BrowserSession {
    pub fn from_record(state: &AppState, session: &SessionRecord) -> Self {
        let token = state.tokens.issue_cdp(&session.id, &session.org_id);
        Self {
            session_id: session.id.clone(),
            cdp_ws_url: format!(
                "{}/browsers/{}/cdp?jwt={token}",
                state.public_ws_url(),
                session.id
            ),
            created_at: session.created_at,
            headless: session.headless,
            stealth: session.stealth,
            timeout_seconds: session.timeout_seconds,
            kiosk_mode: session.kiosk_mode,
            gpu: false,
            persistence: session.persistent_id.clone().map(|id| Persistence { id }),
            viewport: Viewport {
                width: session.viewport_width,
                height: session.viewport_height,
                refresh_rate: session.viewport_refresh_rate,
            },
            deleted_at: session.ended_at,
            proxy_id: session.proxy_id.clone(),
            pool: session.pool_id.clone().map(|id| PoolRef { id, name: None }),
            profile: session.profile.as_ref().map(|p| SessionProfileRef {
                id: p.id.clone(),
                save_changes: p.save_changes,
            }),
        }
    }
}

/// What a create request refers to by id or name, unresolved.
struct References {
    extensions: Vec<String>,
    proxy_id: Option<String>,
    /// Profile id or name, and save_changes.
    profile: Option<(String, bool)>,
}

/// A valid request and the resources it refers to.
fn validate(request: CreateBrowserRequest) -> Result<(NewSession, References), ApiError> {
    let mut problems = Vec::new();
    let timeout_seconds = request.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if !(MIN_TIMEOUT_SECONDS..=MAX_TIMEOUT_SECONDS).contains(&timeout_seconds) {
        problems.push(ErrorDetail::invalid_input(format!(
            "timeout_seconds must be between {MIN_TIMEOUT_SECONDS} and {MAX_TIMEOUT_SECONDS}, got {timeout_seconds}"
        )));
    }
    let (width, height, refresh_rate) = match &request.viewport {
        Some(viewport) => (viewport.width, viewport.height, viewport.refresh_rate),
        None => (DEFAULT_VIEWPORT.0, DEFAULT_VIEWPORT.1, None),
    };
    for (field, value) in [("viewport.width", width), ("viewport.height", height)] {
        if !(MIN_VIEWPORT_SIDE..=MAX_VIEWPORT_SIDE).contains(&value) {
            problems.push(ErrorDetail::invalid_input(format!(
                "{field} must be between {MIN_VIEWPORT_SIDE} and {MAX_VIEWPORT_SIDE}, got {value}"
            )));
        }
    }
    if let Some(rate) = refresh_rate
        && !(1..=240).contains(&rate)
    {
        problems.push(ErrorDetail::invalid_input(format!(
            "viewport.refresh_rate must be between 1 and 240, got {rate}"
        )));
    }
    if let Some(persistence) = &request.persistence
        && (persistence.id.is_empty() || persistence.id.len() > MAX_PERSISTENT_ID_LENGTH)
    {
        problems.push(ErrorDetail::invalid_input(format!(
            "persistence.id must be 1 to {MAX_PERSISTENT_ID_LENGTH} characters"
        )));
    }
    if request.gpu == Some(true) {
        problems.push(ErrorDetail::invalid_input(
            "gpu: this server has no GPU browsers",
        ));
    }
    let mut extension_references = Vec::new();
    let requested = request.extensions.unwrap_or_default();
    if requested.len() > MAX_EXTENSIONS {
        problems.push(ErrorDetail::invalid_input(format!(
            "extensions: at most {MAX_EXTENSIONS} per browser"
        )));
    }
    for (index, reference) in requested.iter().enumerate() {
        match one_of(&reference.id, &reference.name) {
            Some(key) => extension_references.push(key.to_owned()),
            None => problems.push(ErrorDetail::invalid_input(format!(
                "extensions[{index}] must have exactly one of id or name"
            ))),
        }
    }
    let profile = match &request.profile {
        None => None,
        Some(reference) => match one_of(&reference.id, &reference.name) {
            Some(key) => Some((key.to_owned(), reference.save_changes.unwrap_or(false))),
            None => {
                problems.push(ErrorDetail::invalid_input(
                    "profile must have exactly one of id or name",
                ));
                None
            }
        },
    };
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    let new = NewSession {
        persistent_id: request.persistence.map(|p| p.id),
        headless: request.headless.unwrap_or(false),
        stealth: request.stealth.unwrap_or(false),
        kiosk_mode: request.kiosk_mode.unwrap_or(false),
        timeout_seconds,
        viewport_width: width,
        viewport_height: height,
        viewport_refresh_rate: refresh_rate,
        extensions: Vec::new(),
        proxy: None,
        pool_id: None,
        profile: None,
    };
    let references = References {
        extensions: extension_references,
        proxy_id: request.proxy_id,
        profile,
    };
    Ok((new, references))
}

/// A validated request with its library extensions and proxy resolved (400 when they
/// are not the organization's).
pub async fn new_session(
    state: &AppState,
    org_id: &str,
    request: CreateBrowserRequest,
) -> Result<NewSession, ApiError> {
    let (mut new, references) = validate(request)?;
    new.extensions = resolve_extensions(state, org_id, &references.extensions).await?;
    if let Some(proxy_id) = references.proxy_id {
        let route = resolve_proxy(state, org_id, &proxy_id).await?;
        new.proxy = Some((proxy_id, route));
    }
    if let Some((key, save_changes)) = references.profile {
        let profile = state.store.profile(org_id, &key).await?.ok_or_else(|| {
            ApiError::invalid_field(format!("profile: no profile {key:?} in this organization"))
        })?;
        let archive = state.profiles.launch_archive(&profile);
        new.profile = Some((
            SessionProfile {
                id: profile.id,
                save_changes,
            },
            archive,
        ));
    }
    Ok(new)
}

/// Where the organization's (not deleted) proxy sends traffic.
async fn resolve_proxy(
    state: &AppState,
    org_id: &str,
    proxy_id: &str,
) -> Result<ProxyRoute, ApiError> {
    let proxy =
        state.store.proxy(org_id, proxy_id).await?.ok_or_else(|| {
            ApiError::invalid_field(format!("proxy_id: proxy {proxy_id} not found"))
        })?;
    proxies::route_of(&proxy, &state.proxy_upstreams)
        .map_err(|reason| ApiError::invalid_field(format!("proxy_id: {reason}")))
}

/// Finds the referenced library extensions of the caller's organization.
async fn resolve_extensions(
    state: &AppState,
    org_id: &str,
    references: &[String],
) -> Result<Vec<LibraryExtension>, ApiError> {
    let mut resolved: Vec<LibraryExtension> = Vec::new();
    let mut problems = Vec::new();
    for (index, reference) in references.iter().enumerate() {
        let Some(record) = state.store.extension(org_id, reference).await? else {
            problems.push(ErrorDetail::invalid_input(format!(
                "extensions[{index}]: no extension {reference:?} in this organization"
            )));
            continue;
        };
        let Some(archive) = state.blobs.local_path(&record.blob_key) else {
            return Err(ApiError::Internal(anyhow::anyhow!(
                "the blob store is not local"
            )));
        };
        if resolved.iter().all(|known| known.id != record.id) {
            resolved.push(LibraryExtension {
                name: record.name.clone().unwrap_or_else(|| record.id.clone()),
                id: record.id,
                archive,
            });
        }
    }
    if problems.is_empty() {
        Ok(resolved)
    } else {
        Err(ApiError::invalid(problems))
    }
}

/// Create a browser session. Answers once Chromium's DevTools endpoint is ready.
#[utoipa::path(post, path = "/browsers", tag = "browsers", request_body = CreateBrowserRequest,
    security(("bearer" = [])),
    responses((status = 200, body = BrowserSession), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(request): JsonBody<CreateBrowserRequest>,
) -> Result<Json<BrowserSession>, ApiError> {
    let new = new_session(&state, &caller.org_id, request).await?;
    let session = state.sessions.create(&caller.org_id, new).await?;
    Ok(Json(BrowserSession::from_record(&state, &session)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `active` (default), `deleted` or `all`.
    pub status: Option<String>,
    /// Deprecated: same as `status=all`.
    pub include_deleted: Option<bool>,
    /// Default 20, maximum 100.
    pub limit: Option<u32>,
    pub offset: Option<u32>,
}

/// List the organization's browser sessions, newest first. Pages with `limit`/`offset`
/// and answers `X-Has-More` and, when there is more, `X-Next-Offset` (as the SDKs read
/// it: the next page starts at X-Next-Offset plus the number of items returned).
#[utoipa::path(get, path = "/browsers", tag = "browsers", params(ListQuery),
    security(("bearer" = [])),
    responses((status = 200, body = Vec<BrowserSession>), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let filter = match (query.status.as_deref(), query.include_deleted) {
        (Some("active") | None, Some(true)) | (Some("all"), _) => SessionFilter::All,
        (Some("active") | None, _) => SessionFilter::Live,
        (Some("deleted"), _) => SessionFilter::Ended,
        (Some(other), _) => {
            return Err(ApiError::invalid_field(format!(
                "status must be one of active, deleted, all; got {other:?}"
            )));
        }
    };
    let limit = super::list_limit(query.limit)?;
    let offset = query.offset.unwrap_or(0);
    let mut sessions = state
        .store
        .list_sessions(&caller.org_id, filter, limit + 1, offset)
        .await?;
    let has_more = sessions.len() > limit as usize;
    sessions.truncate(limit as usize);
    let headers = super::page_headers(offset, has_more);
    let body: Vec<BrowserSession> = sessions
        .iter()
        .map(|s| BrowserSession::from_record(&state, s))
        .collect();
    Ok((headers, Json(body)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetrieveQuery {
    /// Also answer a session that has ended (with `deleted_at`).
    pub include_deleted: Option<bool>,
}

/// Get a browser session.
#[utoipa::path(get, path = "/browsers/{id}", tag = "browsers",
    params(("id" = String, Path, description = "Browser session ID"), RetrieveQuery),
    security(("bearer" = [])),
    responses((status = 200, body = BrowserSession), (status = 404, body = ErrorBody)))]
pub async fn retrieve(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<RetrieveQuery>,
) -> Result<Json<BrowserSession>, ApiError> {
    let session = if query.include_deleted == Some(true) {
        state
            .store
            .session(&caller.org_id, &id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("browser session {id} not found")))?
    } else {
        state.sessions.live(&caller.org_id, &id).await?
    };
    Ok(Json(BrowserSession::from_record(&state, &session)))
}

/// Delete a browser session: Chromium, its display and its agent are stopped and reaped
/// before the answer.
#[utoipa::path(delete, path = "/browsers/{id}", tag = "browsers",
    params(("id" = String, Path, description = "Browser session ID")),
    security(("bearer" = [])),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    let session = state.sessions.live(&caller.org_id, &id).await?;
    end_requested(&state, &session).await
}

async fn end_requested(state: &AppState, session: &SessionRecord) -> Result<StatusCode, ApiError> {
    // In a task of its own: a client that disconnects must not cut the end short (the
    // session would be marked ended with its browser still running).
    let (sessions, ending) = (state.sessions.clone(), session.clone());
    let ended = tokio::spawn(async move { sessions.end(&ending, "deleted by the API").await })
        .await
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("end task failed: {error}")))??;
    if ended {
        Ok(StatusCode::NO_CONTENT)
    } else {
        // Ended concurrently (another delete or the inactivity timeout).
        Err(ApiError::NotFound(format!(
            "browser session {} not found",
            session.id
        )))
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeletePersistentQuery {
    /// The `persistence.id` the session was created with.
    pub persistent_id: Option<String>,
}

/// Deprecated (use `DELETE /browsers/{id}`): delete the live session that has this
/// persistent id. Answers a `Deprecation` header.
#[utoipa::path(delete, path = "/browsers", tag = "browsers", params(DeletePersistentQuery),
    security(("bearer" = [])),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[deprecated]
pub async fn delete_by_persistent_id(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<DeletePersistentQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let deprecation = [
        ("deprecation", "true"),
        ("link", "</browsers/{id}>; rel=\"successor-version\""),
    ];
    let persistent_id = query
        .persistent_id
        .filter(|id| !id.is_empty())
        .ok_or_else(|| ApiError::invalid_field("persistent_id: the query parameter is required"))?;
    let result = async {
        let session = state
            .store
            .live_session_by_persistent_id(&caller.org_id, &persistent_id)
            .await?
            .filter(|s| s.status != SessionStatus::Ended)
            .ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no live browser session with persistent id {persistent_id}"
                ))
            })?;
        end_requested(&state, &session).await
    }
    .await;
    Ok((deprecation, result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_sdk_documentation() {
        let (new, _) = validate(CreateBrowserRequest::default()).expect("defaults are valid");
        assert_eq!(new.timeout_seconds, 60);
        assert_eq!((new.viewport_width, new.viewport_height), (1920, 1080));
        assert!(!new.headless);
    }

    #[test]
    fn every_invalid_field_is_reported() {
        let request = CreateBrowserRequest {
            timeout_seconds: Some(5),
            viewport: Some(ViewportRequest {
                width: 0,
                height: 99_999,
                refresh_rate: None,
            }),
            ..Default::default()
        };
        let Err(ApiError::BadRequest { details, .. }) = validate(request) else {
            panic!("expected a validation error");
        };
        let messages: Vec<_> = details.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[0].starts_with("timeout_seconds"));
        assert!(messages[1].starts_with("viewport.width"));
        assert!(messages[2].starts_with("viewport.height"));
    }
}
