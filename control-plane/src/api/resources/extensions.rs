//! An organization's extension library: `/extensions` (seed 4.11, 4.12). Archives live in
//! the blob store; records in the store. Lookups by `{id_or_name}` try the id first.

use axum::Json;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody, OrNotFound};
use crate::api::extract::{MultipartBody, PathParam, QueryParams, capped_text, unreadable_part};
use crate::api::org::Org;
use crate::api::paging::{NamedListQuery, Paging};
use crate::ids::{self, MAX_NAME_BYTES, name_problem};
use crate::store::{ExtensionRecord, StoreError};

/// A browser extension stored for an organization.
#[derive(Debug, Serialize, ToSchema)]
pub struct Extension {
    pub id: String,
    pub created_at: DateTime<Utc>,
    /// Size of the archive in bytes.
    pub size_bytes: i64,
    /// Unique within the organization.
    pub name: Option<String>,
    /// When it was last loaded into a browser.
    pub last_used_at: Option<DateTime<Utc>>,
}

impl From<ExtensionRecord> for Extension {
    fn from(record: ExtensionRecord) -> Self {
        Self {
            id: record.id,
            created_at: record.created_at,
            size_bytes: record.size_bytes,
            name: record.name,
            last_used_at: record.last_used_at,
        }
    }
}

/// Where an unpacked extension's manifest is: `manifest.json` at the root of the archive,
/// or inside its single top-level folder. Blocking.
pub fn find_manifest(archive: std::fs::File) -> Result<(), String> {
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(archive))
        .map_err(|error| format!("not a readable ZIP archive: {error}"))?;
    // What a browser's agent would refuse to unpack is refused now, not at first use.
    for index in 0..archive.len() {
        let entry = archive
            .by_index(index)
            .map_err(|error| format!("not a readable ZIP archive: {error}"))?;
        let raw = entry.name().map(|name| name.into_owned()).unwrap_or_default();
        if raw.starts_with(['/', '\\']) || entry.enclosed_name().is_none() {
            return Err(format!("entry {raw:?} would land outside the extension's directory"));
        }
        if entry.is_symlink() {
            return Err(format!("entry {raw:?} is a symlink; extensions cannot contain symlinks"));
        }
    }
    let names: Vec<String> = archive
        .file_names()
        .map(|name| name.map(|name| name.into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|error| format!("not a readable ZIP archive: {error}"))?;
    if names.iter().any(|name| name == "manifest.json") {
        return Ok(());
    }
    let tops: std::collections::HashSet<&str> = names
        .iter()
        .filter_map(|name| name.split('/').next())
        .filter(|top| !top.is_empty())
        .collect();
    match tops.into_iter().collect::<Vec<_>>().as_slice() {
        [single] if names.contains(&format!("{single}/manifest.json")) => Ok(()),
        _ => {
            Err("the archive has no manifest.json at its root or in a single top-level folder"
                .into())
        }
    }
}

/// The parts of an extension upload (described for the OpenAPI document).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ExtensionUploadForm {
    /// A ZIP of an unpacked extension (its `manifest.json` at the top or in one folder).
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    /// Unique in the organization, `^[A-Za-z0-9._-]{1,255}$`; default: from the manifest.
    #[schema(schema_with = crate::api::openapi::resource_name)]
    name: Option<String>,
}

/// The parts of `POST /browsers/{id}/extensions`, by position (`extensions[N][…]` by
/// index works too).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct LoadExtensionsForm {
    #[schema(rename = "extensions[][name]", schema_with = crate::api::openapi::resource_name)]
    name: String,
    /// A ZIP of an unpacked extension.
    #[schema(rename = "extensions[][zip_file]", value_type = String, format = Binary)]
    zip_file: Vec<u8>,
}

