//! `/profiles`: stored browser state that sessions start from and save back into.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::caller::Caller;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, PathParam, QueryParams};
use super::state::AppState;
use crate::store::ProfileRecord;

/// A profile as the SDKs read it (plus the size of its stored state).
#[derive(Debug, Serialize, ToSchema)]
pub struct Profile {
    pub id: String,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When a session last saved state into it; null while it has none.
    pub updated_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    /// Size of the stored state archive; null while it has none.
    pub size_bytes: Option<i64>,
}

impl From<ProfileRecord> for Profile {
    fn from(record: ProfileRecord) -> Self {
        Self {
            id: record.id,
            name: record.name,
            created_at: record.created_at,
            updated_at: record.updated_at,
            last_used_at: record.last_used_at,
            size_bytes: record.size_bytes,
        }
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProfileRequest {
    /// Unique in the organization; 1 to 255 characters without control characters.
    pub name: Option<String>,
}

/// Create a profile (empty until a session saves state into it).
#[utoipa::path(post, path = "/profiles", tag = "profiles", request_body = CreateProfileRequest,
    security(("bearer" = [])),
    responses((status = 200, body = Profile), (status = 400, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(request): JsonBody<CreateProfileRequest>,
) -> Result<Json<Profile>, ApiError> {
    let record = state.profiles.create(&caller.org_id, request.name).await?;
    Ok(Json(record.into()))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only profiles whose name or id contains this text.
    pub query: Option<String>,
    /// Default 20, maximum 100.
    pub limit: Option<u32>,
    pub offset: Option<u32>,
}

/// List the organization's profiles, oldest first (paged with `limit`/`offset`).
#[utoipa::path(get, path = "/profiles", tag = "profiles", params(ListQuery),
    security(("bearer" = [])),
    responses((status = 200, body = Vec<Profile>), (status = 400, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let mut profiles = state.store.list_profiles(&caller.org_id).await?;
    if let Some(text) = query.query.as_deref().filter(|text| !text.is_empty()) {
        profiles
            .retain(|p| p.id.contains(text) || p.name.as_deref().is_some_and(|n| n.contains(text)));
    }
    let (headers, page) = super::page_of(profiles, query.limit, query.offset)?;
    let body: Vec<Profile> = page.into_iter().map(Profile::from).collect();
    Ok((headers, Json(body)))
}

async fn find(
    state: &AppState,
    caller: &Caller,
    id_or_name: &str,
) -> Result<ProfileRecord, ApiError> {
    state
        .store
        .profile(&caller.org_id, id_or_name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("profile {id_or_name} not found")))
}

/// Get a profile by id or name.
#[utoipa::path(get, path = "/profiles/{id_or_name}", tag = "profiles", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Profile id or name (the id is tried first)")),
    responses((status = 200, body = Profile), (status = 404, body = ErrorBody)))]
pub async fn retrieve(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
) -> Result<Json<Profile>, ApiError> {
    Ok(Json(find(&state, &caller, &id_or_name).await?.into()))
}

/// Delete a profile and its stored state. Refused (409) while an auth connection manages
/// it. Sessions running with it go on; their save is discarded.
#[utoipa::path(delete, path = "/profiles/{id_or_name}", tag = "profiles", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Profile id or name (the id is tried first)")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    let record = find(&state, &caller, &id_or_name).await?;
    if let Some(name) = &record.name {
        let connections = state
            .store
            .list_auth_connections(Some(&caller.org_id))
            .await?;
        if let Some(connection) = connections.iter().find(|c| &c.profile_name == name) {
            return Err(ApiError::Conflict(format!(
                "profile {name:?} is managed by auth connection {}; delete that first",
                connection.id
            )));
        }
    }
    if !state
        .store
        .delete_profile(&caller.org_id, &record.id)
        .await?
    {
        return Err(ApiError::NotFound(format!(
            "profile {id_or_name} not found"
        )));
    }
    if let Err(error) = state.blobs.delete(&record.blob_key()).await {
        tracing::warn!(%error, profile_id = %record.id, "could not delete a profile's state");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The 22 bytes of a ZIP archive without entries: the state of a profile never saved.
const EMPTY_ZIP: [u8; 22] = [
    0x50, 0x4b, 0x05, 0x06, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// Download the profile's stored state: a ZIP of Chromium user data (empty while the
/// profile has none).
#[utoipa::path(get, path = "/profiles/{id_or_name}/download", tag = "profiles", security(("bearer" = [])),
    params(("id_or_name" = String, Path, description = "Profile id or name (the id is tried first)")),
    responses((status = 200, content_type = "application/zip", body = Vec<u8>), (status = 404, body = ErrorBody)))]
pub async fn download(
    State(state): State<AppState>,
    caller: Caller,
    PathParam(id_or_name): PathParam<String>,
) -> Result<Response, ApiError> {
    let record = find(&state, &caller, &id_or_name).await?;
    // The id, not the name: names may hold characters a header cannot.
    let filename = format!("{}.zip", record.id);
    let headers = [
        (CONTENT_TYPE, "application/zip".to_owned()),
        (
            CONTENT_DISPOSITION,
            format!("attachment; filename=\"{filename}\""),
        ),
    ];
    let body = match state.blobs.open(&record.blob_key()).await {
        // The open file stays readable even if a save replaces the blob meanwhile.
        Ok(file) => Body::from_stream(tokio_util::io::ReaderStream::new(file)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Body::from(EMPTY_ZIP.to_vec())
        }
        Err(error) => return Err(ApiError::Internal(error.into())),
    };
    Ok((headers, body).into_response())
}
