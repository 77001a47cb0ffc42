//! Browser pools (seed 4.10): `/browser_pools`. The mechanics (filling, leasing,
//! resetting) are in `crate::pools`; this module is the HTTP surface and validation.

use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use super::browsers::{BrowserSession, PoolRef, new_session};
use super::extensions::name_problem;
use super::extract::{JsonBody, PathParam, QueryParams, parse};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ErrorDetail};
use crate::ids;
use crate::pools::{self, DEFAULT_ACQUIRE_TIMEOUT_CAP};
use crate::state::AppState;
use crate::store::{PoolLease, PoolRecord, SessionStatus, StoreError};

pub const MAX_POOL_SIZE: i64 = 100;
pub const DEFAULT_FILL_RATE: i64 = 10;
pub const MAX_FILL_RATE: i64 = 10_000;
pub const DEFAULT_POOL_TIMEOUT_SECONDS: i64 = 600;
pub const MAX_ACQUIRE_TIMEOUT_SECONDS: i64 = 300;

/// Fields of `POST /browser_pools` and `PATCH /browser_pools/{id_or_name}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolRequest {
    /// Browsers kept in the pool (idle + leased), 1 to 100. Required on create.
    pub size: Option<i64>,
    /// Unique in the organization, `^[A-Za-z0-9._-]{1,255}$`.
    pub name: Option<String>,
    /// Percent of `size` launched per minute while filling (at least one browser a
    /// minute), 1 to 10000. Default 10.
    pub fill_rate_per_minute: Option<i64>,
    /// Inactivity timeout of acquired browsers, 10 to 259200 s. Default 600.
    pub timeout_seconds: Option<i64>,
    pub headless: Option<bool>,
    pub stealth: Option<bool>,
    pub kiosk_mode: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub viewport: Option<Value>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub extensions: Option<Value>,
    pub proxy_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub profile: Option<Value>,
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
    #[schema(value_type = Object)]
    pub browser_pool_config: Value,
}

async fn pool_of(state: &AppState, record: PoolRecord) -> Result<BrowserPool, ApiError> {
    let members = state.store.pool_members(&record.id).await?;
    let count = |lease: PoolLease| {
        members
            .iter()
            .filter(|m| m.pool_lease == Some(lease) && m.status == SessionStatus::Running)
            .count() as i64
    };
    Ok(BrowserPool {
        acquired_count: count(PoolLease::Leased),
        available_count: count(PoolLease::Idle),
        id: record.id,
        name: record.name,
        created_at: record.created_at,
        browser_pool_config: record.config,
    })
}

/// Merges `request` over `base` (a stored configuration, or empty for a create),
/// validates everything and answers the complete configuration to store.
async fn configure(
    state: &AppState,
    caller: &Caller,
    base: &Map<String, Value>,
    request: PoolRequest,
    own_id: Option<&str>,
) -> Result<Map<String, Value>, ApiError> {
    let mut config = base.clone();
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            config.insert(key.to_owned(), value);
        }
    };
    set("size", request.size.map(Value::from));
    set("name", request.name.map(Value::from));
    set(
        "fill_rate_per_minute",
        request.fill_rate_per_minute.map(Value::from),
    );
    set("timeout_seconds", request.timeout_seconds.map(Value::from));
    set("headless", request.headless.map(Value::from));
    set("stealth", request.stealth.map(Value::from));
    set("kiosk_mode", request.kiosk_mode.map(Value::from));
    set("viewport", request.viewport);
    set("extensions", request.extensions);
    set("proxy_id", request.proxy_id.map(Value::from));
    set("profile", request.profile);
    config
        .entry("fill_rate_per_minute")
        .or_insert(DEFAULT_FILL_RATE.into());
    config
        .entry("timeout_seconds")
        .or_insert(DEFAULT_POOL_TIMEOUT_SECONDS.into());

    let mut problems = Vec::new();
    let size = config.get("size").and_then(Value::as_i64);
    match size {
        Some(size) if (1..=MAX_POOL_SIZE).contains(&size) => {}
        Some(size) => problems.push(ErrorDetail::invalid_input(format!(
            "size must be between 1 and {MAX_POOL_SIZE}, got {size}"
        ))),
        None => problems.push(ErrorDetail::invalid_input("size is required")),
    }
    let fill = config
        .get("fill_rate_per_minute")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if !(1..=MAX_FILL_RATE).contains(&fill) {
        problems.push(ErrorDetail::invalid_input(format!(
            "fill_rate_per_minute must be between 1 and {MAX_FILL_RATE} (percent of size per minute), got {fill}"
        )));
    }
    if let Some(name) = config.get("name").and_then(Value::as_str)
        && let Some(problem) = name_problem("name", name)
    {
        problems.push(ErrorDetail::invalid_input(problem));
    }
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    // The browsers' own fields, validated as a create would validate them (extensions
    // and proxy must exist in the organization).
    let record = PoolRecord {
        id: String::new(),
        org_id: caller.org_id.clone(),
        name: None,
        size: size.unwrap_or_default(),
        config: Value::Object(config.clone()),
        created_at: Utc::now(),
    };
    new_session(state, &caller.org_id, pools::browser_request(&record)?).await?;

    let others: i64 = state
        .store
        .list_pools(Some(&caller.org_id))
        .await?
        .iter()
        .filter(|pool| Some(pool.id.as_str()) != own_id)
        .map(|pool| pool.size)
        .sum();
    let limit = state.max_pooled_browsers;
    if others + size.unwrap_or_default() > limit {
        return Err(ApiError::invalid_field(format!(
            "size: the organization's pools may hold {limit} browsers in all; {others} are in its other pools"
        )));
    }
    Ok(config)
}