/// Upload an extension (multipart parts `file`, a ZIP of an unpacked extension, and an
/// optional `name`).
#[utoipa::path(post, path = "/extensions",
    request_body(content = ExtensionUploadForm, content_type = "multipart/form-data"),
    responses((status = 200, body = Extension), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn upload(
    org: Org, MultipartBody(mut multipart): MultipartBody,
) -> Result<Json<Extension>, ApiError> {
    let limit = org.settings.max_extension_bytes;
    let too_large =
        || ApiError::PayloadTooLarge(format!("extension archives are limited to {limit} bytes"));
    let mut name = None;
    let mut archive: Option<(tempfile::NamedTempFile, u64)> = None;
    while let Some(mut field) = multipart.next_field().await.map_err(unreadable_part)? {
        match field.name() {
            Some("name") => name = Some(capped_text(&mut field, "name", MAX_NAME_BYTES).await?),
            Some("file") if archive.is_none() => {
                let temporary =
                    org.blobs.incoming().map_err(|error| ApiError::Internal(error.into()))?;
                let mut out = tokio::fs::File::from_std(
                    temporary.reopen().map_err(|error| ApiError::Internal(error.into()))?,
                );
                let mut size: u64 = 0;
                while let Some(chunk) = field.chunk().await.map_err(unreadable_part)? {
                    size += chunk.len() as u64;
                    if size > limit {
                        return Err(too_large());
                    }
                    out.write_all(&chunk)
                        .await
                        .map_err(|error| ApiError::Internal(error.into()))?;
                }
                out.flush().await.map_err(|error| ApiError::Internal(error.into()))?;
                archive = Some((temporary, size));
            }
            Some("file") => return Err(ApiError::invalid_field("only one file part is allowed")),
            other => {
                return Err(ApiError::invalid_field(format!(
                    "unexpected multipart part {:?}; expected file and name",
                    other.unwrap_or("")
                )));
            }
        }
    }
    let (temporary, size) =
        archive.ok_or_else(|| ApiError::invalid_field("file: the archive part is required"))?;
    if let Some(problem) = name.as_deref().and_then(|name| name_problem("name", name)) {
        return Err(ApiError::invalid_field(problem));
    }
    let record = store_archive(org, name, temporary, size).await?;
    Ok(Json(record.into()))
}

/// Checks that `temporary` (an archive of `size` bytes) is an extension, then stores it
/// in the organization's library under `name`.
pub(in crate::api) async fn store_archive(
    org: Org, name: Option<String>, temporary: tempfile::NamedTempFile, size: u64,
) -> Result<ExtensionRecord, ApiError> {
    let readable = temporary.reopen().map_err(|error| ApiError::Internal(error.into()))?;
    tokio::task::spawn_blocking(move || find_manifest(readable))
        .await
        .map_err(|error| ApiError::Internal(error.into()))?
        .map_err(|problem| ApiError::invalid_field(format!("file: {problem}")))?;

    let id = ids::new_id("ext");
    let record = ExtensionRecord {
        blob_key: format!("extensions/{id}.zip"),
        id,
        org_id: org.id.clone(),
        name,
        size_bytes: size as i64,
        created_at: Utc::now(),
        last_used_at: None,
    };
    // Blob and record are stored by a task of their own: a client that goes away in
    // between must not leave a blob without a record.
    let stored = tokio::spawn(async move {
        org.blobs
            .put(&record.blob_key, temporary)
            .await
            .map_err(|error| ApiError::Internal(error.into()))?;
        if let Err(error) = org.store.insert_extension(&record).await {
            let _ = org.blobs.delete(&record.blob_key).await;
            return Err(match error {
                StoreError::Conflict(_) => ApiError::Conflict(format!(
                    "an extension named {:?} already exists",
                    record.name.unwrap_or_default()
                )),
                other => other.into(),
            });
        }
        Ok(record)
    });
    stored.await.map_err(|error| ApiError::Internal(error.into()))?
}

/// The organization's extensions, oldest first (seed 4.12), paged with `limit`/`offset`.
#[utoipa::path(get, path = "/extensions", params(NamedListQuery),
    responses((status = 200, body = Vec<Extension>)))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<NamedListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let records = org.store.list_extensions(&org.id).await?;
    let (headers, page) = query.page_or_all(paging, records, |e| (&e.id, e.name.as_deref()))?;
    let body: Vec<Extension> = page.into_iter().map(Into::into).collect();
    Ok((headers, Json(body)))
}

async fn find(org: &Org, id_or_name: &str) -> Result<ExtensionRecord, ApiError> {
    let found = org.store.extension(&org.id, id_or_name).await?;
    found.or_not_found("extension", id_or_name)
}

/// Download the archive exactly as uploaded (seed 4.11).
#[utoipa::path(get, path = "/extensions/{id_or_name}",
    responses((status = 200, content_type = "application/zip", body = Vec<u8>)))]
