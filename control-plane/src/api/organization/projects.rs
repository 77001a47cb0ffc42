//! `/org/projects`: an organization's projects and their limits. Every resource belongs
//! to one; a request is confined to one by its key or its `X-Kernel-Project-Id` /
//! `X-Kernel-Project` header (`crate::api::org`, `crate::store::scope`). The organization's
//! default project holds what was made outside any (and everything made before
//! projects existed); it cannot be deleted.

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::limits::present;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::{Paging, page_of};
use crate::store::{ProjectRecord, StoreError};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    /// 1 to 255 characters, without `/` or `%`; unique in the organization.
    name: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProject {
    name: Option<String>,
    /// `active` or `archived`: an archived project's resources can be read and deleted,
    /// not made or changed.
    #[schema(value_type = Option<String>)]
    status: Option<ProjectStatus>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum ProjectStatus {
    Active,
    Archived,
}

impl ProjectStatus {
    fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Archived => "archived",
        }
    }
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListProjects {
    /// Exact name, case-insensitive.
    name: Option<String>,
    /// Case-insensitive text in the name.
    query: Option<String>,
    /// 1 to 100, default 20.
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    offset: Option<u32>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProjectLimits {
    /// Most browsers at once, on demand and reserved by pools together; 0 removes the
    /// cap, omitted (or `null`) leaves it unchanged.
    #[serde(default, deserialize_with = "present")]
    max_concurrent_sessions: Option<Option<i64>>,
    /// Most invocations running at once; 0 removes the cap.
    #[serde(default, deserialize_with = "present")]
    max_concurrent_invocations: Option<Option<i64>>,
    /// Deprecated: pools count toward `max_concurrent_sessions`. Setting it is a 400.
    #[serde(default, deserialize_with = "present")]
    max_pooled_sessions: Option<Option<i64>>,
}

/// The project as the SDK's `Project` reads it.
fn view(project: &ProjectRecord) -> Value {
    json!({
        "id": project.id,
        "name": project.name,
        "status": project.status,
        "created_at": project.created_at,
        "updated_at": project.updated_at,
    })
}

fn limits_view(project: &ProjectRecord) -> Value {
    json!({
        "max_concurrent_sessions": project.max_concurrent_sessions,
        "max_concurrent_invocations": project.max_concurrent_invocations,
        "max_pooled_sessions": null,
    })
}

fn checked_name(name: &str) -> Result<String, ApiError> {
    let name = name.trim();
    let length = name.chars().count();
    if !(1..=255).contains(&length) || name.contains(['/', '%']) {
        return Err(ApiError::invalid_field("name: 1 to 255 characters, without / or %"));
    }
    Ok(name.to_owned())
}

fn name_taken(error: StoreError, name: &str) -> ApiError {
    match error {
        StoreError::Conflict(_) => {
            ApiError::Conflict(format!("a project named {name:?} already exists"))
        }
        other => other.into(),
    }
}

/// A project of the organization the caller may see: a request confined to a project
/// sees that one only (another is 404, as another organization's).
async fn visible_project(org: &Org, id_or_name: &str) -> Result<ProjectRecord, ApiError> {
    let found = org.store.project(&org.id, id_or_name).await?;
    match (found, &org.project) {
        (Some(project), Some(own)) if project.id != own.id => {
            Err(ApiError::not_found("project", id_or_name))
        }
        (Some(project), _) => Ok(project),
        (None, _) => Err(ApiError::not_found("project", id_or_name)),
    }
}

/// Refuses (403) what only an organization-wide caller may do.
fn organization_wide(org: &Org, what: &str) -> Result<(), ApiError> {
    match &org.project {
        Some(own) if org.caller.key().is_some_and(|key| key.project_id.is_some()) => {
            Err(ApiError::Forbidden(format!(
                "this API key is bound to project {}: only an organization-wide key can {what}",
                own.name
            )))
        }
        _ => Ok(()),
    }
}

/// Create a project.
#[utoipa::path(post, path = "/org/projects", request_body = CreateProject,
    responses((status = 200, description = "Project"), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateProject>,
) -> Result<Json<Value>, ApiError> {
    organization_wide(&org, "make projects")?;
    let name = checked_name(&request.name)?;
    let project = ProjectRecord::new(&org.id, &name);
    org.store.insert_project(&project).await.map_err(|error| name_taken(error, &name))?;
    Ok(Json(view(&project)))
}

/// The organization's projects, oldest first.
#[utoipa::path(get, path = "/org/projects", params(ListProjects),
    responses((status = 200, description = "[Project]")))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<ListProjects>,
) -> Result<impl IntoResponse, ApiError> {
    let mut projects = org.store.list_projects(&org.id).await?;
    if let Some(own) = &org.project {
        projects.retain(|project| project.id == own.id);
    }
    if let Some(name) = &query.name {
        projects.retain(|project| project.name.to_lowercase() == name.to_lowercase());
    }
    if let Some(text) = query.query.as_deref().filter(|text| !text.is_empty()) {
        let text = text.to_lowercase();
        projects.retain(|project| project.name.to_lowercase().contains(&text));
    }
    let (headers, page) = page_of(paging, projects, query.limit, query.offset)?;
    Ok((headers, Json(page.iter().map(view).collect::<Vec<_>>())))
}

