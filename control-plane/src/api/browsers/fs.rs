//! The filesystem of a browser VM, `/browsers/{id}/fs/*`. Paths are absolute within the
//! VM (`/` is the VM root); the agent confines every path to that root. Uploads are
//! streamed to the agent, never held whole in memory.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use browser_agent_proto::v1::{
    DataChunk, ExtractZipChunk, ExtractZipFinish, FileInfo, SetPermissionsRequest, WriteFileChunk,
    WriteFileTarget, extract_zip_chunk, write_file_chunk,
};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tonic::Streaming;
use utoipa::{IntoParams, ToSchema};

use crate::agent::{AgentClient, AgentError};
use crate::api::error::{ApiError, ErrorBody, ErrorDetail};
use crate::api::extract::{
    JsonBody, MultipartBody, PathParam, QueryParams, capped_text, refuse_declared_over, too_large,
    unreadable_part,
};
use crate::api::org::Org;

/// Longest path accepted (the agent enforces the same).
pub const MAX_PATH_BYTES: usize = 4096;

fn check_path(field: &str, value: &str) -> Option<ErrorDetail> {
    if !value.starts_with('/') {
        Some(ErrorDetail::invalid_input(format!(
            "{field} must be an absolute path (start with /), got {value:?}"
        )))
    } else if value.len() > MAX_PATH_BYTES {
        Some(ErrorDetail::invalid_input(format!("{field} is longer than {MAX_PATH_BYTES} bytes")))
    } else {
        None
    }
}

pub(in crate::api) fn require_path(field: &str, value: Option<String>) -> Result<String, ApiError> {
    let value = value.ok_or_else(|| ApiError::invalid_field(format!("{field} is required")))?;
    match check_path(field, &value) {
        Some(problem) => Err(ApiError::invalid(vec![problem])),
        None => Ok(value),
    }
}

/// Parses an octal mode string such as `644` or `0755`.
fn parse_mode(field: &str, value: &str) -> Result<u32, ApiError> {
    let digits = value.strip_prefix("0o").unwrap_or(value);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if !digits.is_empty() && digits.len() <= 5 && mode <= 0o1777 => Ok(mode),
        Ok(mode) if !digits.is_empty() && mode <= 0o7777 => Err(ApiError::invalid_field(format!(
            "{field}: setuid and setgid bits are not allowed, got {value:?}"
        ))),
        _ => Err(ApiError::invalid_field(format!(
            "{field} must be an octal mode between 0 and 1777 (e.g. 644), got {value:?}"
        ))),
    }
}

/// A file or directory of the browser's filesystem.
#[derive(Debug, Serialize, ToSchema)]
pub struct FileInfoResponse {
    pub name: String,
    /// Absolute path within the browser VM.
    pub path: String,
    /// 0 for directories.
    pub size_bytes: u64,
    pub is_dir: bool,
    /// Type and permission bits, e.g. `drwxr-xr-x` or `-rw-r--r--`.
    pub mode: String,
    pub mod_time: DateTime<Utc>,
}

impl From<FileInfo> for FileInfoResponse {
    fn from(info: FileInfo) -> Self {
        Self {
            mode: mode_string(info.mode),
            mod_time: DateTime::from_timestamp_nanos(info.mod_time_unix_nanos),
            name: info.name,
            path: info.path,
            size_bytes: info.size_bytes,
            is_dir: info.is_dir,
        }
    }
}

/// `ls -l` style: type letter, then rwx for user, group, other.
fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        _ => '-',
    };
    let mut text = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// The streamed bytes of a file from the agent, as an HTTP body.
pub(in crate::api) fn body_of(stream: Streaming<DataChunk>) -> Body {
    Body::from_stream(stream.map(|chunk| {
        chunk
            .map(|chunk| Bytes::from(chunk.data))
            .map_err(|status| std::io::Error::other(status.message().to_owned()))
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    /// Absolute source path.
    #[schema(pattern = "^/")]
    pub src_path: String,
    /// Absolute destination path; a missing parent directory is created.
    #[schema(pattern = "^/")]
    pub dest_path: String,
}

/// Move or rename a file or directory (seed 4.1).
#[utoipa::path(put, path = "/browsers/{id}/fs/move", request_body = MoveRequest,
    responses((status = 200, description = "Move successful"), (status = 409, body = ErrorBody)))]
pub async fn move_path(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<MoveRequest>,
) -> Result<StatusCode, ApiError> {
    let problems: Vec<_> =
        [check_path("src_path", &request.src_path), check_path("dest_path", &request.dest_path)]
            .into_iter()
            .flatten()
            .collect();
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    let agent = org.agent(&id).await?;
    agent.move_path(request.src_path, request.dest_path).await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    /// Absolute path within the browser VM.
    #[param(required = true, pattern = "^/")]
    pub path: Option<String>,
}

/// Metadata of a file or directory.
#[utoipa::path(get, path = "/browsers/{id}/fs/file_info", params(PathQuery),
    responses((status = 200, body = FileInfoResponse)))]
