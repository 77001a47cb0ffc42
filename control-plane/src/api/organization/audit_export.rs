//! `/audit-logs/export/destinations`: where an organization's audit log is delivered
//! (`crate::audit::export`): S3 buckets written through a role of the customer's that
//! this server's AWS identity (`kernel_role_arn`) assumes with the destination's
//! `external_id`. Delivery starts when a destination is made (or resumed); records of
//! before, or of while it was paused, are not delivered.

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use crate::api::error::ApiError;
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::{Paging, page_of};
use crate::store::ExportDestinationRecord;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDestination {
    /// `s3`.
    #[serde(rename = "type")]
    kind: String,
    /// `jsonl.gz`.
    format: String,
    bucket: String,
    /// Where objects go in the bucket; may be empty.
    prefix: String,
    region: String,
    /// The role (in your account) this server assumes to write.
    role_arn: String,
    /// Encrypt objects with this KMS key (SSE-KMS).
    kms_key_id: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateDestination {
    bucket: Option<String>,
    prefix: Option<String>,
    region: Option<String>,
    role_arn: Option<String>,
    /// An empty string removes the key; `null` or omitted leaves it.
    kms_key_id: Option<String>,
    /// `active` or `paused`: a resumed destination delivers from the time it resumed.
    status: Option<String>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListDestinations {
    /// 1 to 100, default 20.
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    offset: Option<u32>,
}

fn view(org: &Org, d: &ExportDestinationRecord) -> Value {
    let cursor = (d.cursor.0 > 0).then(|| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("export:v1:{}:{}", d.cursor.0, d.cursor.1))
    });
    json!({
        "id": d.id,
        "type": "s3",
        "format": "jsonl.gz",
        "bucket": d.bucket,
        "prefix": d.prefix,
        "region": d.region,
        "role_arn": d.role_arn,
        "kms_key_id": d.kms_key_id,
        "external_id": d.external_id,
        "kernel_role_arn": org.audit_export.principal_arn(),
        "status": d.status,
        "consecutive_failures": d.consecutive_failures,
        "last_error": d.last_error,
        "last_error_at": d.last_error_at,
        "last_success_at": d.last_success_at,
        "last_exported_cursor": cursor,
        "next_attempt_at": d.next_attempt_at,
        "created_at": d.created_at,
        "updated_at": d.updated_at,
    })
}

/// The problems of a destination's fields, one per line of a 400.
fn problems(d: &ExportDestinationRecord) -> Vec<String> {
    let mut problems = Vec::new();
    let bucket_ok = (3..=63).contains(&d.bucket.len())
        && d.bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && !d.bucket.starts_with(['.', '-'])
        && !d.bucket.ends_with(['.', '-']);
    if !bucket_ok {
        problems.push(
            "bucket: an S3 bucket name (3 to 63 lowercase letters, digits, dots and hyphens)"
                .into(),
        );
    }
    let region_ok = !d.region.is_empty()
        && d.region.len() <= 32
        && d.region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !region_ok {
        problems.push("region: an AWS region such as us-east-1".into());
    }
    let role_ok = d.role_arn.starts_with("arn:")
        && d.role_arn.split(':').count() == 6
        && d.role_arn.contains(":role/")
        && d.role_arn.len() <= 2048;
    if !role_ok {
        problems.push("role_arn: an IAM role ARN, arn:aws:iam::<account>:role/<name>".into());
    }
    if d.prefix.len() > 512 || d.prefix.contains("..") || d.prefix.chars().any(char::is_control) {
        problems.push("prefix: at most 512 characters, without .. or control characters".into());
    }
    if d.kms_key_id.as_ref().is_some_and(|key| key.len() > 2048) {
        problems.push("kms_key_id: at most 2048 characters".into());
    }
    problems
}

async fn find(org: &Org, id: &str) -> Result<ExportDestinationRecord, ApiError> {
    org.store
        .export_destination(&org.id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("audit log export destination", id))
}

/// The cursor of a destination that starts (or resumes) delivering now.
fn starting_now() -> (i64, String) {
    (Utc::now().timestamp_micros(), String::new())
}

