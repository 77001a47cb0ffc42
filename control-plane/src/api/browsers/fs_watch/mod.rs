//! `fs/watch`: watches of a browser's directories, their events as server-sent events.
//! The agent watches (inotify); this server keeps each watch's event stream while it
//! lives. A watch ends when it is stopped or its session ends (the agent's stream ends).
//! Watches live in this process's memory: they are not shared between replicas.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use browser_agent_proto::v1::WatchEvent;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use utoipa::ToSchema;

use super::fs::require_path;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam};
use crate::api::org::Org;
use crate::ids;

pub mod registry;
use registry::Watch;
pub use registry::{WatchEventView, Watches};

/// Watches one browser may have at once.
pub const MAX_WATCHES_PER_SESSION: usize = 8;
/// Events kept for a reader that is not reading (later ones are dropped).
const BUFFERED_EVENTS: usize = 1024;
/// How long the agent may take to put a watch in place.
const START_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WatchStartBody {
    /// A directory of the browser's filesystem.
    #[schema(pattern = "^/")]
    pub path: String,
    /// Also its subdirectories (default false).
    pub recursive: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WatchStarted {
    pub watch_id: String,
}

/// Watch a directory for changes; follow them at `…/fs/watch/{watch_id}/events`. At most
/// 8 watches per browser (409 beyond); a watch ends with its session.
#[utoipa::path(post, path = "/browsers/{id}/fs/watch", request_body = WatchStartBody,
    responses((status = 200, body = WatchStarted), (status = 409, body = ErrorBody)))]
pub async fn start(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<WatchStartBody>,
) -> Result<Json<WatchStarted>, ApiError> {
    let path = require_path("path", Some(body.path))?;
    let session = org.sessions.live(&org.id, &id).await?;
    if org.watches.of_session(&session.id) >= MAX_WATCHES_PER_SESSION {
        return Err(ApiError::Conflict(format!(
            "this browser has {MAX_WATCHES_PER_SESSION} watches, the most it may have; stop one"
        )));
    }
    let agent = org.sessions.agent(&session)?;
    let mut stream = agent.watch_directory(path, body.recursive.unwrap_or(false)).await?;
    let started = tokio::time::timeout(START_TIMEOUT, stream.message())
        .await
        .map_err(|_| ApiError::Timeout("the watch did not start in time".into()))?
        .map_err(|status| ApiError::from(crate::agent::AgentError::from(status)))?;
    if started.is_none_or(|event| event.kind != "STARTED") {
        return Err(ApiError::AgentUnavailable("the watch did not start".into()));
    }
    let watch_id = ids::new_id("watch");
    let (sender, receiver) = mpsc::channel(BUFFERED_EVENTS);
    let watches = org.watches.clone();
    let ended = watch_id.clone();
    let task = tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            // A reader this far behind loses events rather than this server's memory.
            let _ = sender.try_send(view(event));
        }
        watches.remove(&ended);
    });
    if let Ok(mut entries) = org.watches.entries.lock() {
        entries.insert(
            watch_id.clone(),
            Watch {
                org_id: org.id.clone(),
                session_id: session.id.clone(),
                events: Arc::new(tokio::sync::Mutex::new(receiver)),
                task: task.abort_handle(),
            },
        );
    }
    Ok(Json(WatchStarted { watch_id }))
}

fn view(event: WatchEvent) -> WatchEventView {
    WatchEventView { kind: event.kind, path: event.path, name: event.name, is_dir: event.is_dir }
}

/// The watch's changes as server-sent events (`data: {type, path, name, is_dir}`), until
/// the watch ends. One reader at a time (409 for a second); a reader that reconnects
/// gets what happened meanwhile (up to 1024 events).
#[utoipa::path(get, path = "/browsers/{id}/fs/watch/{watch_id}/events",
    responses((status = 200, content_type = "text/event-stream", body = WatchEventView),
        (status = 409, body = ErrorBody)))]
pub async fn events(
    org: Org, PathParam((id, watch_id)): PathParam<(String, String)>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let session = org.sessions.live(&org.id, &id).await?;
    let events = org
        .watches
        .events(&org.id, &session.id, &watch_id)
        .ok_or_else(|| ApiError::not_found("watch", &watch_id))?;
    let reader = events
        .try_lock_owned()
        .map_err(|_| ApiError::Conflict("another reader is following this watch".into()))?;
    let stream = futures::stream::unfold(reader, |mut reader| async move {
        let event = reader.recv().await?;
        let data = serde_json::to_string(&event).unwrap_or_default();
        Some((Ok(Event::default().data(data)), reader))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Stop a watch.
#[utoipa::path(delete, path = "/browsers/{id}/fs/watch/{watch_id}", responses((status = 204)))]
pub async fn stop(
    org: Org, PathParam((id, watch_id)): PathParam<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let session = org.sessions.live(&org.id, &id).await?;
    org.watches
        .events(&org.id, &session.id, &watch_id)
        .ok_or_else(|| ApiError::not_found("watch", &watch_id))?;
    if let Some(watch) = org.watches.remove(&watch_id) {
        // Dropping the agent's stream ends the watch there.
        watch.task.abort();
    }
    Ok(StatusCode::NO_CONTENT)
}
