//! `GET /auth/connections/{id}/timeline`: a connection's flows and health checks, newest
//! first.

use axum::Json;
use axum::response::IntoResponse;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::connections::find;
use crate::api::error::ApiError;
use crate::api::extract::{PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::{Paging, page_of};
use crate::managed_auth::Document;

/// Which events a timeline lists.
#[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TimelineKind {
    Login,
    Reauth,
    HealthCheck,
}

impl TimelineKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Login => "login",
            Self::Reauth => "reauth",
            Self::HealthCheck => "health_check",
        }
    }
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TimelineQuery {
    /// Only events of this type.
    #[serde(rename = "type")]
    #[param(rename = "type", inline)]
    pub kind: Option<TimelineKind>,
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    #[param(value_type = Option<i64>, minimum = 0, maximum = 4294967295.0)]
    pub offset: Option<u32>,
}

/// The connection's latest 200 flows and health checks, newest first (paged).
#[utoipa::path(get, path = "/auth/connections/{id}/timeline", tag = "managed auth",
    params(TimelineQuery),
    responses((status = 200, body = Vec<Object>)))]
pub async fn timeline(
    org: Org,
    paging: Paging,
    PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<TimelineQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let record = find(&org, &id).await?;
    let document = Document::parse(&record)?;
    let events: Vec<_> = document
        .timeline
        .into_iter()
        .rev()
        .filter(|event| query.kind.is_none_or(|kind| event.kind == kind.as_str()))
        .collect();
    let (headers, page) = page_of(paging, events, query.limit, query.offset)?;
    Ok((headers, Json(page)))
}