pub async fn download(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<Response, ApiError> {
    let record = find(&org, &id_or_name).await?;
    let file = open_archive(&org, &record, &id_or_name).await?;
    let filename = format!("{}.zip", record.name.as_deref().unwrap_or(&record.id));
    Ok(crate::api::zip_attachment(
        &filename,
        Some(record.size_bytes),
        Body::from_stream(tokio_util::io::ReaderStream::new(file)),
    ))
}

/// The extension's archive as uploaded; 404 if it was deleted since it was looked up.
async fn open_archive(
    org: &Org, record: &ExtensionRecord, id_or_name: &str,
) -> Result<tokio::fs::File, ApiError> {
    org.blobs.open(&record.blob_key).await.map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => ApiError::not_found("extension", id_or_name),
        _ => ApiError::Internal(error.into()),
    })
}

/// An extension's metadata with the SHA-256 of its archive.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExtensionMetadata {
    #[serde(flatten)]
    pub extension: Extension,
    /// Hex SHA-256 of the archive as uploaded.
    pub checksum: String,
}

/// An extension's metadata, with the checksum of its archive.
#[utoipa::path(get, path = "/extensions/{id_or_name}/metadata",
    responses((status = 200, body = ExtensionMetadata)))]
pub async fn metadata(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<Json<ExtensionMetadata>, ApiError> {
    use sha2::Digest;
    use tokio::io::AsyncReadExt;

    let record = find(&org, &id_or_name).await?;
    let mut file = open_archive(&org, &record, &id_or_name).await?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read =
            file.read(&mut buffer).await.map_err(|error| ApiError::Internal(error.into()))?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(Json(ExtensionMetadata {
        checksum: hex::encode(hasher.finalize()),
        extension: record.into(),
    }))
}

/// Delete an extension from the library. Browsers that loaded it keep it.
#[utoipa::path(delete, path = "/extensions/{id_or_name}", responses((status = 204)))]
pub async fn delete(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    let record = find(&org, &id_or_name).await?;
    if !org.store.delete_extension(&org.id, &record.id).await? {
        return Err(ApiError::not_found("extension", &id_or_name));
    }
    if let Err(error) = org.blobs.delete(&record.blob_key).await {
        tracing::warn!(%error, blob = %record.blob_key, "could not delete an extension archive");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Where an extension part of `POST /browsers/{id}/extensions` belongs. The Python SDK
/// sends `extensions[][name]` parts, then `extensions[][zip_file]` parts (paired by
/// position); the TypeScript SDK sends `extensions[N][name]` and `extensions[N][zip_file]`
/// (paired by index).
#[derive(Debug, PartialEq, Eq)]
enum ExtensionPart {
    Name(Option<String>),
    Archive(Option<String>),
}

fn extension_part(field: &str) -> Option<ExtensionPart> {
    let rest = field.strip_prefix("extensions[")?;
    let (index, rest) = rest.split_once(']')?;
    let index = match index {
        "" => None,
        digits if digits.len() <= 4 && digits.bytes().all(|b| b.is_ascii_digit()) => {
            Some(digits.to_owned())
        }
        _ => return None,
    };
    match rest {
        "[name]" => Some(ExtensionPart::Name(index)),
        "[zip_file]" => Some(ExtensionPart::Archive(index)),
        _ => None,
    }
}

/// The agent-side slot of a part: `i<N>` for an indexed part, `p<k>` for the k-th
/// positional part of its kind (names and archives are counted separately).
fn slot_of(index: Option<String>, positional_count: &mut usize) -> String {
    index.map(|n| format!("i{n}")).unwrap_or_else(|| {
        *positional_count += 1;
        format!("p{}", *positional_count - 1)
    })
}

/// Upload unpacked extensions into a running browser (seed 4.7). Chromium restarts with
/// every extension loaded so far; the answer comes once its new DevTools endpoint
/// answers. Open CDP connections are closed by the restart.
#[utoipa::path(post, path = "/browsers/{id}/extensions",
    request_body(content = LoadExtensionsForm, content_type = "multipart/form-data", description = "`extensions[][name]` + `extensions[][zip_file]` (by position) or `extensions[N][name]` + `extensions[N][zip_file]` (by index)"),
    responses((status = 200, description = "Loaded; the browser has restarted"),
        (status = 413, body = ErrorBody)))]
pub async fn load_into_browser(
    org: Org, PathParam(id): PathParam<String>, MultipartBody(mut multipart): MultipartBody,
) -> Result<StatusCode, ApiError> {
    use browser_agent_proto::v1::{
        ExtensionName, ExtensionUploadChunk, extension_upload_chunk::Kind,
    };

    let agent = org.agent(&id).await?;
    let limit = org.settings.max_extension_bytes;
    let (sender, receiver) = tokio::sync::mpsc::channel(8);
    let call = tokio::spawn(async move { agent.load_extensions(receiver).await });
    let send = |kind| {
        let sender = sender.clone();
        async move { sender.send(ExtensionUploadChunk { kind: Some(kind) }).await.is_ok() }
    };
    let (mut names_by_position, mut archives_by_position) = (0usize, 0usize);
    let mut slots = std::collections::HashSet::new();
    let mut named = std::collections::HashSet::new();
    let fed: Result<(), ApiError> = async {
        while let Some(mut field) = multipart.next_field().await.map_err(unreadable_part)? {
            let field_name = field.name().unwrap_or_default().to_owned();
            let part = extension_part(&field_name).ok_or_else(|| {
                ApiError::invalid_field(format!(
                    "unexpected multipart part {field_name:?}; expected extensions[][name] and extensions[][zip_file]"
                ))
            })?;
            match part {
                ExtensionPart::Name(index) => {
                    let slot = slot_of(index, &mut names_by_position);
                    let name = capped_text(&mut field, &field_name, MAX_NAME_BYTES).await?;
                    if let Some(problem) = name_problem(&field_name, &name) {
                        return Err(ApiError::invalid_field(problem));
                    }
                    named.insert(slot.clone());
                    if named.len() > crate::sessions::MAX_EXTENSIONS {
                        return Err(ApiError::invalid_field(format!(
                            "at most {} extensions per call",
                            crate::sessions::MAX_EXTENSIONS
                        )));
                    }
                    if !send(Kind::Name(ExtensionName { slot, name })).await {
                        return Ok(());
                    }
                }
                ExtensionPart::Archive(index) => {
                    let slot = slot_of(index, &mut archives_by_position);
                    if !slots.insert(slot.clone()) {
                        return Err(ApiError::invalid_field(format!("{field_name} appears twice")));
                    }
                    if slots.len() > crate::sessions::MAX_EXTENSIONS {
                        return Err(ApiError::invalid_field(format!(
                            "at most {} extensions per call",
                            crate::sessions::MAX_EXTENSIONS
                        )));
                    }
                    if !send(Kind::BeginSlot(slot)).await {
                        return Ok(());
                    }
                    let mut size = 0u64;
                    while let Some(chunk) = field.chunk().await.map_err(unreadable_part)? {
                        size += chunk.len() as u64;
                        if size > limit {
                            return Err(ApiError::PayloadTooLarge(format!("extension archives are limited to {limit} bytes")));
                        }
                        if !send(Kind::Data(chunk.to_vec())).await {
                            return Ok(());
                        }
                    }
                }
            }
        }
        if slots.is_empty() {
            return Err(ApiError::invalid_field("extensions: at least one extensions[][zip_file] is required"));
        }
        if let Some(slot) = slots.iter().find(|slot| !named.contains(*slot)) {
            return Err(ApiError::invalid_field(format!("the extension in slot {slot} has no name")));
        }
        if let Some(slot) = named.iter().find(|slot| !slots.contains(*slot)) {
            return Err(ApiError::invalid_field(format!("the name in slot {slot} has no zip_file")));
        }
        send(Kind::Commit(Default::default())).await;
        Ok(())
    }
    .await;
    // Without `commit` the agent changes nothing.
    drop(sender);
    if let Err(error) = fed {
        call.abort();
        return Err(error);
    }
    call.await.map_err(|error| ApiError::Internal(error.into()))??;
    org.sessions.touch(&id);
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod part_tests {
    use super::*;

    #[test]
    fn both_sdk_encodings_are_recognised() {
        assert_eq!(extension_part("extensions[][name]"), Some(ExtensionPart::Name(None)));
        assert_eq!(extension_part("extensions[][zip_file]"), Some(ExtensionPart::Archive(None)));
        assert_eq!(
            extension_part("extensions[3][name]"),
            Some(ExtensionPart::Name(Some("3".into())))
        );
        assert_eq!(
            extension_part("extensions[0][zip_file]"),
            Some(ExtensionPart::Archive(Some("0".into())))
        );
        for other in ["extensions", "extensions[x][name]", "extensions[][other]", "zip_file"] {
            assert_eq!(extension_part(other), None, "{other}");
        }
    }
}
