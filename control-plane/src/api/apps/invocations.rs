//! `/invocations`: run an action of a deployed app, follow it, end it, and list and end
//! the browsers it created. Running them is `crate::apps`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::events::{self, Since};
use crate::api::browsers::view::{BrowserSession, browser_view};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::list_query;
use crate::api::paging::{Paging, page_of};
use crate::apps::views::{self, Invocation};
use crate::apps::{InvocationStatus, NewInvocation};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateInvocationRequest {
    /// 1 to 64 of `[A-Za-z0-9._-]`.
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,64}$")]
    pub app_name: String,
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,64}$")]
    pub action_name: String,
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,64}$")]
    pub version: String,
    /// The action's input: a JSON document, as a string (at most 256 KiB).
    pub payload: Option<String>,
    /// `true`: answered at once (202, `queued`); the action runs for up to
    /// `async_timeout_seconds`. Otherwise answered when it has finished, within 55 s.
    #[serde(rename = "async")]
    pub asynchronous: Option<bool>,
    /// 10 to 3600 (default 900); only with `async`.
    #[schema(minimum = 10, maximum = 3600)]
    pub async_timeout_seconds: Option<u64>,
}

/// Invoke an action. Synchronous invocations answer 200 with the final status and
/// `output`; `async: true` answers 202 with status `queued`. Too many running at once
/// for the organization: 429 with Retry-After.
#[utoipa::path(post, path = "/invocations", request_body = CreateInvocationRequest,
    responses((status = 200, body = Invocation), (status = 202, body = Invocation),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateInvocationRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let asynchronous = request.asynchronous.unwrap_or(false);
    let tokens = org.tokens.clone();
    let org_id = org.id.clone();
    let key_id = org.caller.key().map(|key| key.id.clone());
    let record = org
        .apps
        .invoke(
            &org.id,
            NewInvocation {
                app_name: request.app_name,
                action_name: request.action_name,
                version: request.version,
                payload: request.payload,
                asynchronous,
                async_timeout_seconds: request.async_timeout_seconds,
            },
            move |id, expires| tokens.issue_invocation_key(id, &org_id, key_id.as_deref(), expires),
        )
        .await?;
    let status = if asynchronous { StatusCode::ACCEPTED } else { StatusCode::OK };
    Ok((status, Json(views::invocation(&record))))
}

/// Get an invocation.
#[utoipa::path(get, path = "/invocations/{id}", responses((status = 200, body = Invocation)))]
pub async fn retrieve(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<Invocation>, ApiError> {
    Ok(Json(views::invocation(&org.apps.invocation(&org.id, &id).await?)))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateInvocationRequest {
    /// `succeeded` or `failed`.
    #[schema(pattern = "^(succeeded|failed)$")]
    pub status: String,
    /// The output to record (a JSON document as a string).
    pub output: Option<String>,
}

/// End an invocation that has not finished, with this status (and output): its action
/// is stopped and its browsers end. 409 once it has finished.
#[utoipa::path(patch, path = "/invocations/{id}", request_body = UpdateInvocationRequest,
    responses((status = 200, body = Invocation), (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id): PathParam<String>,
    JsonBody(request): JsonBody<UpdateInvocationRequest>,
) -> Result<Json<Invocation>, ApiError> {
    let status = match request.status.as_str() {
        "succeeded" => InvocationStatus::Succeeded,
        "failed" => InvocationStatus::Failed,
        _ => {
            return Err(ApiError::invalid_field("status must be succeeded or failed"));
        }
    };
    let record = org.apps.set_invocation_status(&org.id, &id, status, request.output).await?;
    Ok(Json(views::invocation(&record)))
}

list_query! {
    /// The list's filters, `limit` and `offset`.
    pub struct InvocationListQuery {
        pub app_name: Option<String>,
        pub action_name: Option<String>,
        pub deployment_id: Option<String>,
        pub version: Option<String>,
        #[param(pattern = "^(queued|running|succeeded|failed)$")]
        pub status: Option<String>,
        /// Only invocations started since: an RFC 3339 time, or a duration such as `5m`.
        #[param(schema_with = crate::api::openapi::since)]
        pub since: Option<String>,
        /// Only invocations whose id is this, or whose app or action name contains it.
        pub query: Option<String>,
    }
}

/// List the organization's invocations, newest first (paged).
#[utoipa::path(get, path = "/invocations", params(InvocationListQuery),
    responses((status = 200, body = Vec<Invocation>)))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<InvocationListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    if let Some(status) = &query.status
        && !["queued", "running", "succeeded", "failed"].contains(&status.as_str())
    {
        return Err(ApiError::invalid_field("status must be queued, running, succeeded or failed"));
    }
    let since = query.since.as_deref().map(events::parse_since).transpose()?;
    let mut records = org.store.list_invocations(&org.id).await?;
    let text = query.query.as_deref().filter(|q| !q.is_empty()).map(str::to_lowercase);
    records.retain(|r| {
        let matches =
            |filter: &Option<String>, value: &str| filter.as_deref().is_none_or(|f| f == value);
        matches(&query.app_name, &r.app_name)
            && matches(&query.action_name, &r.action_name)
            && matches(&query.deployment_id, &r.deployment_id)
            && matches(&query.version, &r.version)
            && matches(&query.status, &r.status)
            && since.is_none_or(|since| r.started_at >= since)
            && text.as_ref().is_none_or(|text| {
                r.id == *text
                    || r.app_name.to_lowercase().contains(text)
                    || r.action_name.to_lowercase().contains(text)
            })
    });
    let (headers, page) = page_of(paging, records, query.limit, query.offset)?;
    let body: Vec<Invocation> = page.iter().map(views::invocation).collect();
    Ok((headers, Json(body)))
}

/// Follow an invocation: server-sent `invocation_state` events, `log` events (the
/// action's stdout and stderr), and `sse_heartbeat` every 5 s; the stream ends once it
/// has succeeded or failed.
#[utoipa::path(get, path = "/invocations/{id}/events", params(Since),
    responses((status = 200, content_type = "text/event-stream", body = String)))]
pub async fn events(
    org: Org, PathParam(id): PathParam<String>, QueryParams(since): QueryParams<Since>,
) -> Result<impl IntoResponse, ApiError> {
    let since = since.parse()?;
    let record = org.apps.invocation(&org.id, &id).await?;
    let current = views::invocation_state_event(&record);
    Ok(events::stream(&org.apps.events, &record.id, since, current))
}

/// The browsers an invocation's action created and that still live.
#[derive(Debug, Serialize, ToSchema)]
pub struct InvocationBrowsers {
    pub browsers: Vec<BrowserSession>,
}

/// List the live browsers the invocation's action created.
#[utoipa::path(get, path = "/invocations/{id}/browsers",
    responses((status = 200, body = InvocationBrowsers)))]
pub async fn list_browsers(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<InvocationBrowsers>, ApiError> {
    let sessions = org.apps.browsers_of(&org.id, &id).await?;
    let mut browsers = Vec::with_capacity(sessions.len());
    for session in &sessions {
        browsers.push(browser_view(&org, session).await?);
    }
    Ok(Json(InvocationBrowsers { browsers }))
}

/// End the browsers the invocation's action created (the invocation goes on).
#[utoipa::path(delete, path = "/invocations/{id}/browsers", responses((status = 204)))]
pub async fn delete_browsers(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    org.apps.invocation(&org.id, &id).await?;
    org.apps.end_browsers(&org.id, &id, "ended through its invocation").await;
    Ok(StatusCode::NO_CONTENT)
}
