//! `/org/api_keys`: the organization's API keys (`crate::access::keys`). A key's secret is
//! shown once, when it is made (create, rotate). A caller can only make, rotate or
//! delete keys within its own rights: its project, its policy, its lifetime.

use std::collections::HashMap;

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use crate::access::keys::{DEFAULT_ROTATION_GRACE_DAYS, MAX_DAYS_TO_EXPIRE, NewKey, masked};
use crate::access::policy::Policy;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::{Paging, page_of};
use crate::store::{ApiKeyRecord, CreatedBy};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    /// 1 to 255 characters; not unique.
    name: String,
    /// Days until the key expires, 1 to 3650; `null` for never.
    days_to_expire: Option<i64>,
    /// When the key expires; not with `days_to_expire`.
    expires_at: Option<DateTime<Utc>>,
    /// Only these actions on these resources (`docs/reference/api-key-actions.md`).
    #[schema(value_type = Option<Object>)]
    policy: Option<Policy>,
    /// Bind the key to one of the organization's projects.
    project_id: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateApiKey {
    name: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateApiKey {
    /// The new key's lifetime in days; omitted: the rotated key's lifetime.
    days_to_expire: Option<i64>,
    /// Days the rotated key keeps working: 0 ends it at once; default 7.
    expire_in_days: Option<i64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    /// Not deleted (expired keys included).
    #[default]
    Active,
    Deleted,
    All,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortBy {
    #[default]
    CreatedAt,
    Name,
    ExpiresAt,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortDirection {
    Asc,
    #[default]
    Desc,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListApiKeys {
    /// `active` (default), `deleted` or `all`.
    #[param(inline)]
    status: Option<KeyStatus>,
    /// Deprecated: `status=all`.
    include_deleted: Option<bool>,
    /// Exact name (case-insensitive).
    name: Option<String>,
    /// Case-insensitive text in the name, the maker or the project; an id or masked key
    /// by prefix.
    query: Option<String>,
    /// `created_at` (default), `name` or `expires_at` (keys that never expire last).
    #[param(inline)]
    sort_by: Option<SortBy>,
    /// `asc` or `desc` (default).
    #[param(inline)]
    sort_direction: Option<SortDirection>,
    /// 1 to 100, default 20.
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    offset: Option<u32>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RetrieveApiKey {
    /// Also find a deleted key.
    include_deleted: Option<bool>,
}

/// The names of the organization's projects, by id, for keys' views.
async fn project_names(org: &Org) -> Result<HashMap<String, String>, ApiError> {
    let projects = org.store.list_projects(&org.id).await?;
    Ok(projects.into_iter().map(|project| (project.id, project.name)).collect())
}

/// The key as the API shows it (the SDK's `APIKey`), never with its secret.
fn view(record: &ApiKeyRecord, project_names: &HashMap<String, String>) -> Value {
    let created_by =
        record.created_by.clone().unwrap_or_else(crate::access::keys::command_line_maker);
    json!({
        "id": record.id,
        "name": record.name,
        "masked_key": masked(record),
        "created_at": record.created_at,
        "created_by": created_by,
        "expires_at": record.expires_at,
        "deleted_at": record.deleted_at,
        "last_used_at": record.last_used_at,
        "project_id": record.project_id,
        "project_name": record.project_id.as_ref().and_then(|id| project_names.get(id)),
        "policy": record.policy,
    })
}

/// The new key's view with its secret (the SDK's `CreatedAPIKey`).
fn created_view(record: &ApiKeyRecord, key: &str, names: &HashMap<String, String>) -> Value {
    let mut view = view(record, names);
    view["key"] = json!(key);
    view
}

/// Who the caller is, as a new key records its maker.
fn maker(org: &Org) -> CreatedBy {
    if let Some(person) = org.caller.person() {
        return CreatedBy {
            id: person.sub.clone(),
            email: person.email.clone(),
            name: person.name.clone(),
        };
    }
    match org.caller.key() {
        Some(key) => CreatedBy {
            id: key.id.clone(),
            email: String::new(),
            name: Some(format!("API key {}", key.name)),
        },
        None => CreatedBy {
            id: org.invocation_id.clone().unwrap_or_else(|| "session".into()),
            email: String::new(),
            name: Some("an app invocation".into()),
        },
    }
}

/// Refuses a key the caller may not manage: not a live key of the organization it sees
/// (404), or one it could not have made itself (403).
async fn check_manageable(org: &Org, id: &str) -> Result<(), ApiError> {
    let record = visible_key(org, id, false).await?;
    let (project_id, policy) = (record.project_id.as_deref(), record.policy.as_ref());
    within_callers_rights(org, project_id, policy, record.expires_at)
}

/// Refuses (403) a key the caller could not make itself: another project, rights
/// beyond its policy, or a longer life.
fn within_callers_rights(
    org: &Org, project_id: Option<&str>, policy: Option<&Policy>, expires_at: Option<DateTime<Utc>>,
) -> Result<(), ApiError> {
    if let Some(own) = org.caller.key().and_then(|key| key.project_id.as_deref())
        && project_id != Some(own)
    {
        return Err(ApiError::Forbidden(format!(
            "this API key is bound to project {own}: it can only manage keys of that project"
        )));
    }
    // A key's policy, or a signed-in person's role.
    if let Some(own) = org.caller.policy() {
        let covered = policy.is_some_and(|policy| own.covers(policy));
        if !covered {
            return Err(ApiError::Forbidden(
                "this API key's policy does not cover that key's: a key cannot give or reach more rights than its own"
                    .into(),
            ));
        }
    }
    if let Some(own) = org.caller.key().and_then(|key| key.expires_at)
        && expires_at.is_none_or(|expires_at| expires_at > own)
    {
        return Err(ApiError::Forbidden(format!(
            "this API key expires at {}: it cannot manage a key that lives longer",
            own.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )));
    }
    Ok(())
}

fn days(field: &str, days: i64, min: i64) -> Result<TimeDelta, ApiError> {
    if !(min..=MAX_DAYS_TO_EXPIRE).contains(&days) {
        return Err(ApiError::invalid_field(format!(
            "{field}: give {min} to {MAX_DAYS_TO_EXPIRE} days"
        )));
    }
    Ok(TimeDelta::days(days))
}

/// Create an API key; its secret is in the answer only.
#[utoipa::path(post, path = "/org/api_keys", request_body = CreateApiKey,
    responses((status = 200, description = "CreatedAPIKey"), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateApiKey>,
) -> Result<Json<Value>, ApiError> {
    let names = project_names(&org).await?;
    let caller = org.caller.key();
    let expires_at = match (request.days_to_expire, request.expires_at) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_field(
                "days_to_expire and expires_at cannot both be given",
            ));
        }
        (Some(count), None) => Some(Utc::now() + days("days_to_expire", count, 1)?),
        (None, Some(at)) if at <= Utc::now() => {
            return Err(ApiError::invalid_field("expires_at must be in the future"));
        }
        (None, Some(at)) if at > Utc::now() + TimeDelta::days(MAX_DAYS_TO_EXPIRE) => {
            return Err(ApiError::invalid_field(format!(
                "expires_at must be within {MAX_DAYS_TO_EXPIRE} days"
            )));
        }
        (None, Some(at)) => Some(at),
        // A key that expires makes keys that expire with it.
        (None, None) => caller.and_then(|key| key.expires_at),
    };
    if let Some(policy) = &request.policy {
        let problems = policy.problems();
        if !problems.is_empty() {
            return Err(ApiError::invalid_fields(problems));
        }
    }
    let project_id = match request.project_id {
        Some(id) => match org.store.project(&org.id, &id).await? {
            Some(project) if project.id == id => Some(id),
            _ => return Err(ApiError::not_found("project", &id)),
        },
        None => caller.and_then(|key| key.project_id.clone()),
    };
    // Unsaid, a restricted caller's new key is restricted as the caller is.
    let policy = request.policy.or_else(|| caller.and_then(|key| key.policy.clone()));
    within_callers_rights(&org, project_id.as_deref(), policy.as_ref(), expires_at)?;
    let (record, key) = org
        .api_keys
        .create(NewKey {
            org_id: org.id.clone(),
            name: request.name,
            project_id,
            policy,
            expires_at,
            created_by: maker(&org),
        })
        .await?;
    Ok(Json(created_view(&record, &key, &names)))
}

/// The organization's API keys (masked), newest first unless sorted otherwise.
#[utoipa::path(get, path = "/org/api_keys", params(ListApiKeys),
    responses((status = 200, description = "[APIKey]")))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<ListApiKeys>,
) -> Result<impl IntoResponse, ApiError> {
    let names = project_names(&org).await?;
    let status = match (query.status, query.include_deleted) {
        (Some(status), _) => status,
        (None, Some(true)) => KeyStatus::All,
        (None, _) => KeyStatus::Active,
    };
    let mut keys = org.api_keys.list(&org.id).await?;
    keys.retain(|key| match status {
        KeyStatus::Active => key.deleted_at.is_none(),
        KeyStatus::Deleted => key.deleted_at.is_some(),
        KeyStatus::All => true,
    });
    // A request confined to a project (its key's, or the one its headers name) sees
    // that project's keys.
    if let Some(own) = &org.project {
        keys.retain(|key| key.project_id.as_deref() == Some(own.id.as_str()));
    }
    if let Some(name) = &query.name {
        keys.retain(|key| key.name.to_lowercase() == name.to_lowercase());
    }
    if let Some(text) = query.query.as_deref().filter(|text| !text.is_empty()) {
        let lower = text.to_lowercase();
        keys.retain(|key| {
            let maker = key.created_by.as_ref();
            key.id.starts_with(text)
                || masked(key).starts_with(text)
                || key.name.to_lowercase().contains(&lower)
                || maker.is_some_and(|m| {
                    m.email.to_lowercase().contains(&lower)
                        || m.name.as_deref().is_some_and(|n| n.to_lowercase().contains(&lower))
                })
                || key.project_id.as_deref().is_some_and(|p| p.to_lowercase().contains(&lower))
        });
    }
    match query.sort_by.unwrap_or_default() {
        SortBy::CreatedAt => keys.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id))),
        SortBy::Name => {
            keys.sort_by(|a, b| (a.name.to_lowercase(), &a.id).cmp(&(b.name.to_lowercase(), &b.id)))
        }
        // Keys that never expire last when ascending.
        SortBy::ExpiresAt => keys.sort_by(|a, b| {
            (a.expires_at.is_none(), a.expires_at, &a.id).cmp(&(
                b.expires_at.is_none(),
                b.expires_at,
                &b.id,
            ))
        }),
    }
    if query.sort_direction.unwrap_or_default() == SortDirection::Desc {
        keys.reverse();
    }
    let (headers, page) = page_of(paging, keys, query.limit, query.offset)?;
    let body: Vec<Value> = page.iter().map(|key| view(key, &names)).collect();
    Ok((headers, Json(body)))
}