pub async fn file_info(
    org: Org, PathParam(id): PathParam<String>, QueryParams(query): QueryParams<PathQuery>,
) -> Result<Json<FileInfoResponse>, ApiError> {
    let path = require_path("path", query.path)?;
    let agent = org.agent(&id).await?;
    Ok(Json(agent.stat(path).await?.into()))
}

/// The entries of a directory, sorted by name.
#[utoipa::path(get, path = "/browsers/{id}/fs/list_files", params(PathQuery),
    responses((status = 200, body = Vec<FileInfoResponse>)))]
pub async fn list_files(
    org: Org, PathParam(id): PathParam<String>, QueryParams(query): QueryParams<PathQuery>,
) -> Result<Json<Vec<FileInfoResponse>>, ApiError> {
    let path = require_path("path", query.path)?;
    let agent = org.agent(&id).await?;
    Ok(Json(agent.list(path).await?.into_iter().map(Into::into).collect()))
}

/// The contents of a file (`application/octet-stream`, streamed).
#[utoipa::path(get, path = "/browsers/{id}/fs/read_file", params(PathQuery),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>)))]
pub async fn read_file(
    org: Org, PathParam(id): PathParam<String>, QueryParams(query): QueryParams<PathQuery>,
) -> Result<Response, ApiError> {
    let path = require_path("path", query.path)?;
    let agent = org.agent(&id).await?;
    let stream = agent.read_file(path).await?;
    Ok(([(CONTENT_TYPE, "application/octet-stream")], body_of(stream)).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WriteQuery {
    /// Absolute path of the file to write; missing parent directories are created.
    #[param(required = true, pattern = "^/")]
    pub path: Option<String>,
    /// Octal mode of a new file, default 644.
    #[param(pattern = "^(0o)?0?[01]?[0-7]{1,3}$")]
    pub mode: Option<String>,
}

/// Write the request body to a file. The file appears whole or not at all.
#[utoipa::path(put, path = "/browsers/{id}/fs/write_file", params(WriteQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, description = "Written"), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn write_file(
    org: Org, PathParam(id): PathParam<String>, QueryParams(query): QueryParams<WriteQuery>,
    headers: HeaderMap, body: Body,
) -> Result<StatusCode, ApiError> {
    let path = require_path("path", query.path)?;
    let mode = query.mode.as_deref().map(|m| parse_mode("mode", m)).transpose()?.unwrap_or(0o644);
    let limit = org.settings.max_upload_bytes;
    refuse_declared_over(&headers, limit)?;
    let agent = org.agent(&id).await?;
    let chunks = body.into_data_stream().map(|chunk| {
        chunk.map_err(|error| {
            ApiError::invalid_field(format!("the request body could not be read: {error}"))
        })
    });
    let mut total = 0;
    write_whole_file(agent, WriteFileTarget { path, mode }, chunks, &mut total, limit).await?;
    Ok(StatusCode::OK)
}

/// Streams one file to the agent, which places it whole or not at all. `total` counts
/// the bytes of the request so far, against `limit`.
pub(in crate::api) async fn write_whole_file(
    agent: AgentClient, target: WriteFileTarget,
    chunks: impl futures::Stream<Item = Result<Bytes, ApiError>>, total: &mut u64, limit: u64,
) -> Result<(), ApiError> {
    let (sender, receiver) = mpsc::channel(8);
    let call = tokio::spawn(async move { agent.write_file(receiver).await });
    let fed = async {
        let send = |kind| sender.send(WriteFileChunk { kind: Some(kind) });
        send(write_file_chunk::Kind::Target(target)).await.map_err(|_| FeedError::AgentGone)?;
        let mut chunks = std::pin::pin!(chunks);
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(FeedError::Client)?;
            *total += chunk.len() as u64;
            if *total > limit {
                return Err(FeedError::TooLarge);
            }
            send(write_file_chunk::Kind::Data(chunk.to_vec()))
                .await
                .map_err(|_| FeedError::AgentGone)?;
        }
        send(write_file_chunk::Kind::Commit(Default::default()))
            .await
            .map_err(|_| FeedError::AgentGone)
    }
    .await;
    // Without the commit message the agent discards what it received.
    drop(sender);
    finish_upload(fed, call, limit).await
}

