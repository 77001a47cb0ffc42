//! `/profiles`: stored browser state that sessions start from and save back into.

use axum::Json;
use axum::body::Body;
use axum::http::StatusCode;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::error::{ApiError, ErrorBody, OrNotFound};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::NamedListQuery;
use crate::archive_formats::{ChannelWriter, TarFormat, zip_to_tar};
use crate::store::ProfileRecord;

/// A profile as the SDKs read it (plus the size of its stored state).
#[derive(Clone, Debug, Serialize, ToSchema)]
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
    #[schema(schema_with = crate::api::openapi::optional_display_name)]
    pub name: Option<String>,
}

/// Create a profile (empty until a session saves state into it).
#[utoipa::path(post, path = "/profiles", request_body = CreateProfileRequest,
    responses((status = 200, body = Profile), (status = 409, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateProfileRequest>,
) -> Result<Json<Profile>, ApiError> {
    let record = org.profiles.create(&org.id, request.name).await?;
    Ok(Json(record.into()))
}

/// List the organization's profiles, oldest first (paged with `limit`/`offset`).
#[utoipa::path(get, path = "/profiles", params(NamedListQuery),
    responses((status = 200, body = Vec<Profile>)))]
pub async fn list(
    org: Org, paging: crate::api::paging::Paging, QueryParams(query): QueryParams<NamedListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let profiles = org.store.list_profiles(&org.id).await?;
    let (headers, page) = query.page(paging, profiles, |p| (&p.id, p.name.as_deref()))?;
    let body: Vec<Profile> = page.into_iter().map(Profile::from).collect();
    Ok((headers, Json(body)))
}

async fn find(org: &Org, id_or_name: &str) -> Result<ProfileRecord, ApiError> {
    let found = org.store.profile(&org.id, id_or_name).await?;
    found.or_not_found("profile", id_or_name)
}

/// Get a profile by id or name.
#[utoipa::path(get, path = "/profiles/{id_or_name}", responses((status = 200, body = Profile)))]
pub async fn retrieve(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<Json<Profile>, ApiError> {
    Ok(Json(find(&org, &id_or_name).await?.into()))
}

/// Delete a profile and its stored state. Refused (409) while an auth connection manages
/// it. Sessions running with it go on; their save is discarded.
#[utoipa::path(delete, path = "/profiles/{id_or_name}",
    responses((status = 204), (status = 409, body = ErrorBody)))]
