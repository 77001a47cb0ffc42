//! `/deployments` and `/apps`: deploy an app's source (a ZIP upload, or a git
//! repository), follow its build, and list the apps and actions that deployments
//! published. The build itself is `crate::apps`.

use std::collections::{BTreeMap, HashMap};

use axum::Json;
use axum::extract::multipart::Field;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use sha2::Digest;
use utoipa::ToSchema;

use super::events::{self, Since};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{
    MultipartBody, PathParam, QueryParams, capped_text, declared_length, too_large, unreadable_part,
};
use crate::api::org::Org;
use crate::api::paging::list_query;
use crate::api::paging::{Paging, page_of};
use crate::apps::views::{self, AppVersion, Deployment};
use crate::apps::{DeploymentDocument, GitSource, NewDeployment, NewSource};
use crate::ids;

/// Largest app archive.
const MAX_ARCHIVE_BYTES: u64 = 200 * 1024 * 1024;
/// Largest text part.
const MAX_TEXT_PART_BYTES: usize = 64 * 1024;
/// Most parts a deployment's form may have (the route has no body limit).
const MAX_PARTS: usize = 256;

/// The multipart fields of `POST /deployments` (nested objects as `env_vars[NAME]` and
/// `source[url]`, as the SDKs send them).
#[allow(dead_code)] // documents the form
#[derive(ToSchema)]
pub struct DeploymentForm {
    /// ZIP of the app's directory (or of one folder holding it). Either this or `source`.
    #[schema(value_type = String, format = Binary)]
    file: Option<Vec<u8>>,
    /// The entrypoint's path inside the app: a Python (`.py`), JavaScript (`.js`, `.mjs`,
    /// `.cjs`) or TypeScript (`.ts`, `.mts`) file. Required with `file`.
    entrypoint_rel_path: Option<String>,
    /// Version label, 1 to 64 of `[A-Za-z0-9._-]` (default `latest`).
    version: Option<String>,
    /// `true` replaces an app already deployed at this version.
    force: Option<bool>,
    /// `aws.us-east-1a`, the only region.
    region: Option<String>,
    /// Environment variables of the app's actions, as `env_vars[NAME]` parts. Their values
    /// are never returned.
    env_vars: Option<BTreeMap<String, String>>,
    /// A git repository: `source[type]=github`, `source[url]`, `source[ref]`,
    /// `source[entrypoint]`, optional `source[path]` and `source[auth][token]`.
    source: Option<BTreeMap<String, String>>,
}

struct Form {
    archive: Option<(std::path::PathBuf, String)>,
    entrypoint_rel_path: Option<String>,
    version: Option<String>,
    force: bool,
    env_vars: BTreeMap<String, String>,
    source: BTreeMap<String, String>,
}