enum FeedError {
    TooLarge,
    /// The client's request is at fault.
    Client(ApiError),
    /// The agent ended the call early; its answer says why.
    AgentGone,
}

async fn finish_upload<T>(
    fed: Result<(), FeedError>, call: tokio::task::JoinHandle<Result<T, AgentError>>, limit: u64,
) -> Result<T, ApiError> {
    match fed {
        Err(FeedError::TooLarge) => {
            call.abort();
            Err(too_large(limit))
        }
        Err(FeedError::Client(error)) => {
            call.abort();
            Err(error)
        }
        Ok(()) | Err(FeedError::AgentGone) => call
            .await
            .map_err(|error| ApiError::Internal(anyhow::anyhow!("upload task failed: {error}")))?
            .map_err(ApiError::from),
    }
}

/// The parts of `POST /browsers/{id}/fs/upload_zip` (described for the OpenAPI document).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct UploadZipForm {
    #[schema(value_type = String, format = Binary)]
    zip_file: Vec<u8>,
    /// Absolute directory to extract into (created if missing).
    #[schema(pattern = "^/")]
    dest_path: String,
}

/// Upload a ZIP archive and extract it at `dest_path` (seed 4.8). Multipart parts
/// `zip_file` (the archive) and `dest_path`. The archive is checked whole before anything
/// is placed: a failure leaves the destination as it was.
#[utoipa::path(post, path = "/browsers/{id}/fs/upload_zip",
    request_body(content = UploadZipForm, content_type = "multipart/form-data"),
    responses((status = 200, description = "Uploaded and extracted"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn upload_zip(
    org: Org, PathParam(id): PathParam<String>, headers: HeaderMap,
    MultipartBody(mut multipart): MultipartBody,
) -> Result<StatusCode, ApiError> {
    let limit = org.settings.max_upload_bytes;
    refuse_declared_over(&headers, limit)?;
    let agent = org.agent(&id).await?;
    let (sender, receiver) = mpsc::channel(8);
    let call = tokio::spawn(async move { agent.extract_zip(receiver).await });
    let mut dest_path = None;
    let mut archive_seen = false;
    let fed = async {
        let multipart_error = |error| FeedError::Client(unreadable_part(error));
        let mut total: u64 = 0;
        while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
            match field.name() {
                Some("dest_path") => {
                    // Capped: this part is not counted against the upload limit.
                    let text = capped_text(&mut field, "dest_path", MAX_PATH_BYTES)
                        .await
                        .map_err(FeedError::Client)?;
                    dest_path = Some(text);
                }
                Some("zip_file") if !archive_seen => {
                    archive_seen = true;
                    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                        total += chunk.len() as u64;
                        if total > limit {
                            return Err(FeedError::TooLarge);
                        }
                        let data = ExtractZipChunk {
                            kind: Some(extract_zip_chunk::Kind::Data(chunk.to_vec())),
                        };
                        if sender.send(data).await.is_err() {
                            return Err(FeedError::AgentGone);
                        }
                    }
                }
                Some("zip_file") => {
                    return Err(FeedError::Client(ApiError::invalid_field(
                        "only one zip_file part is allowed",
                    )));
                }
                other => {
                    return Err(FeedError::Client(ApiError::invalid_field(format!(
                        "unexpected multipart part {:?}",
                        other.unwrap_or("")
                    ))));
                }
            }
        }
        Ok(())
    }
    .await;
    let fed = match fed {
        Ok(()) => {
            let dest_path = match (archive_seen, dest_path) {
                (false, _) => {
                    Err(ApiError::invalid_field("zip_file: the archive part is required"))
                }
                (true, dest_path) => require_path("dest_path", dest_path),
            };
            match dest_path {
                Ok(dest_path) => {
                    let finish = ExtractZipFinish { dest_path };
                    let message =
                        ExtractZipChunk { kind: Some(extract_zip_chunk::Kind::Finish(finish)) };
                    sender.send(message).await.map_err(|_| FeedError::AgentGone)
                }
                Err(error) => {
                    call.abort();
                    return Err(error);
                }
            }
        }
        failed => failed,
    };
    // Without `finish` the agent discards the upload.
    drop(sender);
    finish_upload(fed, call, limit).await?;
    Ok(StatusCode::OK)
}