pub async fn delete(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    let record = find(&org, &id_or_name).await?;
    refuse_if_managed(&org, &record).await?;
    if !org.store.delete_profile(&org.id, &record.id).await? {
        return Err(ApiError::not_found("profile", &id_or_name));
    }
    if let Err(error) = org.blobs.delete(&record.blob_key()).await {
        tracing::warn!(%error, profile_id = %record.id, "could not delete a profile's state");
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProfileRequest {
    /// The new name: unique in the organization, 1 to 255 characters without control
    /// characters.
    #[schema(schema_with = crate::api::openapi::display_name)]
    pub name: String,
}

/// Rename a profile. Refused (409) while an auth connection manages it (the connection
/// names its profile) or when another profile has the name.
#[utoipa::path(patch, path = "/profiles/{id_or_name}", request_body = UpdateProfileRequest,
    responses((status = 200, body = Profile), (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id_or_name): PathParam<String>,
    JsonBody(request): JsonBody<UpdateProfileRequest>,
) -> Result<Json<Profile>, ApiError> {
    if let Some(problem) = crate::profiles::name_problem(&request.name) {
        return Err(ApiError::invalid_field(problem));
    }
    let record = find(&org, &id_or_name).await?;
    refuse_if_managed(&org, &record).await?;
    if let Some(old) = &record.name {
        let named_by_pool = org.pools.list(&org.id).await?.into_iter().find(|pool| {
            pool.config.browser.profile.as_ref().and_then(|p| p.name.as_ref()) == Some(old)
        });
        if let Some(pool) = named_by_pool {
            return Err(ApiError::Conflict(format!(
                "pool {} starts its browsers from profile {old:?} by name; change the pool first",
                pool.record.id
            )));
        }
    }
    let renamed =
        org.store.rename_profile(&org.id, &record.id, &request.name).await.map_err(|error| {
            match error {
                crate::store::StoreError::Conflict(_) => ApiError::Conflict(format!(
                    "the organization already has a profile named {:?}",
                    request.name
                )),
                other => other.into(),
            }
        })?;
    if !renamed {
        return Err(ApiError::not_found("profile", &id_or_name));
    }
    Ok(Json(find(&org, &record.id).await?.into()))
}

/// 409 while an auth connection manages the profile (it refers to it by name).
async fn refuse_if_managed(org: &Org, record: &ProfileRecord) -> Result<(), ApiError> {
    if let Some(name) = &record.name {
        let connections = org.store.list_auth_connections(Some(&org.id)).await?;
        if let Some(connection) = connections.iter().find(|c| &c.profile_name == name) {
            return Err(ApiError::Conflict(format!(
                "profile {name:?} is managed by auth connection {}; delete that first",
                connection.id
            )));
        }
    }
    Ok(())
}

/// The 22 bytes of a ZIP archive without entries: the state of a profile never saved.
const EMPTY_ZIP: [u8; 22] =
    [0x50, 0x4b, 0x05, 0x06, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DownloadQuery {
    /// `tar` or `tar.zst`: the same user data as a tar archive, zstd-compressed or not.
    /// Absent (or `zip`): the stored ZIP.
    #[param(inline)]
    pub format: Option<DownloadFormat>,
}

#[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
pub enum DownloadFormat {
    #[serde(rename = "zip")]
    Zip,
    #[serde(rename = "tar")]
    Tar,
    #[serde(rename = "tar.zst")]
    TarZstd,
}

/// Download the profile's stored state: Chromium user data as a ZIP (the stored format),
/// or re-packed as it streams into `format=tar` or `format=tar.zst` (empty archives while
/// the profile has none).
#[utoipa::path(get, path = "/profiles/{id_or_name}/download", params(DownloadQuery),
    responses((status = 200, description = "The archive in the format asked for", content((Vec<u8> = "application/zip"), (Vec<u8> = "application/x-tar"), (Vec<u8> = "application/zstd")))))]
pub async fn download(
    org: Org, PathParam(id_or_name): PathParam<String>,
    QueryParams(query): QueryParams<DownloadQuery>,
) -> Result<Response, ApiError> {
    let format = match query.format {
        None | Some(DownloadFormat::Zip) => None,
        Some(DownloadFormat::Tar) => Some(TarFormat::Tar),
        Some(DownloadFormat::TarZstd) => Some(TarFormat::TarZstd),
    };
    let record = find(&org, &id_or_name).await?;
    if let Some(format) = format {
        return tar_download(&org, &record, format).await;
    }
    // The id, not the name: names may hold characters a header cannot.
    let filename = format!("{}.zip", record.id);
    let body = match org.blobs.open(&record.blob_key()).await {
        // The open file stays readable even if a save replaces the blob meanwhile.
        Ok(file) => Body::from_stream(tokio_util::io::ReaderStream::new(file)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Body::from(EMPTY_ZIP.to_vec())
        }
        Err(error) => return Err(ApiError::Internal(error.into())),
    };
    Ok(crate::api::zip_attachment(&filename, None, body))
}

/// The profile's state re-packed as it streams: a tar archive, zstd-compressed or not.
async fn tar_download(
    org: &Org, record: &ProfileRecord, format: TarFormat,
) -> Result<Response, ApiError> {
    let source: Box<dyn ReadSeek> = match org.blobs.open(&record.blob_key()).await {
        Ok(file) => Box::new(file.into_std().await),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Box::new(std::io::Cursor::new(EMPTY_ZIP))
        }
        Err(error) => return Err(ApiError::Internal(error.into())),
    };
    // Each conversion holds a blocking thread while its client reads: bounded, so that
    // slow downloads cannot take the threads every file operation needs.
    let permit =
        CONVERSIONS.clone().try_acquire_owned().map_err(|_| ApiError::TooManyRequests {
            message: "too many profile downloads are being converted; retry shortly".into(),
            retry_after: std::time::Duration::from_secs(5),
        })?;
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let profile_id = record.id.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let failed = sender.clone();
        if let Err(error) = zip_to_tar(source, ChannelWriter::new(sender), format) {
            // Abandoned downloads end here too; others end the body with the error.
            tracing::debug!(profile_id, %error, "profile download ended early");
            let _ = failed.try_send(Err(error));
        }
    });
    let (extension, content_type) = match format {
        TarFormat::Tar => ("tar", "application/x-tar"),
        TarFormat::TarZstd => ("tar.zst", "application/zstd"),
    };
    let disposition = format!("attachment; filename=\"{}.{extension}\"", record.id);
    Ok((
        [(CONTENT_TYPE, content_type.to_owned()), (CONTENT_DISPOSITION, disposition)],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver)),
    )
        .into_response())
}

/// Profile downloads being re-packed at once (each holds a blocking thread).
const MAX_CONVERSIONS: usize = 16;
static CONVERSIONS: std::sync::LazyLock<std::sync::Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONVERSIONS)));

/// What `zip_to_tar` reads: a stored archive or the empty one.
trait ReadSeek: std::io::Read + std::io::Seek + Send {}
impl<T: std::io::Read + std::io::Seek + Send> ReadSeek for T {}