fn conflict_on_name(error: StoreError) -> ApiError {
    match error {
        StoreError::Conflict(_) => {
            ApiError::Conflict("the organization already has a pool of that name".into())
        }
        other => other.into(),
    }
}

/// Create a pool; the reconciler starts filling it at once.
#[utoipa::path(post, path = "/browser_pools", tag = "browser_pools", security(("bearer" = [])),
    request_body = PoolRequest,
    responses((status = 200, body = BrowserPool), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(request): JsonBody<PoolRequest>,
) -> Result<Json<BrowserPool>, ApiError> {
    if request.discard_all_idle.is_some() {
        return Err(ApiError::invalid_field(
            "discard_all_idle: only for updating a pool",
        ));
    }
    let config = configure(&state, &caller, &Map::new(), request, None).await?;
    let record = PoolRecord {
        id: ids::new_id("pool"),
        org_id: caller.org_id.clone(),
        name: config
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_owned),
        size: config
            .get("size")
            .and_then(Value::as_i64)
            .unwrap_or_default(),
        config: Value::Object(config),
        created_at: Utc::now(),
    };
    state
        .store
        .insert_pool(&record)
        .await
        .map_err(conflict_on_name)?;
    state.pools.changed();
    Ok(Json(pool_of(&state, record).await?))
}

#[utoipa::path(get, path = "/browser_pools", tag = "browser_pools", security(("bearer" = [])),
    responses((status = 200, body = Vec<BrowserPool>)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<BrowserPool>>, ApiError> {
    let mut pools = Vec::new();
    for record in state.store.list_pools(Some(&caller.org_id)).await? {
        pools.push(pool_of(&state, record).await?);
    }
    Ok(Json(pools))
}

async fn find(state: &AppState, caller: &Caller, id_or_name: &str) -> Result<PoolRecord, ApiError> {
    state
        .store
        .pool(&caller.org_id, id_or_name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("browser pool {id_or_name} not found")))
}

#[utoipa::path(get, path = "/browser_pools/{id_or_name}", tag = "browser_pools", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Pool id or name")),
    responses((status = 200, body = BrowserPool), (status = 404, body = ErrorBody)))]
pub async fn retrieve(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
) -> Result<Json<BrowserPool>, ApiError> {
    let record = find(&state, &caller, &id_or_name).await?;
    Ok(Json(pool_of(&state, record).await?))
}

/// Change a pool's size and browser configuration. Idle browsers keep the old
/// configuration unless `discard_all_idle` replaces them now.
#[utoipa::path(patch, path = "/browser_pools/{id_or_name}", tag = "browser_pools", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Pool id or name")),
    request_body = PoolRequest,
    responses((status = 200, body = BrowserPool), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
    JsonBody(request): JsonBody<PoolRequest>,
) -> Result<Json<BrowserPool>, ApiError> {
    let mut record = find(&state, &caller, &id_or_name).await?;
    let discard = request.discard_all_idle.unwrap_or(false);
    let base = record.config.as_object().cloned().unwrap_or_default();
    let config = configure(&state, &caller, &base, request, Some(&record.id)).await?;
    record.name = config
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    record.size = config
        .get("size")
        .and_then(Value::as_i64)
        .unwrap_or(record.size);
    record.config = Value::Object(config);
    state
        .store
        .update_pool(&record)
        .await
        .map_err(conflict_on_name)?;
    if discard {
        pools::end_idle(&state, &record, "pool configuration changed").await?;
    }
    state.pools.changed();
    Ok(Json(pool_of(&state, record).await?))
}

