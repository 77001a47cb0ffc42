//! `GET /auth/connections/{id}/timeline`: a connection's flows and health checks, newest
//! first.

use axum::Json;
use axum::response::IntoResponse;
use serde::Deserialize;
use utoipa::ToSchema;

use super::connections::find;
use crate::api::error::ApiError;
use crate::api::extract::{PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::list_query;
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

list_query! {
    pub struct TimelineQuery {
        /// Only events of this type.
        #[serde(rename = "type")]
        #[param(rename = "type", inline)]
        pub kind: Option<TimelineKind>,
    }
}

/// The connection's latest 200 flows and health checks, newest first (paged).
#[utoipa::path(get, path = "/auth/connections/{id}/timeline", params(TimelineQuery),
    responses((status = 200, body = Vec<Object>)))]
pub async fn timeline(
    org: Org, paging: Paging, PathParam(id): PathParam<String>,
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
