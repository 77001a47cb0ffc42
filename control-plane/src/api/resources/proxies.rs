//! Proxies (seed 4.9): `/proxies`. Browsers created with a `proxy_id` send all their
//! traffic through it. Passwords are stored and used, never returned.

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody, ErrorDetail, OrNotFound};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::{NamedListQuery, Paging};
use crate::api::state::AppState;
use crate::egress::EgressError;
use crate::ids;
use crate::profiles;
use crate::proxies::{self, TYPES};
use crate::store::{ProxyCheck, ProxyRecord};

const MAX_BYPASS_HOSTS: usize = 100;
const MAX_HOST_BYTES: usize = 253;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProxyRequest {
    /// datacenter, isp, residential, mobile or custom.
    #[serde(rename = "type")]
    #[schema(schema_with = crate::api::openapi::proxy_type)]
    pub kind: String,
    #[schema(schema_with = crate::api::openapi::optional_display_name)]
    pub name: Option<String>,
    /// Only `http` (the default): the browser speaks plain HTTP proxy protocol to it.
    #[schema(pattern = "^http$")]
    pub protocol: Option<String>,
    /// Hosts that go direct, bypassing the proxy (Chromium bypass-list syntax).
    #[schema(schema_with = crate::api::openapi::bypass_hosts)]
    pub bypass_hosts: Option<Vec<String>>,
    /// custom: `{host, port, username?, password?}`; other types: `{country?, …}`.
    #[schema(value_type = Option<Object>)]
    pub config: Option<Map<String, Value>>,
}

/// A proxy as the SDKs read it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Proxy {
    pub id: String,
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub protocol: String,
    pub bypass_hosts: Vec<String>,
    /// custom: `{host, port, username, has_password}`; never the password.
    #[schema(value_type = Object)]
    pub config: Value,
    /// `available` or `unavailable` after a check; null before the first.
    pub status: Option<String>,
    pub last_checked: Option<DateTime<Utc>>,
    pub ip_address: Option<String>,
    /// Why the last check failed.
    pub check_error: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl From<ProxyRecord> for Proxy {
    fn from(record: ProxyRecord) -> Self {
        let config = if record.kind == "custom" {
            let field = |key: &str| record.config.get(key).cloned().unwrap_or(Value::Null);
            serde_json::json!({
                "host": field("host"),
                "port": field("port"),
                "username": field("username"),
                "has_password": record.config.get("password").is_some_and(|p| !p.is_null()),
            })
        } else {
            record.config.clone()
        };
        Self {
            id: record.id,
            name: record.name,
            kind: record.kind,
            protocol: record.protocol,
            bypass_hosts: record.bypass_hosts,
            config,
            status: record.status,
            last_checked: record.last_checked,
            ip_address: record.ip_address,
            check_error: record.check_error,
            created_at: record.created_at,
        }
    }
}

fn validate(state: &AppState, request: &CreateProxyRequest) -> Vec<ErrorDetail> {
    let mut problems = Vec::new();
    let mut problem = |message: String| problems.push(ErrorDetail::invalid_input(message));
    if !TYPES.contains(&request.kind.as_str()) {
        problem(format!("type must be one of {}, got {:?}", TYPES.join(", "), request.kind));
    } else if !state.proxy_upstreams.serves(&request.kind) {
        problem(format!("type: {}", proxies::not_configured(&request.kind)));
    }
    // Named like profiles.
    if let Some(name_problem) = request.name.as_deref().and_then(profiles::name_problem) {
        problem(name_problem);
    }
    match request.protocol.as_deref() {
        None | Some("http") => {}
        Some("https") => problem("protocol: https proxies are not supported; use http".into()),
        Some(other) => problem(format!("protocol must be http, got {other:?}")),
    }
    let bypass_hosts = request.bypass_hosts.as_deref().unwrap_or_default();
    if bypass_hosts.len() > MAX_BYPASS_HOSTS {
        problem(format!("bypass_hosts: at most {MAX_BYPASS_HOSTS}"));
    }
    for (index, host) in bypass_hosts.iter().enumerate() {
        // One entry of Chromium's `;`-separated bypass list each.
        if host.is_empty()
            || host.len() > MAX_HOST_BYTES
            || host.starts_with('-')
            || host.contains([';', ' ', ','])
            || host.chars().any(char::is_control)
        {
            problem(format!(
                "bypass_hosts[{index}] must be a host pattern without spaces, commas or semicolons"
            ));
        }
    }
    let config = request.config.clone().unwrap_or_default();
    if request.kind == "custom" {
        match config.get("host").and_then(Value::as_str) {
            Some(host)
                if !host.is_empty()
                    && host.len() <= MAX_HOST_BYTES
                    && !host.starts_with('-')
                    && !host.contains(['/', '@', ' '])
                    && !host.chars().any(char::is_control) => {}
            _ => problem("config.host is required: a host name or IP address".into()),
        }
        match config.get("port").and_then(Value::as_u64) {
            Some(port) if (1..=65535).contains(&port) => {}
            _ => problem("config.port is required: 1 to 65535".into()),
        }
        for key in ["username", "password"] {
            match config.get(key) {
                None => {}
                Some(Value::String(text)) if !text.chars().any(char::is_control) => {}
                Some(_) => {
                    problem(format!("config.{key} must be a string without control characters"))
                }
            }
        }
        for key in config.keys() {
            if !["host", "port", "username", "password"].contains(&key.as_str()) {
                problem(format!("config.{key}: unknown field for a custom proxy"));
            }
        }
    } else if let Some(country) = config.get("country")
        && !country
            .as_str()
            .is_some_and(|c| c.len() == 2 && c.bytes().all(|b| b.is_ascii_alphabetic()))
    {
        problem("config.country must be an ISO 3166 two-letter code".into());
    }
    problems
}

