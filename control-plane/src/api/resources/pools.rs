//! Browser pools (seed 4.10): `/browser_pools`. The mechanics (filling, leasing,
//! resetting) are in `crate::pools`; this module is the HTTP surface and validation.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::telemetry::settings::TelemetryRequest;
use axum::Json;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::{IntoParams, ToSchema};

use crate::api::browsers::{BrowserSession, PoolRef, browser_view, label_problems, unsupported};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams, parse};
use crate::api::org::Org;
use crate::api::paging::list_query;
use crate::api::paging::{NamedListQuery, Paging};
use crate::egress::HostAllowlist;
use crate::pools::{PoolChanges, PoolView};
use crate::sessions::labels;
use crate::sessions::update::name_taken;
use crate::sessions::{BrowserConfig, DEFAULT_VIEWPORT, SessionUpdate};
use crate::store::SessionStatus;

pub const MAX_ACQUIRE_TIMEOUT_SECONDS: i64 = 300;

/// Fields of `POST /browser_pools` and `PATCH /browser_pools/{id_or_name}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolRequest {
    /// Browsers kept in the pool (idle + leased), 1 to 100. Required on create.
    #[schema(minimum = 1, maximum = 100)]
    pub size: Option<i64>,
    /// Unique in the organization, `^[A-Za-z0-9._-]{1,255}$`.
    #[schema(schema_with = crate::api::openapi::resource_name)]
    pub name: Option<String>,
    /// Percent of `size` launched per minute while filling (at least one browser a
    /// minute), 1 to 10000. Default 10.
    #[schema(minimum = 1, maximum = 10000)]
    pub fill_rate_per_minute: Option<i64>,
    /// Inactivity timeout of acquired browsers, 10 to 259200 s. Default 600.
    #[schema(minimum = 10, maximum = 259200)]
    pub timeout_seconds: Option<i64>,
    pub headless: Option<bool>,
    pub stealth: Option<bool>,
    pub kiosk_mode: Option<bool>,
    #[schema(value_type = Option<crate::sessions::Viewport>)]
    pub viewport: Option<Value>,
    #[schema(value_type = Option<Vec<crate::sessions::ResourceReference>>)]
    pub extensions: Option<Value>,
    pub proxy_id: Option<String>,
    #[schema(value_type = Option<crate::sessions::ProfileReference>)]
    pub profile: Option<Value>,
    /// As on `POST /browsers`: `allowed_hosts` of every browser of the pool.
    #[schema(value_type = Option<crate::sessions::NetworkConfig>)]
    pub network: Option<Value>,
    pub memory: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub chrome_policy: Option<Value>,
    /// Opened by every browser of the pool when it starts and after each reset.
    #[schema(schema_with = crate::api::openapi::http_url)]
    pub start_url: Option<String>,
    /// The server's own region (`--region`) or omitted; others are refused.
    pub region: Option<String>,
    /// Only `false`: idle browsers are not refreshed when their profile changes (a 400
    /// says so for `true`).
    #[schema(schema_with = crate::api::openapi::only_false)]
    pub refresh_on_profile_update: Option<bool>,
    /// The telemetry of the pool's browsers (as on create).
    pub telemetry: Option<TelemetryRequest>,
    /// PATCH only: replace the idle browsers now with ones of the new configuration.
    pub discard_all_idle: Option<bool>,
}

/// A browser pool as the SDKs read it.
#[derive(Debug, Serialize, ToSchema)]
pub struct BrowserPool {
    pub id: String,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    /// Browsers leased now.
    pub acquired_count: i64,
    /// Idle browsers ready to be acquired.
    pub available_count: i64,
    /// The server's region (`--region`).
    pub region: String,
    /// The library extensions the pool's browsers load, by id.
    pub extension_ids: Vec<String>,
    /// The profile the pool's browsers start from, by id.
    pub profile_id: Option<String>,
    /// The pool's configuration as given, with the defaults of what was not.
    #[schema(value_type = Object)]
    pub browser_pool_config: Value,
    /// The telemetry the pool's browsers start with, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub telemetry: Option<Value>,
}