#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeletePoolParams {
    /// End leased browsers too (otherwise a pool with leased browsers is a 409).
    pub force: Option<bool>,
}

/// Delete a pool and its browsers. Refused (409) while browsers are leased, unless
/// `force` (in the JSON body, as the SDKs send it, or the query) ends them too.
#[utoipa::path(delete, path = "/browser_pools/{id_or_name}", tag = "browser_pools", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Pool id or name"), DeletePoolParams),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
    QueryParams(query): QueryParams<DeletePoolParams>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let from_body: DeletePoolParams = if body.iter().all(u8::is_ascii_whitespace) {
        DeletePoolParams::default()
    } else {
        parse(&body)?
    };
    let force = from_body.force.or(query.force).unwrap_or(false);
    let record = find(&state, &caller, &id_or_name).await?;
    let members = state.store.pool_members(&record.id).await?;
    let leased = members
        .iter()
        .filter(|m| m.pool_lease == Some(PoolLease::Leased))
        .count();
    if leased > 0 && !force {
        return Err(ApiError::Conflict(format!(
            "{leased} browsers of the pool are leased; release them or delete with force=true"
        )));
    }
    if !state.store.delete_pool(&record.id, Utc::now()).await? {
        return Err(ApiError::NotFound(format!(
            "browser pool {id_or_name} not found"
        )));
    }
    pools::end_all(&state, members, "pool deleted").await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// Seconds to wait for an idle browser, 0 to 300. Default: the time the pool takes
    /// to fill at its fill rate, at most 30.
    pub acquire_timeout_seconds: Option<i64>,
}

/// Lease an idle browser of the pool, waiting for one up to `acquire_timeout_seconds`.
/// When none became available: 423 `no_browser_available` (a status the SDKs do not
/// retry by themselves, so the caller decides).
#[utoipa::path(post, path = "/browser_pools/{id_or_name}/acquire", tag = "browser_pools", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Pool id or name")),
    request_body = AcquireRequest,
    responses((status = 200, body = BrowserSession), (status = 404, body = ErrorBody), (status = 423, body = ErrorBody)))]
pub async fn acquire(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
    JsonBody(request): JsonBody<AcquireRequest>,
) -> Result<Json<BrowserSession>, ApiError> {
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
    let record = find(&state, &caller, &id_or_name).await?;
    let timeout = requested.unwrap_or_else(|| {
        let per_minute = pools::launches_per_minute(record.size, pools::fill_rate(&record));
        Duration::from_secs_f64(record.size as f64 / per_minute * 60.0)
            .min(DEFAULT_ACQUIRE_TIMEOUT_CAP)
    });
    let session = pools::acquire(&state, &record, timeout).await?;
    let mut answer = BrowserSession::from_record(&state, &session);
    answer.pool = Some(PoolRef {
        id: record.id,
        name: record.name,
    });
    Ok(Json(answer))
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
#[utoipa::path(post, path = "/browser_pools/{id_or_name}/release", tag = "browser_pools", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Pool id or name")),
    request_body = ReleaseRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn release(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
    JsonBody(request): JsonBody<ReleaseRequest>,
) -> Result<StatusCode, ApiError> {
    let record = find(&state, &caller, &id_or_name).await?;
    pools::release(
        &state,
        &record,
        &request.session_id,
        request.reuse.unwrap_or(true),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Destroy every idle browser of the pool (seed 4.10); leased browsers are not affected.
/// The reconciler then refills the pool.
#[utoipa::path(post, path = "/browser_pools/{id_or_name}/flush", tag = "browser_pools", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Pool id or name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn flush(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    let record = find(&state, &caller, &id_or_name).await?;
    pools::end_idle(&state, &record, "pool flushed").await?;
    Ok(StatusCode::NO_CONTENT)
}