/// One project, by id or name.
#[utoipa::path(get, path = "/org/projects/{id_or_name}",
    responses((status = 200, description = "Project")))]
pub async fn retrieve(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(&visible_project(&org, &id_or_name).await?)))
}

/// Rename a project, or archive it (or make it active again).
#[utoipa::path(patch, path = "/org/projects/{id_or_name}", request_body = UpdateProject,
    responses((status = 200, description = "Project"), (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id_or_name): PathParam<String>, JsonBody(request): JsonBody<UpdateProject>,
) -> Result<Json<Value>, ApiError> {
    let mut project = visible_project(&org, &id_or_name).await?;
    if let Some(name) = &request.name {
        project.name = checked_name(name)?;
    }
    if let Some(status) = request.status {
        project.status = status.as_str().into();
    }
    project.updated_at = Utc::now();
    let name = project.name.clone();
    let updated =
        org.store.update_project(&project).await.map_err(|error| name_taken(error, &name))?;
    if !updated {
        return Err(ApiError::not_found("project", &id_or_name));
    }
    Ok(Json(view(&project)))
}

/// Delete an empty project (not the default one). Keys bound to it are deleted too.
#[utoipa::path(delete, path = "/org/projects/{id_or_name}",
    responses((status = 204), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    organization_wide(&org, "delete projects")?;
    let project = visible_project(&org, &id_or_name).await?;
    if project.is_default {
        return Err(ApiError::Conflict(
            "the default project holds what is made outside any project: it cannot be deleted"
                .into(),
        ));
    }
    if let Some(held) = org.store.project_in_use(&project.id).await? {
        return Err(ApiError::Conflict(format!(
            "project {} still holds {held}: delete them first",
            project.name
        )));
    }
    if !org.store.delete_project(&project.id, Utc::now()).await? {
        return Err(ApiError::not_found("project", &id_or_name));
    }
    org.api_keys.delete_bound_to_project(&org.id, &project.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A project's limits.
#[utoipa::path(get, path = "/org/projects/{id_or_name}/limits",
    responses((status = 200, description = "ProjectLimits")))]
pub async fn limits(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(limits_view(&visible_project(&org, &id_or_name).await?)))
}

/// Set a project's limits: 0 removes a cap, an omitted field stays as it is.
#[utoipa::path(patch, path = "/org/projects/{id_or_name}/limits", request_body = UpdateProjectLimits,
    responses((status = 200, description = "ProjectLimits")))]
pub async fn update_limits(
    org: Org, PathParam(id_or_name): PathParam<String>,
    JsonBody(request): JsonBody<UpdateProjectLimits>,
) -> Result<Json<Value>, ApiError> {
    if matches!(request.max_pooled_sessions, Some(Some(_))) {
        return Err(ApiError::invalid_field(
            "max_pooled_sessions is deprecated: pooled browsers count toward max_concurrent_sessions",
        ));
    }
    let offer = &org.settings.offer;
    let caps = [
        (
            "max_concurrent_sessions",
            request.max_concurrent_sessions.flatten(),
            offer.max_live_browsers + offer.max_pooled_browsers,
        ),
        (
            "max_concurrent_invocations",
            request.max_concurrent_invocations.flatten(),
            offer.max_running_invocations,
        ),
    ];
    for (field, cap, max) in caps {
        if let Some(cap) = cap
            && !(0..=max).contains(&cap)
        {
            return Err(ApiError::invalid_field(format!(
                "{field}: give 0 (no cap) to {max}, the organization's limit"
            )));
        }
    }
    let mut project = visible_project(&org, &id_or_name).await?;
    let set = |cap: Option<i64>| (cap > Some(0)).then_some(cap).flatten();
    if let Some(cap) = request.max_concurrent_sessions.flatten() {
        project.max_concurrent_sessions = set(Some(cap));
    }
    if let Some(cap) = request.max_concurrent_invocations.flatten() {
        project.max_concurrent_invocations = set(Some(cap));
    }
    project.updated_at = Utc::now();
    if !org.store.update_project(&project).await? {
        return Err(ApiError::not_found("project", &id_or_name));
    }
    Ok(Json(limits_view(&project)))
}