/// One of the organization's API keys (masked).
#[utoipa::path(get, path = "/org/api_keys/{id}", params(RetrieveApiKey),
    responses((status = 200, description = "APIKey")))]
pub async fn retrieve(
    org: Org, PathParam(id): PathParam<String>, QueryParams(query): QueryParams<RetrieveApiKey>,
) -> Result<Json<Value>, ApiError> {
    let names = project_names(&org).await?;
    let record = visible_key(&org, &id, query.include_deleted.unwrap_or(false)).await?;
    Ok(Json(view(&record, &names)))
}

/// A key of the organization the caller may see: a request confined to a project sees
/// only that project's keys (another's are 404, as another organization's).
async fn visible_key(org: &Org, id: &str, include_deleted: bool) -> Result<ApiKeyRecord, ApiError> {
    let record = org.api_keys.get(&org.id, id, include_deleted).await?;
    if let Some(own) = &org.project
        && record.project_id.as_deref() != Some(own.id.as_str())
    {
        return Err(ApiError::not_found("API key", id));
    }
    Ok(record)
}

/// Rename an API key.
#[utoipa::path(patch, path = "/org/api_keys/{id}", request_body = UpdateApiKey,
    responses((status = 200, description = "APIKey")))]
pub async fn update(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<UpdateApiKey>,
) -> Result<Json<Value>, ApiError> {
    let names = project_names(&org).await?;
    check_manageable(&org, &id).await?;
    org.api_keys.rename(&org.id, &id, &request.name).await?;
    let record = org.api_keys.get(&org.id, &id, true).await?;
    Ok(Json(view(&record, &names)))
}