/// The pool as the SDKs read it: its references resolved to ids (a reference whose target
/// has since been deleted is left out).
async fn pool_answer(org: &Org, view: PoolView) -> Result<BrowserPool, ApiError> {
    let browser = &view.config.browser;
    let mut extension_ids = Vec::new();
    for reference in browser.extensions.iter().flatten() {
        if let Some(key) = reference.key()
            && let Some(extension) = org.store.extension(&org.id, key).await?
        {
            extension_ids.push(extension.id);
        }
    }
    let profile_id = match browser.profile.as_ref().and_then(|p| p.id.as_ref().or(p.name.as_ref()))
    {
        Some(key) => org.store.profile(&org.id, key).await?.map(|p| p.id),
        None => None,
    };
    // The stored configuration serializes as it was given; the defaults fill the rest.
    let mut config = serde_json::to_value(&view.config).unwrap_or_default();
    let headless = browser.headless.unwrap_or(false);
    let defaults = json!({
        "headless": headless,
        "stealth": false,
        "kiosk_mode": false,
        "memory": if headless { "1GiB" } else { "8GiB" },
        "viewport": {"width": DEFAULT_VIEWPORT.0, "height": DEFAULT_VIEWPORT.1},
        "extensions": [],
    });
    if let (Some(config), Value::Object(defaults)) = (config.as_object_mut(), defaults) {
        for (key, value) in defaults {
            config.entry(key).or_insert(value);
        }
    }
    let telemetry = crate::telemetry::settings::on_create(browser.telemetry.as_ref())
        .ok()
        .and_then(|resolved| resolved.settings)
        .map(|settings| settings.view());
    Ok(BrowserPool {
        telemetry,
        browser_pool_config: config,
        acquired_count: view.acquired_count,
        available_count: view.available_count,
        region: org.settings.region.clone(),
        extension_ids,
        profile_id,
        id: view.record.id,
        name: view.record.name,
        created_at: view.record.created_at,
    })
}

impl PoolRequest {
    /// What the request sets. The browsers' fields are read as a create would read them.
    fn into_changes(self, region: &str) -> Result<(PoolChanges, Option<bool>), ApiError> {
        let mut problems = unsupported(&[(
            "refresh_on_profile_update",
            self.refresh_on_profile_update == Some(true),
        )]);
        if let Some(asked) = self.region.as_deref().filter(|asked| *asked != region) {
            problems.push(format!("region: this server serves {region:?} only, not {asked:?}"));
        }
        if !problems.is_empty() {
            return Err(ApiError::invalid_fields(problems));
        }
        let mut browser = Map::new();
        let mut set = |key: &str, value: Option<Value>| {
            if let Some(value) = value.filter(|v| !v.is_null()) {
                browser.insert(key.to_owned(), value);
            }
        };
        set("timeout_seconds", self.timeout_seconds.map(Value::from));
        set("headless", self.headless.map(Value::from));
        set("stealth", self.stealth.map(Value::from));
        set("kiosk_mode", self.kiosk_mode.map(Value::from));
        set("viewport", self.viewport);
        set("extensions", self.extensions);
        set("proxy_id", self.proxy_id.map(Value::from));
        set("profile", self.profile);
        set("network", self.network);
        set("memory", self.memory.map(Value::from));
        set("chrome_policy", self.chrome_policy);
        set("start_url", self.start_url.map(Value::from));
        set("telemetry", self.telemetry.and_then(|t| serde_json::to_value(t).ok()));
        // serde reads an array as a struct's fields in order: the object-shaped settings
        // must be objects.
        for key in ["viewport", "profile", "network", "chrome_policy", "telemetry"] {
            if browser.get(key).is_some_and(|value| !value.is_object()) {
                return Err(ApiError::invalid_field(format!("{key} must be an object")));
            }
        }
        let browser: BrowserConfig = serde_path_to_error::deserialize(Value::Object(browser))
            .map_err(|error| {
                ApiError::invalid_field(format!("{}: {}", error.path(), error.inner()))
            })?;
        let changes = PoolChanges {
            size: self.size,
            name: self.name,
            fill_rate_per_minute: self.fill_rate_per_minute,
            browser,
        };
        Ok((changes, self.discard_all_idle))
    }
}

