//! `/browsers/{id}/telemetry/…`: a session's telemetry read back, live or after it ended
//! (for the retention period): a page of events (`events`), the live stream (`stream`,
//! server-sent events resumable with `Last-Event-ID`), and the network events as a HAR.
//! Events are read from the store, so any replica serves them.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::RawQuery;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use utoipa::IntoParams;

use crate::api::apps::events::parse_since;
use crate::api::error::ApiError;
use crate::api::extract::PathParam;
use crate::api::org::Org;
use crate::store::{SessionStatus, TelemetryQuery, TelemetryRow};
use crate::telemetry::event::now_us;
use crate::telemetry::{Category, har};

const DEFAULT_LIMIT: i64 = 20;
const MAX_LIMIT: i64 = 1000;
/// Events read from the store per round of a stream.
const STREAM_BATCH: i64 = 500;
/// How often a stream looks for events written by other replicas.
const STREAM_POLL: Duration = Duration::from_millis(500);
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Most events a HAR is made of.
const MAX_HAR_EVENTS: i64 = 20_000;

/// Every value of each query parameter, in order (repeated or comma-separated).
fn query_pairs(raw: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .map(|(key, value)| (key.into_owned(), value.into_owned()))
        .collect()
}

fn values(pairs: &[(String, String)], key: &str) -> Vec<String> {
    pairs
        .iter()
        .filter(|(k, _)| k == key || k.strip_suffix("[]") == Some(key))
        .flat_map(|(_, v)| v.split(',').map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned))
        .collect()
}

/// The last value of a parameter; an empty one counts as absent.
fn single<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
}

/// `{seq, event}`, as `events`, the stream and the inspector answer each event.
pub(in crate::api) fn envelope(row: &TelemetryRow) -> Value {
    let event: Value = serde_json::from_str(&row.body).unwrap_or(Value::Null);
    json!({ "seq": row.seq, "event": event })
}

fn integer(pairs: &[(String, String)], key: &str) -> Result<Option<i64>, ApiError> {
    single(pairs, key)
        .map(|text| {
            text.parse::<i64>().map_err(|_| {
                ApiError::invalid_field(format!("{key} must be an integer, got {text:?}"))
            })
        })
        .transpose()
}

/// `GET /browsers/{id}/telemetry/events`' parameters, as documented; read from the raw
/// query (repeated `category` and `type`; an empty value is an absent one).
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct EventsQuery {
    /// Only these categories (repeat the parameter).
    #[param(inline)]
    category: Option<Vec<Category>>,
    /// Only these event types (repeat the parameter, or comma-separated).
    r#type: Option<Vec<String>>,
    /// RFC 3339 time or a duration back from now such as `5m` (default `5m`); not with
    /// `order=desc`.
    #[param(schema_with = crate::api::openapi::since)]
    since: Option<String>,
    /// End of the window (exclusive), like `since`.
    #[param(schema_with = crate::api::openapi::since)]
    until: Option<String>,
    /// `asc` (default) or `desc`.
    #[param(pattern = "^(asc|desc)$")]
    order: Option<String>,
    /// Events per page, 1 to 1000 (default 20).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// The `X-Next-Offset` of the previous page.
    #[param(minimum = 0)]
    offset: Option<i64>,
}

/// Read a page of the session's telemetry events.
#[utoipa::path(get, path = "/browsers/{id}/telemetry/events", params(EventsQuery),
    responses((status = 200, description = "`[{seq, event}]`, with X-Has-More and X-Next-Offset")))]
pub async fn events(
    org: Org, PathParam(id): PathParam<String>, RawQuery(raw): RawQuery,
) -> Result<impl IntoResponse, ApiError> {
    let pairs = query_pairs(raw.as_deref());
    let known = ["category", "type", "since", "until", "order", "limit", "offset"];
    if let Some((key, _)) = pairs.iter().find(|(k, _)| !known.contains(&k.trim_end_matches("[]"))) {
        return Err(ApiError::invalid_field(format!("unknown query parameter {key:?}")));
    }
    let categories = values(&pairs, "category");
    if let Some(unknown) = categories.iter().find(|c| Category::parse(c).is_none()) {
        return Err(ApiError::invalid_field(format!("category: unknown category {unknown:?}")));
    }
    let newest_first = match single(&pairs, "order") {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(other) => {
            return Err(ApiError::invalid_field(format!(
                "order must be asc or desc, got {other:?}"
            )));
        }
    };
    let since = single(&pairs, "since").map(parse_since).transpose()?;
    if newest_first && since.is_some() {
        return Err(ApiError::invalid_field("since cannot be combined with order=desc"));
    }
    let until = single(&pairs, "until").map(parse_since).transpose()?;
    let limit = integer(&pairs, "limit")?.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid_field(format!(
            "limit must be between 1 and {MAX_LIMIT}, got {limit}"
        )));
    }
    let offset = integer(&pairs, "offset")?.filter(|offset| *offset > 0);
    let session = org.session(&id).await?;
    let mut query = TelemetryQuery::all(&session.id, limit + 1);
    query.categories = categories;
    query.types = values(&pairs, "type");
    query.newest_first = newest_first;
    query.until_us = until.map_or(i64::MAX, |t| t.timestamp_micros());
    match (newest_first, offset) {
        (false, Some(offset)) => query.from_seq = offset,
        (false, None) => {
            let default_since = now_us() - 5 * 60 * 1_000_000;
            query.since_us = since.map_or(default_since, |t| t.timestamp_micros());
        }
        (true, Some(offset)) => query.to_seq = offset,
        (true, None) => {}
    }
    let stores = session.vm_settings.telemetry.as_ref().is_none_or(|t| t.storage);
    let mut rows = if stores { org.store.telemetry_events(&query).await? } else { Vec::new() };
    let has_more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_offset = match (newest_first, rows.last()) {
        (false, Some(last)) => last.seq + 1,
        (false, None) => offset.unwrap_or(0),
        (true, Some(last)) if has_more => last.seq,
        (true, _) => 0,
    };
    let body: Vec<Value> = rows.iter().map(envelope).collect();
    let headers =
        [("X-Has-More", has_more.to_string()), ("X-Next-Offset", next_offset.to_string())];
    Ok((headers, Json(body)))
}

