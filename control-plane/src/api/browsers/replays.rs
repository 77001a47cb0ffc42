//! Replays (seed 4.2): screen recordings of a browser session under
//! `/browsers/{id}/replays`, and the public view page behind `replay_view_url`.
//!
//! Downloads of finished replays come from the blob store with HTTP Range support (206),
//! also after the browser is gone. A replay still recording answers the fragmented MP4
//! recorded so far (200, no ranges, `X-Replay-Status: recording`), itself playable.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tower::ServiceExt;
use tower_http::services::ServeFile;
use utoipa::{IntoParams, ToSchema};

use super::fs::body_of;
use crate::agent::AgentClient;
use crate::api::error::{ApiError, ErrorBody, ErrorDetail, OrNotFound};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::state::AppState;
use crate::replays::{
    DEFAULT_FRAMERATE, DEFAULT_MAX_DURATION_SECONDS, MAX_FRAMERATE, MAX_MAX_DURATION_SECONDS,
};
use crate::store::{ReplayRecord, ReplayStatus, SessionRecord, SessionStatus};
use crate::tokens::REPLAY_VIEW_TTL;

/// A screen recording of a browser session.
#[derive(Debug, Serialize, ToSchema)]
pub struct Replay {
    pub replay_id: String,
    /// Wall-clock time of the first frame.
    pub started_at: DateTime<Utc>,
    /// When recording ended; null while recording.
    pub finished_at: Option<DateTime<Utc>>,
    /// A page that plays the video without an API key, valid for 24 hours from this
    /// response.
    pub replay_view_url: String,
    /// The session's inspector (its telemetry beside this video), valid as long.
    pub inspector_url: String,
}

fn replay_of(state: &AppState, record: &ReplayRecord) -> Replay {
    let inspector_url = super::inspector::url_of(state, &record.session_id, &record.org_id);
    let jwt = state.tokens.issue_replay_view(
        &record.id,
        &record.session_id,
        &record.org_id,
        Utc::now() + REPLAY_VIEW_TTL,
    );
    Replay {
        replay_id: record.id.clone(),
        started_at: record.started_at,
        finished_at: record.finished_at,
        replay_view_url: format!(
            "{}/replays/view?replay_id={}&jwt={jwt}",
            state.settings.public_url, record.id
        ),
        inspector_url,
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartReplayRequest {
    /// Frames per second, 1 to 20. Default 10.
    #[schema(minimum = 1, maximum = 20)]
    pub framerate: Option<i64>,
    /// The recording stops by itself after this many seconds, 1 to 14400. Default 3600.
    #[schema(minimum = 1, maximum = 14400)]
    pub max_duration_in_seconds: Option<i64>,
    /// Also record the browser's sound, as an AAC track in sync with the video.
    pub record_audio: Option<bool>,
}

fn validate(request: &StartReplayRequest) -> Result<(u32, u32), ApiError> {
    let mut problems = Vec::new();
    let framerate = request.framerate.unwrap_or(DEFAULT_FRAMERATE.into());
    if !(1..=i64::from(MAX_FRAMERATE)).contains(&framerate) {
        problems.push(ErrorDetail::invalid_input(format!(
            "framerate must be between 1 and {MAX_FRAMERATE}, got {framerate}"
        )));
    }
    let max_duration =
        request.max_duration_in_seconds.unwrap_or(DEFAULT_MAX_DURATION_SECONDS.into());
    if !(1..=i64::from(MAX_MAX_DURATION_SECONDS)).contains(&max_duration) {
        problems.push(ErrorDetail::invalid_input(format!(
            "max_duration_in_seconds must be between 1 and {MAX_MAX_DURATION_SECONDS}, got {max_duration}"
        )));
    }
    if !problems.is_empty() {
        return Err(ApiError::invalid(problems));
    }
    Ok((framerate as u32, max_duration as u32))
}

async fn replay_in(
    state: &AppState, session: &SessionRecord, replay_id: &str,
) -> Result<ReplayRecord, ApiError> {
    let found = state.store.replay(&session.org_id, &session.id, replay_id).await?;
    found.or_not_found("replay", replay_id)
}

/// Start recording the browser's display (seed 4.2). Answers once the first frame is
/// captured. Headless browsers have no display (400); at most 4 recordings of one
/// browser run at once (409 beyond).
#[utoipa::path(post, path = "/browsers/{id}/replays", request_body = StartReplayRequest,
    responses((status = 200, body = Replay), (status = 409, body = ErrorBody)))]