/// Create a pool; the reconciler starts filling it at once.
#[utoipa::path(post, path = "/browser_pools", request_body = PoolRequest,
    responses((status = 200, body = BrowserPool),
        (status = 404, description = "A referenced profile, proxy or extension does not exist", body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<PoolRequest>,
) -> Result<Json<BrowserPool>, ApiError> {
    let (changes, discard_all_idle) = request.into_changes(&org.settings.region)?;
    org.require(&crate::sessions::referenced(&changes.browser)).await?;
    if discard_all_idle.is_some() {
        return Err(ApiError::invalid_field("discard_all_idle: only for updating a pool"));
    }
    let pool = org.pools.create(&org.id, changes).await?;
    Ok(Json(pool_answer(&org, pool).await?))
}

list_query! {
    /// `GET /browser_pools`' parameters: those of every named list, and `region`.
    pub struct PoolListQuery {
        /// Only pools whose name or id contains this text (case-insensitive).
        pub query: Option<String>,
        /// Only the pool with this name (case-insensitive).
        pub name: Option<String>,
        /// Only pools of this region (every pool is in the server's `--region`).
        pub region: Option<String>,
    }
}

/// The organization's pools, oldest first, paged with `limit`/`offset`.
#[utoipa::path(get, path = "/browser_pools", params(PoolListQuery),
    responses((status = 200, body = Vec<BrowserPool>)))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<PoolListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let mut pools = org.pools.list(&org.id).await?;
    if query.region.as_deref().is_some_and(|region| region != org.settings.region) {
        pools.clear();
    }
    let named = NamedListQuery {
        query: query.query,
        name: query.name,
        limit: query.limit,
        offset: query.offset,
    };
    let (headers, page) =
        named.page_or_all(paging, pools, |p| (&p.record.id, p.record.name.as_deref()))?;
    let mut body = Vec::with_capacity(page.len());
    for pool in page {
        body.push(pool_answer(&org, pool).await?);
    }
    Ok((headers, Json(body)))
}

#[utoipa::path(get, path = "/browser_pools/{id_or_name}",
    responses((status = 200, body = BrowserPool)))]
pub async fn retrieve(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<Json<BrowserPool>, ApiError> {
    let pool = org.pools.get(&org.id, &id_or_name).await?;
    Ok(Json(pool_answer(&org, pool).await?))
}

/// Change a pool's size and browser configuration. Idle browsers keep the old
/// configuration unless `discard_all_idle` replaces them now.
#[utoipa::path(patch, path = "/browser_pools/{id_or_name}", request_body = PoolRequest,
    responses((status = 200, body = BrowserPool), (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id_or_name): PathParam<String>, JsonBody(request): JsonBody<PoolRequest>,
) -> Result<Json<BrowserPool>, ApiError> {
    let (changes, discard_all_idle) = request.into_changes(&org.settings.region)?;
    org.require(&crate::sessions::referenced(&changes.browser)).await?;
    let pool =
        org.pools.update(&org.id, &id_or_name, changes, discard_all_idle.unwrap_or(false)).await?;
    Ok(Json(pool_answer(&org, pool).await?))
}

#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeletePoolParams {
    /// End leased browsers too (otherwise a pool with leased browsers is a 409).
    pub force: Option<bool>,
}

/// Delete a pool and its browsers. Refused (409) while browsers are leased, unless
/// `force` (in the JSON body, as the SDKs send it, or the query) ends them too.
#[utoipa::path(delete, path = "/browser_pools/{id_or_name}", params(DeletePoolParams),
    request_body(content = Option<DeletePoolParams>, description = "`force`, as the SDKs send it"),
    responses((status = 204), (status = 409, body = ErrorBody)))]
pub async fn delete(
    org: Org, PathParam(id_or_name): PathParam<String>,
    QueryParams(query): QueryParams<DeletePoolParams>, body: Bytes,
) -> Result<StatusCode, ApiError> {
    let from_body: DeletePoolParams = if body.iter().all(u8::is_ascii_whitespace) {
        DeletePoolParams::default()
    } else {
        parse::<Option<DeletePoolParams>>(&body)?.unwrap_or_default()
    };
    let force = from_body.force.or(query.force).unwrap_or(false);
    org.pools.delete(&org.id, &id_or_name, force).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// Seconds to wait for an idle browser, 0 to 300. Default: the time the pool takes
    /// to fill at its fill rate, at most 30.
    #[schema(minimum = 0, maximum = 300)]
    pub acquire_timeout_seconds: Option<i64>,
    /// The leased browser's name while the lease lasts (unique among live sessions).
    #[schema(schema_with = crate::api::openapi::session_name)]
    pub name: Option<String>,
    /// The leased browser's tags while the lease lasts.
    #[schema(schema_with = crate::api::openapi::tags)]
    pub tags: Option<BTreeMap<String, String>>,
    /// Opened in the leased browser before the answer (best effort); must be allowed by
    /// the pool's `network`.
    #[schema(schema_with = crate::api::openapi::http_url)]
    pub start_url: Option<String>,
    /// Not supported by this server (a 400 names it).
    #[schema(value_type = Option<Object>)]
    pub profile: Option<serde_json::Value>,
    /// Merged onto the pool's telemetry for this lease (as an update would).
    pub telemetry: Option<TelemetryRequest>,
}

