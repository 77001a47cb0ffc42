//! Browser sessions: `POST/GET/DELETE /browsers`, `GET/DELETE /browsers/{id}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, PathParam, QueryParams};
use super::org::Org;
use super::state::AppState;
use crate::egress::HostAllowlist;
use crate::sessions::{
    BrowserConfig, NetworkConfig, ProfileReference, ResourceReference, Viewport,
};
use crate::store::{SessionFilter, SessionRecord, SessionStatus};

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
    pub viewport: Option<Viewport>,
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
    /// `allowed_hosts`: the only destinations the browser may reach.
    pub network: Option<NetworkConfig>,
    /// `1GiB` … `16GiB` (default 1GiB headless, 8GiB headful): the browser's session
    /// ends, with a reason, when its VM uses more.
    pub memory: Option<String>,
    /// Chromium enterprise policies for this browser (e.g. `URLBlocklist`); policies for
    /// proxies, extensions and DevTools are this server's.
    #[schema(value_type = Option<Object>)]
    pub chrome_policy: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Persistence {
    pub id: String,
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
    /// Omitted when the session has no network configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub chrome_policy: Option<serde_json::Map<String, serde_json::Value>>,
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
        let token = state.tokens.issue_cdp(
            &session.id,
            &session.org_id,
            session.pool_lease_id.as_deref(),
        );
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
            network: session
                .vm_settings
                .allowed_hosts
                .clone()
                .map(|allowed_hosts| NetworkConfig {
                    allowed_hosts: Some(allowed_hosts),
                    ..Default::default()
                }),
            memory: session.vm_settings.memory.clone(),
            chrome_policy: session.vm_settings.chrome_policy.clone(),
        }
    }
}

impl CreateBrowserRequest {
    /// The browser's configuration, and the problems of the fields only this route has.
    fn into_config(self) -> (BrowserConfig, Option<String>, Vec<String>) {
        let mut problems = Vec::new();
        if self.gpu == Some(true) {
            problems.push("gpu: this server has no GPU browsers".into());
        }
        let config = BrowserConfig {
            headless: self.headless,
            stealth: self.stealth,
            kiosk_mode: self.kiosk_mode,
            timeout_seconds: self.timeout_seconds,
            viewport: self.viewport,
            extensions: self.extensions,
            proxy_id: self.proxy_id,
            profile: self.profile,
            network: self.network,
            memory: self.memory,
            chrome_policy: self.chrome_policy,
        };
        (config, self.persistence.map(|p| p.id), problems)
    }
}

/// Create a browser session. Answers once Chromium's DevTools endpoint is ready.
#[utoipa::path(post, path = "/browsers", tag = "browsers", request_body = CreateBrowserRequest,
    security(("bearer" = [])),
    responses((status = 200, body = BrowserSession), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn create(
    org: Org,
    JsonBody(request): JsonBody<CreateBrowserRequest>,
) -> Result<Json<BrowserSession>, ApiError> {
    let (config, persistent_id, problems) = request.into_config();
    let spec = org
        .sessions
        .spec(&org.id, &config, persistent_id.as_deref(), problems)
        .await?;
    let session = org.sessions.create(&org.id, spec).await?;
    Ok(Json(BrowserSession::from_record(&org, &session)))
}

/// Unknown parameters (today's SDK's `tags[…]`, say) are refused: a filter this server
/// does not apply must not look applied.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Not supported by this server (a 400 says so).
    pub query: Option<String>,
    /// `active` (default), `deleted` or `all`.
    pub status: Option<String>,
    /// Deprecated: same as `status=all`.
    pub include_deleted: Option<bool>,
    /// Default 20, maximum 100.
    pub limit: Option<u32>,
    pub offset: Option<u32>,
}

/// List the organization's browser sessions, newest first. Pages with `limit`/`offset`
/// and answers `X-Has-More` and `X-Next-Offset` in the convention of the calling SDK's
/// generation (`api::paging`).
#[utoipa::path(get, path = "/browsers", tag = "browsers", params(ListQuery),
    security(("bearer" = [])),
    responses((status = 200, body = Vec<BrowserSession>), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody)))]