pub async fn start(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<StartReplayRequest>,
) -> Result<Json<Replay>, ApiError> {
    let (framerate, max_duration) = validate(&request)?;
    let (session, agent) = org.session_and_agent(&id).await?;
    let record = org
        .replays
        .start(&session, agent, framerate, max_duration, request.record_audio.unwrap_or(false))
        .await?;
    Ok(Json(replay_of(&org, &record)))
}

/// The session's replays, oldest first; also after the browser has ended.
#[utoipa::path(get, path = "/browsers/{id}/replays", responses((status = 200, body = Vec<Replay>)))]
pub async fn list(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<Vec<Replay>>, ApiError> {
    let session = org.session(&id).await?;
    let records = org.store.list_replays(&session.org_id, &session.id).await?;
    Ok(Json(records.iter().map(|r| replay_of(&org, r)).collect()))
}

/// Stop a recording; answers once the video is final and stored. A replay that is no
/// longer recording (stopped, or ended by its maximum duration) is a 409.
#[utoipa::path(post, path = "/browsers/{id}/replays/{replay_id}/stop",
    responses((status = 200, body = Replay), (status = 409, body = ErrorBody)))]
pub async fn stop(
    org: Org, PathParam((id, replay_id)): PathParam<(String, String)>,
) -> Result<Json<Replay>, ApiError> {
    let session = org.session(&id).await?;
    let replay = replay_in(&org, &session, &replay_id).await?;
    if session.status == SessionStatus::Running {
        org.sessions.touch(&session.id);
    }
    // Also for a session being ended: its agent may still be finalizing; if it is gone,
    // the call fails and what it left is salvaged.
    let agent = session.agent.as_ref().and_then(|location| AgentClient::new(location).ok());
    let record = org.replays.stop(&session, agent, replay).await?;
    Ok(Json(replay_of(&org, &record)))
}

/// Download the video (`video/mp4`). Finished replays support Range requests (206); a
/// replay still recording answers the fragmented MP4 recorded so far.
#[utoipa::path(get, path = "/browsers/{id}/replays/{replay_id}",
    responses((status = 200, content_type = "video/mp4", body = Vec<u8>),
        (status = 206, content_type = "video/mp4", body = Vec<u8>),
        (status = 416, body = ErrorBody)))]
pub async fn download(
    org: Org, PathParam((id, replay_id)): PathParam<(String, String)>, headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session = org.session(&id).await?;
    let replay = replay_in(&org, &session, &replay_id).await?;
    video(&org, &session, &replay, headers).await
}

async fn video(
    state: &AppState, session: &SessionRecord, replay: &ReplayRecord, headers: HeaderMap,
) -> Result<Response, ApiError> {
    match (&replay.status, &replay.blob_key) {
        (ReplayStatus::Finished, Some(blob_key)) => {
            let path = state.blobs.local_path(blob_key).ok_or_else(|| {
                ApiError::Internal(anyhow::anyhow!("the blob store has no local files"))
            })?;
            ranged_file(path, headers, &replay.id).await
        }
        (ReplayStatus::Recording | ReplayStatus::Stopping, _) => {
            if session.status != SessionStatus::Running {
                return Err(ApiError::Conflict(format!(
                    "replay {} is being finalized; retry shortly",
                    replay.id
                )));
            }
            let stream = state.sessions.agent(session)?.read_recording(&replay.id).await?;
            Ok((
                [
                    (CONTENT_TYPE, HeaderValue::from_static("video/mp4")),
                    (CACHE_CONTROL, HeaderValue::from_static("no-store")),
                    (
                        axum::http::HeaderName::from_static("x-replay-status"),
                        HeaderValue::from_static("recording"),
                    ),
                ],
                body_of(stream),
            )
                .into_response())
        }
        _ => Err(ApiError::NotFound(format!(
            "replay {} has no video: {}",
            replay.id,
            replay.failure.as_deref().unwrap_or("it was lost")
        ))),
    }
}