/// A ZIP archive of a directory (streamed).
#[utoipa::path(get, path = "/browsers/{id}/fs/download_dir_zip", params(PathQuery),
    responses((status = 200, content_type = "application/zip", body = Vec<u8>)))]
pub async fn download_dir_zip(
    org: Org, PathParam(id): PathParam<String>, QueryParams(query): QueryParams<PathQuery>,
) -> Result<Response, ApiError> {
    let path = require_path("path", query.path)?;
    let name =
        path.trim_end_matches('/').rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("root");
    let disposition = format!("attachment; filename=\"{}.zip\"", name.replace(['"', '\\'], "_"));
    let agent = org.agent(&id).await?;
    let stream = agent.zip_directory(path.clone()).await?;
    Ok((
        [(CONTENT_TYPE, "application/zip".to_owned()), (CONTENT_DISPOSITION, disposition)],
        body_of(stream),
    )
        .into_response())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDirectoryRequest {
    #[schema(pattern = "^/")]
    pub path: String,
    /// Octal mode, default 755. Missing parents are created; an existing directory is fine.
    #[schema(pattern = "^(0o)?0?[01]?[0-7]{1,3}$")]
    pub mode: Option<String>,
}

/// Create a directory (and its parents).
#[utoipa::path(put, path = "/browsers/{id}/fs/create_directory",
    request_body = CreateDirectoryRequest,
    responses((status = 200, description = "Created"), (status = 409, body = ErrorBody)))]
pub async fn create_directory(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<CreateDirectoryRequest>,
) -> Result<StatusCode, ApiError> {
    let path = require_path("path", Some(request.path))?;
    let mode = request.mode.as_deref().map(|m| parse_mode("mode", m)).transpose()?.unwrap_or(0o755);
    org.agent(&id).await?.create_directory(path, mode).await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteRequest {
    #[schema(pattern = "^/")]
    pub path: String,
}

/// Delete a file (or symlink).
#[utoipa::path(put, path = "/browsers/{id}/fs/delete_file", request_body = DeleteRequest,
    responses((status = 200, description = "Deleted")))]
pub async fn delete_file(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<DeleteRequest>,
) -> Result<StatusCode, ApiError> {
    let path = require_path("path", Some(request.path))?;
    org.agent(&id).await?.delete_path(path, false).await?;
    Ok(StatusCode::OK)
}

/// Delete a directory and everything in it.
#[utoipa::path(put, path = "/browsers/{id}/fs/delete_directory", request_body = DeleteRequest,
    responses((status = 200, description = "Deleted")))]
pub async fn delete_directory(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<DeleteRequest>,
) -> Result<StatusCode, ApiError> {
    let path = require_path("path", Some(request.path))?;
    org.agent(&id).await?.delete_path(path, true).await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPermissionsBody {
    #[schema(pattern = "^/")]
    pub path: String,
    /// Octal mode, e.g. 644.
    #[schema(pattern = "^(0o)?0?[01]?[0-7]{1,3}$")]
    pub mode: String,
    /// User name or uid.
    pub owner: Option<String>,
    /// Group name or gid.
    pub group: Option<String>,
}

/// Change the mode (and optionally owner and group) of a file or directory.
#[utoipa::path(put, path = "/browsers/{id}/fs/set_file_permissions",
    request_body = SetPermissionsBody,
    responses((status = 200, description = "Changed")))]
pub async fn set_file_permissions(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<SetPermissionsBody>,
) -> Result<StatusCode, ApiError> {
    let path = require_path("path", Some(request.path))?;
    let mode = parse_mode("mode", &request.mode)?;
    let request = SetPermissionsRequest {
        path,
        mode,
        owner: request.owner.unwrap_or_default(),
        group: request.group.unwrap_or_default(),
    };
    org.agent(&id).await?.set_permissions(request).await?;
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_and_bounded() {
        assert_eq!(parse_mode("mode", "644").ok(), Some(0o644));
        assert_eq!(parse_mode("mode", "0755").ok(), Some(0o755));
        assert_eq!(parse_mode("mode", "1777").ok(), Some(0o1777));
        for bad in ["", "9", "rwx", "77777", "-1", "4755", "2755"] {
            assert!(parse_mode("mode", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn modes_print_like_ls() {
        assert_eq!(mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(libc::S_IFREG | 0o640), "-rw-r-----");
    }
}