/// Delete an API key (it stays listed with `status=deleted`); a key cannot delete itself.
#[utoipa::path(delete, path = "/org/api_keys/{id}",
    responses((status = 204), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete(org: Org, PathParam(id): PathParam<String>) -> Result<StatusCode, ApiError> {
    if org.caller.key().is_some_and(|key| key.id == id) {
        return Err(ApiError::Conflict(
            "a key cannot delete itself: delete it with another key".into(),
        ));
    }
    check_manageable(&org, &id).await?;
    org.api_keys.delete(&org.id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Issue a new key with the name, project and policy of this one, which keeps working
/// for a grace period (`expire_in_days`, default 7; 0 ends it at once).
#[utoipa::path(post, path = "/org/api_keys/{id}/rotate", request_body = RotateApiKey,
    responses((status = 200, description = "CreatedAPIKey"), (status = 403, body = ErrorBody)))]
pub async fn rotate(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<RotateApiKey>,
) -> Result<Json<Value>, ApiError> {
    let names = project_names(&org).await?;
    let old = visible_key(&org, &id, false).await?;
    let lifetime = match request.days_to_expire {
        Some(count) => Some(days("days_to_expire", count, 1)?),
        None => old.expires_at.map(|expires_at| expires_at - old.created_at),
    };
    let grace =
        days("expire_in_days", request.expire_in_days.unwrap_or(DEFAULT_ROTATION_GRACE_DAYS), 0)?;
    let new_expires_at = lifetime.map(|lifetime| Utc::now() + lifetime);
    // The caller must be able to make the new key, and to reach the old one.
    within_callers_rights(&org, old.project_id.as_deref(), old.policy.as_ref(), old.expires_at)?;
    within_callers_rights(&org, old.project_id.as_deref(), old.policy.as_ref(), new_expires_at)?;
    let (record, key) = org.api_keys.rotate(&old, lifetime, grace, maker(&org)).await?;
    Ok(Json(created_view(&record, &key, &names)))
}
