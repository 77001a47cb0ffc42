//! The session inspector behind `inspector_url`: one page (`index.html`, `inspector.js`,
//! `inspector.css`, all served from here under a strict Content-Security-Policy) showing
//! a session's telemetry as a timeline (filters, search), its console and network
//! lists, and its replays, the video synchronized with the timeline. Granted by the
//! `jwt` of the URL (24 hours; no API key), like a `replay_view_url`; the page reads its
//! data from `/inspector/events` and `/inspector/replays` with the same token.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY};
use axum::response::{Html, IntoResponse, Response};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::IntoParams;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::QueryParams;
use crate::api::state::AppState;
use crate::store::{SessionRecord, SessionStatus, TelemetryQuery};
use crate::tokens::REPLAY_VIEW_TTL;

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("inspector.js");
const STYLE: &str = include_str!("inspector.css");
/// Events answered per request at most.
const MAX_EVENTS: i64 = 2000;
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     media-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'self'";

/// The `inspector_url` of a session.
pub fn url(state: &AppState, session: &SessionRecord) -> String {
    url_of(state, &session.id, &session.org_id)
}

pub fn url_of(state: &AppState, session_id: &str, org_id: &str) -> String {
    let jwt = state.tokens.issue_inspector(session_id, org_id, Utc::now() + REPLAY_VIEW_TTL);
    format!(
        "{}/inspector?session_id={session_id}&jwt={jwt}",
        state.settings.public_url.trim_end_matches('/')
    )
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct InspectorQuery {
    pub session_id: Option<String>,
    /// The signed token of the `inspector_url`.
    pub jwt: Option<String>,
    /// Events after this `seq` (events only).
    pub after: Option<i64>,
}

/// The session the token grants, or `None` for a wrong, expired or tampered token.
async fn inspected(
    state: &AppState, query: &InspectorQuery,
) -> Result<Option<SessionRecord>, ApiError> {
    let (Some(session_id), Some(jwt)) = (&query.session_id, &query.jwt) else {
        return Ok(None);
    };
    let Some(claims) = state.tokens.verify_inspector(jwt) else {
        return Ok(None);
    };
    if &claims.sub != session_id {
        return Ok(None);
    }
    Ok(state.store.session(&claims.org, session_id).await?)
}

fn denied() -> ApiError {
    ApiError::Unauthorized("the inspector link is invalid or has expired".into())
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")], body).into_response()
}

/// The inspector page (401 for a wrong or expired link).
#[utoipa::path(get, path = "/inspector", params(InspectorQuery), security(()),
    responses((status = 200, content_type = "text/html", body = String),
        (status = 401, body = ErrorBody)))]
pub async fn page(
    State(state): State<AppState>, QueryParams(query): QueryParams<InspectorQuery>,
) -> Result<Response, ApiError> {
    if inspected(&state, &query).await?.is_none() {
        return Err(denied());
    }
    Ok((
        [
            (CACHE_CONTROL, "no-store"),
            // The token is in the URL: never send it on as a referrer.
            (REFERRER_POLICY, "no-referrer"),
            (CONTENT_SECURITY_POLICY, POLICY),
        ],
        Html(PAGE),
    )
        .into_response())
}

#[utoipa::path(get, path = "/inspector/inspector.js", security(()),
    responses((status = 200, content_type = "text/javascript", body = String)))]
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

#[utoipa::path(get, path = "/inspector/inspector.css", security(()),
    responses((status = 200, content_type = "text/css", body = String)))]
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// The session's events after `after`, oldest first, and whether the session ended.
#[utoipa::path(get, path = "/inspector/events", params(InspectorQuery), security(()),
    responses((status = 200, description = "`{session, ended, events: [{seq, event}]}`"),
        (status = 401, body = ErrorBody)))]
pub async fn events(
    State(state): State<AppState>, QueryParams(query): QueryParams<InspectorQuery>,
) -> Result<Json<Value>, ApiError> {
    let session = inspected(&state, &query).await?.ok_or_else(denied)?;
    let mut read = TelemetryQuery::all(&session.id, MAX_EVENTS);
    read.from_seq = query.after.unwrap_or(0).saturating_add(1);
    let events: Vec<Value> =
        state.store.telemetry_events(&read).await?.iter().map(super::telemetry::envelope).collect();
    Ok(Json(json!({
        "session": { "id": session.id, "created_at": session.created_at, "name": session.name },
        "ended": session.status == SessionStatus::Ended,
        "events": events,
    })))
}

/// The session's replays, each with a video URL the page may play.
#[utoipa::path(get, path = "/inspector/replays", params(InspectorQuery), security(()),
    responses((status = 200, description = "`[{replay_id, started_at, finished_at, video_url}]`"),
        (status = 401, body = ErrorBody)))]
pub async fn replays(
    State(state): State<AppState>, QueryParams(query): QueryParams<InspectorQuery>,
) -> Result<Response, ApiError> {
    let session = inspected(&state, &query).await?.ok_or_else(denied)?;
    let expires_at = Utc::now() + REPLAY_VIEW_TTL;
    let replays: Vec<Value> = state
        .store
        .list_replays(&session.org_id, &session.id)
        .await?
        .iter()
        .map(|replay| {
            let jwt = state.tokens.issue_replay_view(
                &replay.id,
                &session.id,
                &session.org_id,
                expires_at,
            );
            json!({
                "replay_id": replay.id,
                "started_at": replay.started_at,
                "finished_at": replay.finished_at,
                "video_url": format!("replays/view/video?replay_id={}&jwt={jwt}", replay.id),
            })
        })
        .collect();
    Ok((StatusCode::OK, [(CACHE_CONTROL, "no-store")], Json(replays)).into_response())
}