/// Create a proxy.
#[utoipa::path(post, path = "/proxies", request_body = CreateProxyRequest,
    responses((status = 200, body = Proxy),
        (status = 403, description = "The operator's egress policy forbids the proxy's host", body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateProxyRequest>,
) -> Result<Json<Proxy>, ApiError> {
    let problems = validate(&org, &request);
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    let record = ProxyRecord {
        id: ids::new_id("proxy"),
        org_id: org.id.clone(),
        name: request.name,
        kind: request.kind,
        protocol: request.protocol.unwrap_or_else(|| "http".into()),
        bypass_hosts: request.bypass_hosts.unwrap_or_default(),
        config: Value::Object(request.config.unwrap_or_default()),
        status: None,
        last_checked: None,
        ip_address: None,
        check_error: None,
        created_at: Utc::now(),
    };
    // A host inside this host's networks is refused now; one that does not resolve yet is
    // judged again whenever a browser or a check uses the proxy.
    if record.kind == "custom"
        && let Ok(route) = proxies::route_of(&record, &org.proxy_upstreams)
        && let Err(EgressError::Refused(why)) = org.egress.resolve(&route.address).await
    {
        // The operator's egress policy forbids it: well-formed, but not allowed here.
        return Err(ApiError::Forbidden(format!("config.host: {why}")));
    }
    org.store.insert_proxy(&record).await?;
    Ok(Json(record.into()))
}

/// The organization's proxies, oldest first (deleted ones are gone), paged with
/// `limit`/`offset`.
#[utoipa::path(get, path = "/proxies", params(NamedListQuery),
    responses((status = 200, body = Vec<Proxy>)))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<NamedListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let records = org.store.list_proxies(&org.id).await?;
    let (headers, page) = query.page_or_all(paging, records, |p| (&p.id, p.name.as_deref()))?;
    let body: Vec<Proxy> = page.into_iter().map(Into::into).collect();
    Ok((headers, Json(body)))
}

async fn find(org: &Org, id: &str) -> Result<ProxyRecord, ApiError> {
    let found = org.store.proxy(&org.id, id).await?;
    found.or_not_found("proxy", id)
}

/// A proxy by id, or by a name exactly one proxy has (409 when several do).
#[utoipa::path(get, path = "/proxies/{id}",
    responses((status = 200, body = Proxy), (status = 409, body = ErrorBody)))]
pub async fn retrieve(org: Org, PathParam(id): PathParam<String>) -> Result<Json<Proxy>, ApiError> {
    Ok(Json(find(&org, &id).await?.into()))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProxyRequest {
    /// The new name (1 to 255 characters without control characters).
    #[schema(schema_with = crate::api::openapi::display_name)]
    pub name: String,
}

/// Rename a proxy. Sessions using it keep using it.
#[utoipa::path(patch, path = "/proxies/{id}", request_body = UpdateProxyRequest,
    responses((status = 200, body = Proxy), (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<UpdateProxyRequest>,
) -> Result<Json<Proxy>, ApiError> {
    if let Some(problem) = profiles::name_problem(&request.name) {
        return Err(ApiError::invalid_field(problem));
    }
    let proxy = find(&org, &id).await?;
    if !org.store.rename_proxy(&org.id, &proxy.id, &request.name).await? {
        return Err(ApiError::not_found("proxy", &id));
    }
    Ok(Json(find(&org, &proxy.id).await?.into()))
}

/// Delete a proxy (seed 4.9). Soft: sessions that use it keep their `proxy_id` and their
/// route until they end; new sessions and pools cannot reference it.
#[utoipa::path(delete, path = "/proxies/{id}", responses((status = 204)))]
pub async fn delete(org: Org, PathParam(id): PathParam<String>) -> Result<StatusCode, ApiError> {
    let proxy = find(&org, &id).await?;
    if org.store.delete_proxy(&org.id, &proxy.id, Utc::now()).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("proxy", &id))
    }
}

/// Fetch the server's check URL through the proxy; answers the proxy with its fresh
/// `status` and `last_checked`, and `check_error` when the request failed.
#[utoipa::path(post, path = "/proxies/{id}/check", responses((status = 200, body = Proxy)))]
pub async fn check(org: Org, PathParam(id): PathParam<String>) -> Result<Json<Proxy>, ApiError> {
    let mut record = find(&org, &id).await?;
    let outcome = match proxies::connectable_route(&record, &org.proxy_upstreams, &org.egress).await
    {
        Ok(route) => proxies::check(&route, &org.settings.proxy_check_url).await,
        Err(reason) => Err(reason),
    };
    let result = ProxyCheck {
        status: if outcome.is_ok() { "available" } else { "unavailable" }.into(),
        at: Utc::now(),
        ip_address: None,
        error: outcome.err(),
    };
    org.store.record_proxy_check(&record.id, &result).await?;
    record.status = Some(result.status);
    record.last_checked = Some(result.at);
    record.check_error = result.error;
    Ok(Json(record.into()))
}