/// Stream the session's telemetry events as server-sent events.
#[utoipa::path(get, path = "/browsers/{id}/telemetry/stream",
    params(("replay" = Option<String>, Query, description = "`all`: start from the oldest retained event"), ("type" = Option<Vec<String>>, Query, description = "Only these event types (repeat or comma-separated)"), ("Last-Event-ID" = Option<String>, Header, description = "Resume after this seq")),
    responses((status = 200, content_type = "text/event-stream", description = "`{seq, event}` per frame, `id: seq`")))]
pub async fn stream(
    org: Org, PathParam(id): PathParam<String>, RawQuery(raw): RawQuery, headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let pairs = query_pairs(raw.as_deref());
    let types = values(&pairs, "type");
    let session = org.session(&id).await?;
    let resume = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<i64>().ok());
    let mut after = match (resume, single(&pairs, "replay")) {
        (Some(seq), _) => seq,
        (None, Some("all")) => 0,
        (None, _) => {
            let mut newest = TelemetryQuery::all(&session.id, 1);
            newest.newest_first = true;
            org.store.telemetry_events(&newest).await?.first().map_or(0, |row| row.seq)
        }
    };
    let (sender, receiver) = mpsc::channel::<Event>(64);
    let (store, telemetry, session_id) =
        (org.store.clone(), org.telemetry.clone(), session.id.clone());
    let org_id = org.id.clone();
    tokio::spawn(async move {
        let mut written = telemetry.written();
        // Set once the session has ended: one last read, then the stream closes.
        let mut last_round = false;
        loop {
            let mut query = TelemetryQuery::all(&session_id, STREAM_BATCH);
            query.from_seq = after + 1;
            let rows = match store.telemetry_events(&query).await {
                Ok(rows) => rows,
                Err(error) => {
                    tracing::warn!(%session_id, %error, "a telemetry stream could not read the store");
                    return;
                }
            };
            let mut skipped = false;
            for row in &rows {
                after = row.seq;
                let wanted = types.is_empty()
                    || serde_json::from_str::<Value>(&row.body)
                        .ok()
                        .and_then(|body| {
                            body["type"].as_str().map(|t| types.iter().any(|w| w == t))
                        })
                        .unwrap_or(false);
                if !wanted {
                    skipped = true;
                    continue;
                }
                skipped = false;
                let frame =
                    Event::default().id(row.seq.to_string()).data(envelope(row).to_string());
                if sender.send(frame).await.is_err() {
                    return;
                }
            }
            if skipped {
                // Moves the client's Last-Event-ID past the events it did not want.
                if sender.send(Event::default().id(after.to_string())).await.is_err() {
                    return;
                }
            }
            if rows.len() as i64 == STREAM_BATCH {
                continue;
            }
            if last_round {
                return;
            }
            let ended = match store.session(&org_id, &session_id).await {
                Ok(Some(session)) => session.status == SessionStatus::Ended,
                _ => true,
            };
            if ended {
                // What was recorded as it ended is written within a flush: read once more.
                last_round = true;
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
            tokio::select! {
                () = sender.closed() => return,
                _ = written.changed() => {}
                () = tokio::time::sleep(STREAM_POLL) => {}
            }
        }
    });
    let frames = futures::StreamExt::map(ReceiverStream::new(receiver), Ok::<_, Infallible>);
    Ok(Sse::new(frames).keep_alive(KeepAlive::new().interval(KEEPALIVE)))
}

/// The session's network events as an HTTP Archive (HAR 1.2).
#[utoipa::path(get, path = "/browsers/{id}/telemetry/har",
    responses((status = 200, description = "HAR 1.2 (`application/json`)")))]
pub async fn har(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<impl IntoResponse, ApiError> {
    let session = org.session(&id).await?;
    let mut query = TelemetryQuery::all(&session.id, MAX_HAR_EVENTS);
    query.categories = vec!["network".into()];
    let events: Vec<Value> = org
        .store
        .telemetry_events(&query)
        .await?
        .iter()
        .filter_map(|row| serde_json::from_str(&row.body).ok())
        .collect();
    let disposition = format!("attachment; filename=\"{}.har\"", session.id);
    Ok(([(axum::http::header::CONTENT_DISPOSITION, disposition)], Json(har::archive(&events))))
}