/// Deploy an app: its build runs in the background (follow it with
/// `GET /deployments/{id}/events`); the answer is the deployment, `queued`.
#[utoipa::path(post, path = "/deployments",
    request_body(content = DeploymentForm, content_type = "multipart/form-data"),
    responses((status = 200, body = Deployment), (status = 413, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn create(
    org: Org, headers: HeaderMap, MultipartBody(mut multipart): MultipartBody,
) -> Result<Json<Deployment>, ApiError> {
    if declared_length(&headers).is_some_and(|length| length > MAX_ARCHIVE_BYTES + (1 << 20)) {
        return Err(too_large(MAX_ARCHIVE_BYTES));
    }
    let uploads = org.apps.upload_dir()?;
    let mut form = Form {
        archive: None,
        entrypoint_rel_path: None,
        version: None,
        force: false,
        env_vars: BTreeMap::new(),
        source: BTreeMap::new(),
    };
    let read = read_form(&mut multipart, &uploads, &mut form).await;
    let remove_archive = |form: &Form| {
        if let Some((path, _)) = &form.archive {
            let _ = std::fs::remove_file(path);
        }
    };
    if let Err(error) = read {
        remove_archive(&form);
        return Err(error);
    }
    let new = match into_deployment(&mut form) {
        Ok(new) => new,
        Err(error) => {
            remove_archive(&form);
            return Err(error);
        }
    };
    let record = org.apps.deploy(&org.id, new).await;
    remove_archive(&form);
    Ok(Json(views::deployment(&record?)))
}

async fn read_form(
    multipart: &mut axum::extract::Multipart, uploads: &std::path::Path, form: &mut Form,
) -> Result<(), ApiError> {
    let mut parts = 0;
    while let Some(mut field) = multipart.next_field().await.map_err(unreadable_part)? {
        parts += 1;
        if parts > MAX_PARTS {
            return Err(ApiError::invalid_field(format!(
                "a deployment's form has at most {MAX_PARTS} parts"
            )));
        }
        let name = field.name().unwrap_or_default().to_owned();
        if name == "file" {
            if form.archive.is_some() {
                return Err(ApiError::invalid_field("file is given twice"));
            }
            std::fs::create_dir_all(uploads).map_err(|e| ApiError::Internal(e.into()))?;
            let path = uploads.join(format!("{}.zip", ids::random_lowercase(20)));
            form.archive = Some((path.clone(), String::new()));
            let checksum = save_archive(&mut field, &path).await?;
            form.archive = Some((path, checksum));
            continue;
        }
        let value = capped_text(&mut field, &name, MAX_TEXT_PART_BYTES).await?;
        match name.as_str() {
            "entrypoint_rel_path" => form.entrypoint_rel_path = Some(value),
            "version" => form.version = Some(value),
            "force" => {
                form.force = match value.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(ApiError::invalid_field("force must be true or false")),
                }
            }
            "region" => {
                if value != crate::apps::REGION {
                    return Err(ApiError::invalid_field(format!(
                        "region must be {}",
                        crate::apps::REGION
                    )));
                }
            }
            _ => {
                if let Some(variable) =
                    name.strip_prefix("env_vars[").and_then(|rest| rest.strip_suffix(']'))
                {
                    form.env_vars.insert(variable.to_owned(), value);
                } else if let Some(key) = name.strip_prefix("source[") {
                    let key = key.replacen("][", ".", 1);
                    let key = key.strip_suffix(']').unwrap_or(&key).to_owned();
                    form.source.insert(key, value);
                } else {
                    return Err(ApiError::invalid_field(format!(
                        "unexpected multipart part {name:?}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Streams the archive to `path` (at most `MAX_ARCHIVE_BYTES`); answers its SHA-256.
async fn save_archive(field: &mut Field<'_>, path: &std::path::Path) -> Result<String, ApiError> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::File::create(path).await.map_err(|e| ApiError::Internal(e.into()))?;
    let mut digest = sha2::Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = field.chunk().await.map_err(unreadable_part)? {
        size += chunk.len() as u64;
        if size > MAX_ARCHIVE_BYTES {
            return Err(too_large(MAX_ARCHIVE_BYTES));
        }
        digest.update(&chunk);
        file.write_all(&chunk).await.map_err(|e| ApiError::Internal(e.into()))?;
    }
    file.flush().await.map_err(|e| ApiError::Internal(e.into()))?;
    Ok(hex::encode(digest.finalize()))
}

fn into_deployment(form: &mut Form) -> Result<NewDeployment, ApiError> {
    let version = form.version.clone().unwrap_or_else(|| "latest".into());
    let env_vars = std::mem::take(&mut form.env_vars);
    let source = std::mem::take(&mut form.source);
    match (&form.archive, source.is_empty()) {
        (Some(_), false) => Err(ApiError::invalid_field("give either file or source, not both")),
        (None, true) => Err(ApiError::invalid_field("give file (a ZIP of the app) or source")),
        (Some((archive, checksum)), true) => {
            let entrypoint_rel_path = form.entrypoint_rel_path.clone().ok_or_else(|| {
                ApiError::invalid_field("entrypoint_rel_path is required with file")
            })?;
            Ok(NewDeployment {
                source: NewSource::Upload { archive: archive.clone(), checksum: checksum.clone() },
                entrypoint_rel_path,
                version,
                env_vars,
                force: form.force,
            })
        }
        (None, false) => {
            let allowed = ["type", "url", "ref", "path", "entrypoint", "auth.token", "auth.method"];
            if let Some(unknown) = source.keys().find(|key| !allowed.contains(&key.as_str())) {
                return Err(ApiError::invalid_field(format!("source: unknown field {unknown}")));
            }
            let field = |name: &str| {
                source
                    .get(name)
                    .cloned()
                    .ok_or_else(|| ApiError::invalid_field(format!("source.{name} is required")))
            };
            if field("type")? != "github" {
                return Err(ApiError::invalid_field("source.type must be github"));
            }
            if let Some(method) = source.get("auth.method")
                && method != "github_token"
            {
                return Err(ApiError::invalid_field("source.auth.method must be github_token"));
            }
            let path = source
                .get("path")
                .map(|path| path.trim_matches('/').to_owned())
                .filter(|path| !path.is_empty() && path != ".");
            Ok(NewDeployment {
                source: NewSource::Git(GitSource {
                    url: field("url")?,
                    git_ref: field("ref")?,
                    path,
                    token: source.get("auth.token").cloned(),
                }),
                // Relative to `path`, whose files are the app's.
                entrypoint_rel_path: field("entrypoint")?,
                version,
                env_vars,
                force: form.force,
            })
        }
    }
}

list_query! {
    /// `app_name`, `app_version`, `query`, `limit` and `offset`.
    pub struct DeploymentListQuery {
        /// Only deployments that published this app.
        pub app_name: Option<String>,
        /// Only deployments of this version (with `app_name`).
        pub app_version: Option<String>,
        /// Only deployments whose id is this, or whose apps' names contain this text.
        pub query: Option<String>,
    }
}

/// List the organization's deployments, newest first (paged).
#[utoipa::path(get, path = "/deployments", params(DeploymentListQuery),
    responses((status = 200, body = Vec<Deployment>)))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<DeploymentListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let mut records = org.store.list_deployments(&org.id).await?;
    records.reverse();
    records.retain(|record| {
        let document = DeploymentDocument::of(record);
        let names = || document.apps.iter().map(|app| app.name.as_str());
        query.app_name.as_ref().is_none_or(|name| names().any(|n| n == name))
            && query.app_version.as_ref().is_none_or(|version| &document.version == version)
            && query.query.as_ref().filter(|q| !q.is_empty()).is_none_or(|text| {
                record.id == *text
                    || names().any(|n| n.to_lowercase().contains(&text.to_lowercase()))
            })
    });
    let (headers, page) = page_of(paging, records, query.limit, query.offset)?;
    let body: Vec<Deployment> = page.iter().map(views::deployment).collect();
    Ok((headers, Json(body)))
}

/// Get a deployment.
#[utoipa::path(get, path = "/deployments/{id}", responses((status = 200, body = Deployment)))]
pub async fn retrieve(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<Deployment>, ApiError> {
    Ok(Json(views::deployment(&org.apps.deployment(&org.id, &id).await?)))
}

/// Delete a deployment: its build stops, its running invocations end (failed), its apps
/// are no longer listed or invocable, and its files are removed.
#[utoipa::path(delete, path = "/deployments/{id}", responses((status = 204)))]
pub async fn delete(org: Org, PathParam(id): PathParam<String>) -> Result<StatusCode, ApiError> {
    org.apps.delete_deployment(&org.id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Follow a deployment: server-sent `log` events (the build's output), `deployment_state`
/// events, an `app_version_summary` per published app, and `sse_heartbeat` every 5 s; the
/// stream ends once the deployment is running, failed or stopped.
#[utoipa::path(get, path = "/deployments/{id}/events", params(Since),
    responses((status = 200, content_type = "text/event-stream", body = String)))]
pub async fn events(
    org: Org, PathParam(id): PathParam<String>, QueryParams(since): QueryParams<Since>,
) -> Result<impl IntoResponse, ApiError> {
    let since = since.parse()?;
    let record = org.apps.deployment(&org.id, &id).await?;
    let current = views::deployment_state_event(&record);
    Ok(events::stream(&org.apps.events, &record.id, since, current))
}

list_query! {
    /// `app_name`, `version`, `query`, `limit` and `offset`.
    pub struct AppListQuery {
        pub app_name: Option<String>,
        pub version: Option<String>,
        /// Only apps whose name contains this text (case-insensitive).
        pub query: Option<String>,
    }
}

/// List the organization's apps, one entry per app and version, with their actions
/// (paged).
#[utoipa::path(get, path = "/apps", params(AppListQuery),
    responses((status = 200, body = Vec<AppVersion>)))]
pub async fn list_apps(
    org: Org, paging: Paging, QueryParams(query): QueryParams<AppListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let mut apps = org.store.list_app_versions(&org.id).await?;
    apps.retain(|app| {
        query.app_name.as_ref().is_none_or(|name| &app.app_name == name)
            && query.version.as_ref().is_none_or(|version| &app.version == version)
            && query
                .query
                .as_ref()
                .is_none_or(|text| app.app_name.to_lowercase().contains(&text.to_lowercase()))
    });
    let (headers, page) = page_of(paging, apps, query.limit, query.offset)?;
    let mut env_names: HashMap<String, Vec<String>> = HashMap::new();
    let mut body = Vec::new();
    for app in &page {
        if !env_names.contains_key(&app.deployment_id) {
            let names = match org.store.deployment(&org.id, &app.deployment_id).await? {
                Some(record) => DeploymentDocument::of(&record).env_var_names,
                None => Vec::new(),
            };
            env_names.insert(app.deployment_id.clone(), names);
        }
        let names = env_names.get(&app.deployment_id).cloned().unwrap_or_default();
        body.push(views::app(app, &names));
    }
    Ok((headers, Json(body)))
}
