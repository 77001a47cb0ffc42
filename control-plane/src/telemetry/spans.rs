//! The events that have a duration, as OTLP spans beside the log records (`POST
//! {endpoint}/v1/traces`): each API call on the session (`api_call`,
//! `platform_api_call`: it knows its own duration) and each top-level navigation, from
//! `page_navigation` to that document's `page_load`. A session is one trace; ids are
//! derived from the session and the events' `seq`, so a retried delivery sends the same
//! spans again rather than new ones.

use std::collections::HashMap;
use std::sync::Mutex;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, status,
};
use sha2::{Digest, Sha256};

use super::Event;
use super::otlp::{attribute, int, scope, text};

/// Navigations of one session waiting for their load; its oldest go past this (a VM
/// flooding navigations loses only its own spans).
const MAX_OPEN_PER_SESSION: usize = 64;

/// Session, target and document (loader id).
type NavigationKey = (String, String, String);

/// A navigation's start: its event's `seq`, its time and its URL.
struct NavigationStart {
    seq: i64,
    ts_us: i64,
    url: String,
}

/// Navigations waiting for their load.
#[derive(Default)]
pub struct OpenNavigations {
    started: Mutex<HashMap<NavigationKey, NavigationStart>>,
}

impl OpenNavigations {
    /// Notes the session's navigations and answers the spans its events complete.
    pub fn spans(&self, session_id: &str, events: &[(i64, Event)]) -> Vec<Span> {
        let trace_id = digest(&[session_id.as_bytes()])[..16].to_vec();
        let mut spans = Vec::new();
        for (seq, event) in events {
            let data = &event.data;
            match event.kind.as_str() {
                "api_call" | "platform_api_call" => {
                    let duration_us = (data["duration_ms"].as_f64().unwrap_or(0.0) * 1000.0) as i64;
                    let status = data["status"].as_i64().unwrap_or(0);
                    spans.push(span(
                        &trace_id,
                        session_id,
                        *seq,
                        data["operation_id"].as_str().unwrap_or("api_call"),
                        span::SpanKind::Server,
                        (event.ts_us - duration_us, event.ts_us),
                        vec![
                            attribute("http.response.status_code", int(status)),
                            attribute(
                                "kernel.request_id",
                                data["request_id"].as_str().and_then(text),
                            ),
                        ],
                        status >= 500,
                    ));
                }
                "page_navigation" if data.get("parent_frame_id").is_none() => {
                    if let Some(key) = navigation_key(session_id, data)
                        && let Ok(mut started) = self.started.lock()
                    {
                        let own: Vec<(&NavigationKey, i64)> = started
                            .iter()
                            .filter(|((session, _, _), _)| session == session_id)
                            .map(|(key, start)| (key, start.seq))
                            .collect();
                        if own.len() >= MAX_OPEN_PER_SESSION
                            && let Some((oldest, _)) = own.iter().min_by_key(|(_, seq)| *seq)
                        {
                            let oldest = (*oldest).clone();
                            started.remove(&oldest);
                        }
                        let url = data["url"].as_str().unwrap_or_default().to_owned();
                        let start = NavigationStart { seq: *seq, ts_us: event.ts_us, url };
                        started.insert(key, start);
                    }
                }
                "page_load" => {
                    let opened = navigation_key(session_id, data).and_then(|key| {
                        self.started.lock().ok().and_then(|mut started| started.remove(&key))
                    });
                    if let Some(start) = opened {
                        spans.push(span(
                            &trace_id,
                            session_id,
                            start.seq,
                            "navigation",
                            span::SpanKind::Internal,
                            (start.ts_us, event.ts_us),
                            vec![
                                attribute("url.full", text(&start.url)),
                                attribute(
                                    "kernel.target.id",
                                    data["target_id"].as_str().and_then(text),
                                ),
                            ],
                            false,
                        ));
                    }
                }
                _ => {}
            }
        }
        spans
    }

    /// Forgets the session's navigations that never loaded.
    pub fn forget(&self, session_id: &str) {
        if let Ok(mut started) = self.started.lock() {
            started.retain(|(session, _, _), _| session != session_id);
        }
    }
}

fn navigation_key(session_id: &str, data: &serde_json::Value) -> Option<NavigationKey> {
    Some((
        session_id.to_owned(),
        data["target_id"].as_str()?.to_owned(),
        data["loader_id"].as_str()?.to_owned(),
    ))
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().into()
}

#[allow(clippy::too_many_arguments)]
fn span(
    trace_id: &[u8], session_id: &str, seq: i64, name: &str, kind: span::SpanKind,
    (start_us, end_us): (i64, i64), attributes: Vec<KeyValue>, failed: bool,
) -> Span {
    let span_id = digest(&[session_id.as_bytes(), &seq.to_be_bytes()])[..8].to_vec();
    let nanos = |us: i64| (us.max(0) as u64) * 1000;
    Span {
        trace_id: trace_id.to_vec(),
        span_id,
        name: name.to_owned(),
        kind: kind.into(),
        start_time_unix_nano: nanos(start_us.min(end_us)),
        end_time_unix_nano: nanos(end_us),
        attributes,
        status: Some(Status {
            code: if failed { status::StatusCode::Error } else { status::StatusCode::Unset }.into(),
            ..Status::default()
        }),
        ..Span::default()
    }
}

/// The OTLP request for one session's spans.
pub fn traces_request(resource: Resource, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![ScopeSpans { scope: Some(scope()), spans, ..ScopeSpans::default() }],
            ..ResourceSpans::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Category;
    use serde_json::json;

    fn event(kind: &str, ts_us: i64, data: serde_json::Value) -> Event {
        let mut event = Event::api(Category::Page, kind, data);
        event.ts_us = ts_us;
        event
    }

    #[test]
    fn calls_and_navigations_become_spans() {
        let open = OpenNavigations::default();
        let page = json!({"target_id": "T", "loader_id": "L1", "url": "http://a.test/"});
        let first = open.spans(
            "s1",
            &[
                (
                    1,
                    event(
                        "api_call",
                        5_000_000,
                        json!({"operation_id": "browsers.computer.click_mouse",
                    "status": 200, "duration_ms": 12.5, "request_id": "r"}),
                    ),
                ),
                (2, event("page_navigation", 6_000_000, page.clone())),
                (
                    3,
                    event(
                        "page_navigation",
                        6_100_000,
                        json!({"target_id": "T", "loader_id": "L2",
                    "parent_frame_id": "F", "url": "http://frame.test/"}),
                    ),
                ),
            ],
        );
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].name, "browsers.computer.click_mouse");
        assert_eq!(first[0].end_time_unix_nano - first[0].start_time_unix_nano, 12_500_000);
        // The load comes in a later batch.
        let second = open.spans("s1", &[(4, event("page_load", 6_750_000, page))]);
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].name, "navigation");
        assert_eq!(second[0].start_time_unix_nano, 6_000_000_000);
        assert_eq!(second[0].end_time_unix_nano, 6_750_000_000);
        assert_eq!(second[0].trace_id, first[0].trace_id);
        assert_ne!(second[0].span_id, first[0].span_id);
    }
}