/// Create an export destination; delivery starts now.
#[utoipa::path(post, path = "/audit-logs/export/destinations", request_body = CreateDestination,
    responses((status = 200, description = "AuditLogExportDestination")))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateDestination>,
) -> Result<Json<Value>, ApiError> {
    let mut problems_found = Vec::new();
    if request.kind != "s3" {
        problems_found.push("type: s3 is the only type".to_owned());
    }
    if request.format != "jsonl.gz" {
        problems_found.push("format: jsonl.gz is the only format".to_owned());
    }
    let now = Utc::now();
    let destination = ExportDestinationRecord {
        id: crate::ids::new_id("aed"),
        org_id: org.id.clone(),
        bucket: request.bucket,
        prefix: request.prefix,
        region: request.region,
        role_arn: request.role_arn,
        kms_key_id: request.kms_key_id.filter(|key| !key.is_empty()),
        external_id: crate::ids::new_secret(32),
        status: "active".into(),
        created_at: now,
        updated_at: now,
        cursor: starting_now(),
        consecutive_failures: 0,
        last_error: None,
        last_error_at: None,
        last_success_at: None,
        next_attempt_at: None,
    };
    problems_found.extend(problems(&destination));
    if !problems_found.is_empty() {
        return Err(ApiError::invalid_fields(problems_found));
    }
    org.store.insert_export_destination(&destination).await?;
    Ok(Json(view(&org, &destination)))
}

/// The organization's export destinations, oldest first.
#[utoipa::path(get, path = "/audit-logs/export/destinations", params(ListDestinations),
    responses((status = 200, description = "[AuditLogExportDestination]")))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<ListDestinations>,
) -> Result<impl IntoResponse, ApiError> {
    let destinations = org.store.export_destinations(Some(&org.id)).await?;
    let (headers, page) = page_of(paging, destinations, query.limit, query.offset)?;
    let body: Vec<Value> = page.iter().map(|d| view(&org, d)).collect();
    Ok((headers, Json(body)))
}

/// One export destination.
#[utoipa::path(get, path = "/audit-logs/export/destinations/{id}",
    responses((status = 200, description = "AuditLogExportDestination")))]
pub async fn retrieve(org: Org, PathParam(id): PathParam<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(&org, &find(&org, &id).await?)))
}

/// Change a destination; pausing stops delivery, resuming delivers from now on.
#[utoipa::path(patch, path = "/audit-logs/export/destinations/{id}",
    request_body = UpdateDestination,
    responses((status = 200, description = "AuditLogExportDestination")))]
pub async fn update(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<UpdateDestination>,
) -> Result<Json<Value>, ApiError> {
    let mut destination = find(&org, &id).await?;
    if let Some(bucket) = request.bucket {
        destination.bucket = bucket;
    }
    if let Some(prefix) = request.prefix {
        destination.prefix = prefix;
    }
    if let Some(region) = request.region {
        destination.region = region;
    }
    if let Some(role_arn) = request.role_arn {
        destination.role_arn = role_arn;
    }
    if let Some(key) = request.kms_key_id {
        destination.kms_key_id = (!key.is_empty()).then_some(key);
    }
    match request.status.as_deref() {
        None => {}
        Some("paused") => destination.status = "paused".into(),
        Some("active") if destination.status != "active" => {
            // Events of while it was paused are never delivered.
            destination.status = "active".into();
            destination.cursor = starting_now();
            destination.consecutive_failures = 0;
            destination.next_attempt_at = None;
        }
        Some("active") => {}
        Some(_) => {
            return Err(ApiError::invalid_field("status: active or paused"));
        }
    }
    let problems = problems(&destination);
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    // A changed target is tried again at once.
    destination.next_attempt_at = None;
    destination.updated_at = Utc::now();
    if !org.store.update_export_destination(&destination).await? {
        return Err(ApiError::not_found("audit log export destination", &id));
    }
    Ok(Json(view(&org, &destination)))
}

/// Delete a destination; nothing more is delivered to it.
#[utoipa::path(delete, path = "/audit-logs/export/destinations/{id}", responses((status = 204)))]
pub async fn delete(org: Org, PathParam(id): PathParam<String>) -> Result<StatusCode, ApiError> {
    if !org.store.delete_export_destination(&org.id, &id).await? {
        return Err(ApiError::not_found("audit log export destination", &id));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Check a destination: assume its role, write a test object.
#[utoipa::path(post, path = "/audit-logs/export/destinations/{id}/test",
    responses((status = 200, description = "AuditLogExportDestinationTestResult")))]
pub async fn test(org: Org, PathParam(id): PathParam<String>) -> Result<Json<Value>, ApiError> {
    let destination = find(&org, &id).await?;
    let result = org.audit_export.test(&destination).await;
    Ok(Json(json!({
        "stage": result.stage,
        "success": result.error.is_none(),
        "error": result.error.map(|(code, message)| json!({ "code": code, "message": message })),
    })))
}