/// Lease an idle browser of the pool, waiting for one up to `acquire_timeout_seconds`.
/// When none became available: 204 No Content, as both SDK generations document it
/// (today's returns `None`).
#[utoipa::path(post, path = "/browser_pools/{id_or_name}/acquire", request_body = AcquireRequest,
    responses((status = 200, body = BrowserSession),
        (status = 204, description = "no browser became available in time")))]
pub async fn acquire(
    org: Org, PathParam(id_or_name): PathParam<String>, JsonBody(request): JsonBody<AcquireRequest>,
) -> Result<Response, ApiError> {
    let requested = match request.acquire_timeout_seconds {
        Some(seconds) if (0..=MAX_ACQUIRE_TIMEOUT_SECONDS).contains(&seconds) => {
            Some(Duration::from_secs(seconds as u64))
        }
        Some(seconds) => {
            return Err(ApiError::invalid_field(format!(
                "acquire_timeout_seconds must be between 0 and {MAX_ACQUIRE_TIMEOUT_SECONDS}, got {seconds}"
            )));
        }
        None => None,
    };
    let mut problems = unsupported(&[("profile", request.profile.is_some())]);
    problems.extend(label_problems(request.name.as_deref(), request.tags.as_ref()));
    if let Some(url) = &request.start_url {
        // Checked against the pool's allowlist, which its browsers have when idle.
        let pool = org.pools.get(&org.id, &id_or_name).await?;
        let allowed = pool
            .config
            .browser
            .network
            .and_then(|network| network.allowed_hosts)
            .as_deref()
            .map(HostAllowlist::parse)
            .and_then(Result::ok);
        problems.extend(labels::start_url_problem(url, allowed.as_ref()));
    }
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    if let Some(name) = &request.name
        && let Some(taken) = org.store.session(&org.id, name).await?
        && taken.status != SessionStatus::Ended
    {
        return Err(name_taken(name).into());
    }
    let (pool, session) = org.pools.acquire(&org.id, &id_or_name, requested).await?;
    let Some(session) = session else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let update = SessionUpdate {
        name: request.name.map(Some),
        tags: request.tags,
        start_url: request.start_url,
        telemetry: request.telemetry,
        ..SessionUpdate::default()
    };
    let session = match org.sessions.update(&session, update).await {
        Ok(session) => session,
        Err(error) => {
            // Nothing of the failed acquire stays: the browser goes back to the pool.
            if let Err(release) = org.pools.release(&org.id, &pool.id, &session.id, true).await {
                tracing::warn!(session_id = %session.id, %release, "could not give a browser back after a failed acquire");
            }
            return Err(error.into());
        }
    };
    let mut answer = browser_view(&org, &session).await?;
    answer.pool = Some(PoolRef { id: pool.id, name: pool.name });
    Ok(Json(answer).into_response())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    pub session_id: String,
    /// Reset the browser and make it available again (default), or end it (the pool
    /// replaces it).
    pub reuse: Option<bool>,
}

/// Give a leased browser back. With `reuse` (default) its Chromium restarts with a
/// fresh profile (no tabs, cookies, storage or cache) before it is available again.
#[utoipa::path(post, path = "/browser_pools/{id_or_name}/release", request_body = ReleaseRequest,
    responses((status = 204)))]
pub async fn release(
    org: Org, PathParam(id_or_name): PathParam<String>, JsonBody(request): JsonBody<ReleaseRequest>,
) -> Result<StatusCode, ApiError> {
    org.pools
        .release(&org.id, &id_or_name, &request.session_id, request.reuse.unwrap_or(true))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Destroy every idle browser of the pool (seed 4.10); leased browsers are not affected.
/// The reconciler then refills the pool.
#[utoipa::path(post, path = "/browser_pools/{id_or_name}/flush", responses((status = 204)))]
pub async fn flush(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    org.pools.flush(&org.id, &id_or_name).await?;
    Ok(StatusCode::NO_CONTENT)
}