pub async fn list(
    org: Org,
    paging: super::paging::Paging,
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
    if query.query.is_some() {
        return Err(ApiError::invalid_field(
            "query: searching browsers is not supported by this server",
        ));
    }
    let limit = super::list_limit(query.limit)?;
    let offset = query.offset.unwrap_or(0);
    let mut sessions = org
        .store
        .list_sessions(&org.id, filter, limit + 1, offset)
        .await?;
    let has_more = sessions.len() > limit as usize;
    sessions.truncate(limit as usize);
    let headers = super::page_headers(paging, offset, sessions.len(), has_more);
    let body: Vec<BrowserSession> = sessions
        .iter()
        .map(|s| BrowserSession::from_record(&org, s))
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
    org: Org,
    PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<RetrieveQuery>,
) -> Result<Json<BrowserSession>, ApiError> {
    let session = if query.include_deleted == Some(true) {
        org.session(&id).await?
    } else {
        org.sessions.live(&org.id, &id).await?
    };
    Ok(Json(BrowserSession::from_record(&org, &session)))
}

/// Fields of `PATCH /browsers/{id}`. This server changes only the network allowlist of a
/// running browser; other fields are refused by name.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateBrowserRequest {
    pub network: Option<NetworkUpdate>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkUpdate {
    /// Replaces the browser's allowlist (same entries as on create); `null` removes it.
    /// A browser created without one cannot be given one.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<String>>)]
    pub allowed_hosts: Option<Option<Vec<String>>>,
    /// Not supported by this server (a 400 names it).
    pub expected_allowlist_revision: Option<String>,
}

/// A field that is present, `null` or not: `Some(None)` for `null`.
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// Update a running browser: replace or remove its `network.allowed_hosts`. New requests
/// follow the new list at once; open connections to hosts it no longer allows are closed.
#[utoipa::path(patch, path = "/browsers/{id}", tag = "browsers", request_body = UpdateBrowserRequest,
    params(("id" = String, Path, description = "Browser session ID")),
    security(("bearer" = [])),
    responses((status = 200, body = BrowserSession), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn update(
    org: Org,
    PathParam(id): PathParam<String>,
    JsonBody(request): JsonBody<UpdateBrowserRequest>,
) -> Result<Json<BrowserSession>, ApiError> {
    let session = org.sessions.live(&org.id, &id).await?;
    let Some(network) = request.network else {
        return Ok(Json(BrowserSession::from_record(&org, &session)));
    };
    if network.expected_allowlist_revision.is_some() {
        return Err(ApiError::invalid_field(
            "network.expected_allowlist_revision is not supported by this server",
        ));
    }
    let Some(allowed_hosts) = network.allowed_hosts else {
        return Ok(Json(BrowserSession::from_record(&org, &session)));
    };
    let allowed_hosts = allowed_hosts
        .as_deref()
        .map(HostAllowlist::parse)
        .transpose()
        .map_err(|problem| ApiError::invalid_field(format!("network.{problem}")))?;
    let session = org
        .sessions
        .set_allowed_hosts(&session, allowed_hosts)
        .await?;
    Ok(Json(BrowserSession::from_record(&org, &session)))
}

/// Delete a browser session: Chromium, its display and its agent are stopped and reaped
/// before the answer.
#[utoipa::path(delete, path = "/browsers/{id}", tag = "browsers",
    params(("id" = String, Path, description = "Browser session ID")),
    security(("bearer" = [])),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn delete(org: Org, PathParam(id): PathParam<String>) -> Result<StatusCode, ApiError> {
    let session = org.sessions.live(&org.id, &id).await?;
    end_requested(&org, &session).await
}

async fn end_requested(state: &AppState, session: &SessionRecord) -> Result<StatusCode, ApiError> {
    if state.sessions.end(session, "deleted by the API").await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        // Ended concurrently (another delete or the inactivity timeout).
        Err(ApiError::not_found("browser session", &session.id))
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
    org: Org,
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
        let session = org
            .store
            .live_session_by_persistent_id(&org.id, &persistent_id)
            .await?
            .filter(|s| s.status != SessionStatus::Ended)
            .ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no live browser session with persistent id {persistent_id}"
                ))
            })?;
        end_requested(&org, &session).await
    }
    .await;
    Ok((deprecation, result))
}