/// Serves a file with Range, If-Range and conditional requests (tower-http's
/// `ServeFile`); its empty-bodied errors become the Error shape.
async fn ranged_file(
    path: std::path::PathBuf, headers: HeaderMap, replay_id: &str,
) -> Result<Response, ApiError> {
    let mut request = Request::new(Body::empty());
    *request.headers_mut() = headers;
    let response = ServeFile::new(path)
        .oneshot(request)
        .await
        .map_err(|error| ApiError::Internal(error.into()))?;
    match response.status() {
        StatusCode::RANGE_NOT_SATISFIABLE => {
            let mut error =
                ApiError::RangeNotSatisfiable("the requested range is outside the video".into())
                    .into_response();
            if let Some(range) = response.headers().get(axum::http::header::CONTENT_RANGE) {
                error.headers_mut().insert(axum::http::header::CONTENT_RANGE, range.clone());
            }
            Ok(error)
        }
        StatusCode::NOT_FOUND => {
            Err(ApiError::NotFound(format!("the video of replay {replay_id} is gone")))
        }
        StatusCode::PRECONDITION_FAILED => Err(ApiError::PreconditionFailed(
            "the video does not match the request's preconditions".into(),
        )),
        status if status.is_client_error() || status.is_server_error() => {
            Err(ApiError::Internal(anyhow::anyhow!("serving the video answered {status}")))
        }
        _ => Ok(response.map(Body::new)),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ViewQuery {
    /// The replay to show.
    pub replay_id: Option<String>,
    /// The signed token of the `replay_view_url`.
    pub jwt: Option<String>,
}

/// The replay a view URL grants, or `None` for a wrong, expired or tampered token.
async fn viewed_replay(
    state: &AppState, query: &ViewQuery,
) -> Result<Option<(SessionRecord, ReplayRecord)>, ApiError> {
    let (Some(replay_id), Some(jwt)) = (&query.replay_id, &query.jwt) else {
        return Ok(None);
    };
    let Some(claims) = state.tokens.verify_replay_view(jwt) else {
        return Ok(None);
    };
    if &claims.sub != replay_id {
        return Ok(None);
    }
    let Some(session) = state.store.session(&claims.org, &claims.sid).await? else {
        return Ok(None);
    };
    let replay = state.store.replay(&claims.org, &claims.sid, replay_id).await?;
    Ok(replay.map(|replay| (session, replay)))
}

/// Text safe inside HTML element content and double-quoted attributes.
pub(in crate::api) fn escape_html(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

const DENIED_PAGE: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>Replay unavailable</title></head><body><h1>This replay link is invalid or has expired</h1>\
<p>Ask for a new <code>replay_view_url</code>.</p></body></html>";

fn denied() -> Response {
    (StatusCode::UNAUTHORIZED, Html(DENIED_PAGE)).into_response()
}

/// The page behind `replay_view_url`: the video in an HTML5 player. Needs no API key;
/// the `jwt` grants this one replay until it expires (401 page otherwise).
#[utoipa::path(get, path = "/replays/view", params(ViewQuery), security(()),
    responses((status = 200, content_type = "text/html", body = String),
        (status = 401, content_type = "text/html", body = String)))]
pub async fn view_page(
    State(state): State<AppState>, QueryParams(query): QueryParams<ViewQuery>,
) -> Result<Response, ApiError> {
    let Some((_, replay)) = viewed_replay(&state, &query).await? else {
        return Ok(denied());
    };
    let source = escape_html(&format!(
        "/replays/view/video?replay_id={}&jwt={}",
        replay.id,
        query.jwt.as_deref().unwrap_or_default()
    ));
    let status = match replay.status {
        ReplayStatus::Recording | ReplayStatus::Stopping => {
            "Still recording: this is the video so far."
        }
        ReplayStatus::Finished => "",
        ReplayStatus::Lost => "This recording was lost.",
    };
    let page = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>Replay {id}</title><style>body{{margin:0;background:#111;color:#eee;font-family:sans-serif}}\
main{{max-width:1280px;margin:0 auto;padding:16px}}video{{width:100%;background:#000}}</style></head>\
<body><main><h1>Replay {id}</h1><p>Started {started}{finished}. {status}</p>\
<video id=\"replay\" controls preload=\"auto\" src=\"{source}\"></video></main></body></html>",
        id = replay.id,
        started = replay.started_at.to_rfc3339(),
        finished = replay
            .finished_at
            .map(|at| format!(", finished {}", at.to_rfc3339()))
            .unwrap_or_default(),
    );
    Ok(([(CACHE_CONTROL, HeaderValue::from_static("no-store"))], Html(page)).into_response())
}

/// The video of the view page, authorized by the same `jwt` (401 otherwise).
#[utoipa::path(get, path = "/replays/view/video", params(ViewQuery), security(()),
    responses((status = 200, content_type = "video/mp4", body = Vec<u8>),
        (status = 206, content_type = "video/mp4", body = Vec<u8>),
        (status = 401, body = ErrorBody)))]
pub async fn view_video(
    State(state): State<AppState>, QueryParams(query): QueryParams<ViewQuery>, headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some((session, replay)) = viewed_replay(&state, &query).await? else {
        return Err(ApiError::Unauthorized("the replay link is invalid or has expired".into()));
    };
    let mut response = video(&state, &session, &replay, headers).await?;
    // Granted by a URL, not by a credential that caches would know to respect.
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    Ok(response)
}
