//! `/browsers/{id}/logs/stream`: a file of the browser's VM, or the log of one of its
//! services, as server-sent events, read by the browser's agent.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use chrono::{TimeZone, Utc};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use crate::api::error::ApiError;
use crate::api::extract::{PathParam, QueryParams};
use crate::api::org::Org;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogStreamQuery {
    /// `path` (a file of the VM, as the filesystem API names it) or `supervisor` (a log
    /// of the VM's own services).
    #[param(required = true, pattern = "^(path|supervisor)$")]
    pub source: Option<String>,
    /// With `source=path`: the file, such as `/downloads/app.log`.
    #[param(min_length = 1)]
    pub path: Option<String>,
    /// With `source=supervisor`: `agent`, `chromium`, `xvfb`, `playwright` (the
    /// Playwright executors' own output, such as Node.js crashes), `webdriver`
    /// (chromedriver's) or `pulseaudio` (the VM's sound server).
    #[param(pattern = "^(agent|chromium|xvfb|playwright|webdriver|pulseaudio)$")]
    pub supervisor_process: Option<String>,
    /// Keep streaming what is appended, like `tail -f` (default false: the stream ends at
    /// the end of the file).
    pub follow: Option<bool>,
}

/// A file's lines as server-sent events `{event: "log", message, timestamp}`: its last
/// MiB (from a line start), then, with `follow`, each line appended, until the client
/// goes or the session ends. Lines over 64 KiB come in pieces.
#[utoipa::path(get, path = "/browsers/{id}/logs/stream", params(LogStreamQuery),
    responses((status = 200, content_type = "text/event-stream", description = "`{event: \"log\", message, timestamp}` per line")))]
pub async fn stream(
    org: Org, PathParam(id): PathParam<String>, QueryParams(query): QueryParams<LogStreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    // The browser first: which parameters go together, a query's schema cannot say.
    let session = org.sessions.live(&org.id, &id).await?;
    let (path, service) = match query.source.as_deref() {
        Some("path") => match query.path.filter(|path| !path.is_empty()) {
            Some(path) => (path, String::new()),
            None => return Err(ApiError::invalid_field("path is required with source=path")),
        },
        Some("supervisor") => match query.supervisor_process.filter(|s| !s.is_empty()) {
            Some(service) => (String::new(), service),
            None => {
                return Err(ApiError::invalid_field(
                    "supervisor_process is required with source=supervisor",
                ));
            }
        },
        Some(other) => {
            return Err(ApiError::invalid_field(format!(
                "source must be path or supervisor, got {other:?}"
            )));
        }
        None => return Err(ApiError::invalid_field("source is required")),
    };
    let agent = org.sessions.agent(&session)?;
    let lines = agent.follow_file(path, service, query.follow.unwrap_or(false)).await?;
    let events = lines.take_while(|line| std::future::ready(line.is_ok())).filter_map(|line| {
        let event = line.ok().map(|line| {
            let at = Utc.timestamp_millis_opt(line.unix_ms).single().unwrap_or_else(Utc::now);
            let data = json!({"event": "log", "message": line.message, "timestamp": at});
            Ok(Event::default().data(data.to_string()))
        });
        std::future::ready(event)
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
