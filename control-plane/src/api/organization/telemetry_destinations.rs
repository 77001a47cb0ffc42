//! `/telemetry/destinations`: the organization's OTLP destinations (`crate::telemetry::
//! destinations`). Header values are write-only.

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::Value;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::{NamedListQuery, Paging};
use crate::telemetry::destinations::{self, CreateDestination, UpdateDestination};

/// Create an OTLP destination sessions can export their telemetry to.
#[utoipa::path(post, path = "/telemetry/destinations", request_body = CreateDestination,
    responses((status = 200, description = "OtlpDestination"),
        (status = 403, description = "The operator's egress policy forbids the endpoint's host", body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateDestination>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(org.telemetry_destinations.create(&org.id, request).await?))
}

/// The organization's OTLP destinations, oldest first.
#[utoipa::path(get, path = "/telemetry/destinations", params(NamedListQuery),
    responses((status = 200, description = "[OtlpDestination]")))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<NamedListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let records = org.telemetry_destinations.list(&org.id).await?;
    let (headers, page) = query.page(paging, records, |d| (&d.id, Some(d.name.as_str())))?;
    let body: Vec<Value> = page.iter().map(destinations::view).collect();
    Ok((headers, Json(body)))
}

/// An OTLP destination by id or name.
#[utoipa::path(get, path = "/telemetry/destinations/{id_or_name}",
    responses((status = 200, description = "OtlpDestination")))]
pub async fn retrieve(
    org: Org, PathParam(key): PathParam<String>,
) -> Result<Json<Value>, ApiError> {
    let record = org.telemetry_destinations.get(&org.id, &key).await?;
    Ok(Json(destinations::view(&record)))
}

/// Change a destination; `headers` are edited key by key (`null` deletes one). Sessions
/// exporting to it use the new values from their next delivery.
#[utoipa::path(patch, path = "/telemetry/destinations/{id_or_name}",
    request_body = UpdateDestination,
    responses((status = 200, description = "OtlpDestination"),
        (status = 403, description = "The operator's egress policy forbids the endpoint's host", body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(key): PathParam<String>, JsonBody(request): JsonBody<UpdateDestination>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(org.telemetry_destinations.update(&org.id, &key, request).await?))
}

/// Delete a destination; sessions exporting to it stop exporting.
#[utoipa::path(delete, path = "/telemetry/destinations/{id_or_name}", responses((status = 204)))]
pub async fn delete(org: Org, PathParam(key): PathParam<String>) -> Result<StatusCode, ApiError> {
    org.telemetry_destinations.delete(&org.id, &key).await?;
    Ok(StatusCode::NO_CONTENT)
}
