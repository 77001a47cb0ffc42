//! From what Chromium reports over CDP to the SDK's telemetry events: which CDP event
//! becomes which event type, with the context (target, frame, loader, URL, navigation
//! count) the SDK stamps on every CDP-sourced event. Network events carry no request or
//! response bodies, and headers named like secrets are redacted.

use std::collections::HashMap;

use browser_agent_proto::v1::TelemetryCapture;
use serde_json::{Map, Value, json};

use super::{Captured, bounded};

/// Headers whose values never leave the VM.
const SECRET_HEADERS: [&str; 5] =
    ["authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"];
pub const REDACTED: &str = "[REDACTED]";
/// Requests remembered for their response's method and URL; the oldest are forgotten.
const MAX_PENDING_REQUESTS: usize = 2048;

/// What the monitor knows of one attached target.
#[derive(Default, Clone)]
pub struct Target {
    pub target_id: String,
    pub target_type: String,
    pub url: String,
    pub loader_id: String,
    pub nav_seq: u64,
}

/// Requests in flight (method and URL by request id), for the events that follow.
#[derive(Default)]
pub struct Requests {
    pending: HashMap<String, (String, String)>,
}

/// The SDK's target types; anything else is `other`.
pub fn target_type(cdp_type: &str) -> &'static str {
    match cdp_type {
        "page" => "page",
        "iframe" => "iframe",
        "worker" => "worker",
        "background_page" => "background_page",
        "service_worker" => "service_worker",
        "shared_worker" => "shared_worker",
        _ => "other",
    }
}

/// The context stamped on an event of `target` (reached through CDP `session`).
fn context(
    target: &Target, session: &str, frame_id: Option<&str>, url: Option<&str>,
) -> Map<String, Value> {
    let mut data = Map::new();
    data.insert("target_id".into(), json!(target.target_id));
    data.insert("target_type".into(), json!(target_type(&target.target_type)));
    data.insert("session_id".into(), json!(session));
    data.insert("nav_seq".into(), json!(target.nav_seq));
    if !target.loader_id.is_empty() {
        data.insert("loader_id".into(), json!(target.loader_id));
    }
    if let Some(frame_id) = frame_id {
        data.insert("frame_id".into(), json!(frame_id));
    }
    let (url, _) = bounded(url.unwrap_or(&target.url));
    data.insert("url".into(), json!(url));
    data
}

/// A settle event (`network_idle`, `page_layout_settled`, `page_navigation_settled`) of
/// `target`, if its category is on.
pub fn settled_event(
    capture: &TelemetryCapture, kind: &'static str, session: &str, target: &Target,
) -> Option<Captured> {
    let category = match kind {
        "network_idle" if capture.network => "network",
        "page_layout_settled" | "page_navigation_settled" if capture.page => "page",
        _ => return None,
    };
    Some(Captured {
        category,
        kind,
        data: Value::Object(context(target, session, None, None)),
        source_event: String::new(),
        truncated: false,
    })
}

/// The CDP events the monitor reads; the others of the domains it enables (data
/// received, extra info, execution contexts, …) are dropped unparsed.
pub fn is_wanted(method: &str) -> bool {
    matches!(
        method,
        "Runtime.consoleAPICalled"
            | "Runtime.exceptionThrown"
            | "Network.requestWillBeSent"
            | "Network.responseReceived"
            | "Network.loadingFinished"
            | "Network.loadingFailed"
            | "Page.frameNavigated"
            | "Page.domContentEventFired"
            | "Page.loadEventFired"
            | "PerformanceTimeline.timelineEventAdded"
            | "Target.attachedToTarget"
            | "Target.detachedFromTarget"
            | "Target.targetInfoChanged"
            | "Target.targetCreated"
            | "Target.targetDestroyed"
            | "Target.targetCrashed"
    )
}

/// Turns one CDP event of an attached target into telemetry, if its category is on.
/// Updates `target` (navigations) and `requests` as it goes.
pub fn from_target_event(
    capture: &TelemetryCapture, method: &str, params: &Value, session: &str, target: &mut Target,
    requests: &mut Requests,
) -> Option<Captured> {
    let (category, kind, data, truncated): (&str, &str, Map<String, Value>, bool) = match method {
        "Runtime.consoleAPICalled" if capture.console => {
            let level = params["type"].as_str().unwrap_or("log");
            let args: Vec<String> = params["args"]
                .as_array()
                .map(|args| args.iter().map(render_remote_object).collect())
                .unwrap_or_default();
            let (text, cut) = bounded(&args.join(" "));
            let args: Vec<String> = args.iter().map(|arg| bounded(arg).0).take(32).collect();
            let mut data = context(target, session, None, None);
            data.insert("text".into(), json!(text));
            data.insert("args".into(), json!(args));
            data.insert("level".into(), json!(if level == "warning" { "warn" } else { level }));
            if let Some(frame) = params["stackTrace"]["callFrames"].get(0) {
                data.insert(
                    "source_url".into(),
                    json!(bounded(frame["url"].as_str().unwrap_or_default()).0),
                );
                data.insert("line".into(), frame["lineNumber"].clone());
                data.insert("column".into(), frame["columnNumber"].clone());
            }
            let kind =
                if matches!(level, "error" | "assert") { "console_error" } else { "console_log" };
            ("console", kind, data, cut)
        }
        "Runtime.exceptionThrown" if capture.console => {
            let details = &params["exceptionDetails"];
            let text = details["exception"]["description"]
                .as_str()
                .or(details["text"].as_str())
                .unwrap_or("uncaught exception");
            let (text, cut) = bounded(text);
            let mut data = context(target, session, None, None);
            data.insert("text".into(), json!(text));
            data.insert("level".into(), json!("error"));
            data.insert("line".into(), details["lineNumber"].clone());
            data.insert("column".into(), details["columnNumber"].clone());
            if let Some(url) = details["url"].as_str() {
                data.insert("source_url".into(), json!(bounded(url).0));
            }
            ("console", "console_error", data, cut)
        }
        "Network.requestWillBeSent" if capture.network => {
            let request = &params["request"];
            let request_id = params["requestId"].as_str().unwrap_or_default();
            let url = request["url"].as_str().unwrap_or_default();
            let method = request["method"].as_str().unwrap_or_default();
            requests.remember(request_id, method, url);
            let mut data = context(target, session, params["frameId"].as_str(), Some(url));
            data.insert("request_id".into(), json!(request_id));
            data.insert("method".into(), json!(method));
            data.insert("headers".into(), redacted_headers(&request["headers"]));
            data.insert("resource_type".into(), params["type"].clone());
            data.insert(
                "document_url".into(),
                json!(bounded(params["documentURL"].as_str().unwrap_or_default()).0),
            );
            data.insert("initiator_type".into(), params["initiator"]["type"].clone());
            data.insert("is_redirect".into(), json!(params.get("redirectResponse").is_some()));
            ("network", "network_request", data, false)
        }
        "Network.responseReceived" if capture.network => {
            let response = &params["response"];
            let request_id = params["requestId"].as_str().unwrap_or_default();
            let method = requests.method(request_id);
            let mut data =
                context(target, session, params["frameId"].as_str(), response["url"].as_str());
            data.insert("request_id".into(), json!(request_id));
            data.insert("method".into(), json!(method));
            data.insert("status".into(), response["status"].clone());
            data.insert(
                "status_text".into(),
                json!(bounded(response["statusText"].as_str().unwrap_or_default()).0),
            );
            data.insert("mime_type".into(), response["mimeType"].clone());
            data.insert("headers".into(), redacted_headers(&response["headers"]));
            data.insert("resource_type".into(), params["type"].clone());
            ("network", "network_response", data, false)
        }
        "Network.loadingFinished" => {
            requests.forget(params["requestId"].as_str().unwrap_or_default());
            return None;
        }
        "Network.loadingFailed" if capture.network => {
            let request_id = params["requestId"].as_str().unwrap_or_default();
            let url = requests.forget(request_id).map(|(_, url)| url);
            let mut data = context(target, session, None, url.as_deref());
            data.insert("request_id".into(), json!(request_id));
            data.insert("error_text".into(), params["errorText"].clone());
            data.insert("canceled".into(), json!(params["canceled"].as_bool().unwrap_or(false)));
            data.insert("resource_type".into(), params["type"].clone());
            ("network", "network_loading_failed", data, false)
        }
        "Page.frameNavigated" => {
            let frame = &params["frame"];
            let main = frame.get("parentId").is_none();
            if main {
                target.url = frame["url"].as_str().unwrap_or_default().to_owned();
                target.loader_id = frame["loaderId"].as_str().unwrap_or_default().to_owned();
                target.nav_seq += 1;
            }
            if !capture.page {
                return None;
            }
            let mut data = context(target, session, frame["id"].as_str(), frame["url"].as_str());
            data.remove("nav_seq");
            if let Some(parent) = frame["parentId"].as_str() {
                data.insert("parent_frame_id".into(), json!(parent));
            }
            ("page", "page_navigation", data, false)
        }
        "Page.domContentEventFired" if capture.page => {
            let mut data = context(target, session, None, None);
            data.insert("cdp_timestamp".into(), params["timestamp"].clone());
            ("page", "page_dom_content_loaded", data, false)
        }
        "Page.loadEventFired" if capture.page => {
            let mut data = context(target, session, None, None);
            data.insert("cdp_timestamp".into(), params["timestamp"].clone());
            ("page", "page_load", data, false)
        }
        "PerformanceTimeline.timelineEventAdded" if capture.page => {
            let event = &params["event"];
            let mut data = context(target, session, None, None);
            data.insert("source_frame_id".into(), event["frameId"].clone());
            data.insert("time".into(), event["time"].clone());
            match event["type"].as_str() {
                Some("layout-shift") => {
                    let details = &event["layoutShiftDetails"];
                    data.insert("duration".into(), event["duration"].clone());
                    data.insert(
                        "layout_shift_details".into(),
                        json!({ "value": details["value"], "had_recent_input": details["hadRecentInput"] }),
                    );
                    ("page", "page_layout_shift", data, false)
                }
                Some("largest-contentful-paint") => {
                    let details = &event["lcpDetails"];
                    data.insert(
                        "lcp_details".into(),
                        json!({
                            "render_time": details["renderTime"],
                            "load_time": details["loadTime"],
                            "size": details["size"],
                            "element_id": details["elementId"],
                            "url": bounded(details["url"].as_str().unwrap_or_default()).0,
                            "node_id": details["nodeId"],
                        }),
                    );
                    ("page", "page_lcp", data, false)
                }
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(Captured {
        category,
        kind,
        data: Value::Object(without_nulls(data)),
        source_event: method.to_owned(),
        truncated,
    })
}

/// A browser-level event (target discovery): a tab opened, a target crashed.
pub fn from_browser_event(
    capture: &TelemetryCapture, method: &str, params: &Value, known: Option<&Target>,
) -> Option<Captured> {
    if !capture.page {
        return None;
    }
    let (kind, data) = match method {
        "Target.targetCreated" if params["targetInfo"]["type"] == "page" => {
            let info = &params["targetInfo"];
            let data = json!({
                "target_id": info["targetId"],
                "target_type": "page",
                "url": bounded(info["url"].as_str().unwrap_or_default()).0,
                "title": bounded(info["title"].as_str().unwrap_or_default()).0,
                "opener_id": info["openerId"],
            });
            ("page_tab_opened", data)
        }
        "Target.targetCrashed" => {
            let data = json!({
                "target_id": params["targetId"],
                "target_type": target_type(known.map(|t| t.target_type.as_str()).unwrap_or("page")),
                "url": known.map(|t| t.url.clone()).unwrap_or_default(),
            });
            ("page_crashed", data)
        }
        _ => return None,
    };
    let Value::Object(data) = data else {
        return None;
    };
    Some(Captured {
        category: "page",
        kind,
        data: Value::Object(without_nulls(data)),
        source_event: method.to_owned(),
        truncated: false,
    })
}

impl Requests {
    fn remember(&mut self, request_id: &str, method: &str, url: &str) {
        if self.pending.len() >= MAX_PENDING_REQUESTS {
            self.pending.clear();
        }
        self.pending.insert(request_id.to_owned(), (method.to_owned(), bounded(url).0));
    }

    fn method(&self, request_id: &str) -> String {
        self.pending.get(request_id).map(|(method, _)| method.clone()).unwrap_or_default()
    }

    fn forget(&mut self, request_id: &str) -> Option<(String, String)> {
        self.pending.remove(request_id)
    }
}

/// How a console argument reads: a string as itself, other primitives as JSON, objects
/// by their description.
fn render_remote_object(object: &Value) -> String {
    match &object["value"] {
        Value::String(text) => text.clone(),
        Value::Null if object.get("value").is_none() => object["description"]
            .as_str()
            .or(object["unserializableValue"].as_str())
            .or(object["type"].as_str())
            .unwrap_or_default()
            .to_owned(),
        value => value.to_string(),
    }
}

/// Headers with the values of secret ones replaced, each value bounded.
pub fn redacted_headers(headers: &Value) -> Value {
    let Some(headers) = headers.as_object() else {
        return json!({});
    };
    let redacted = headers
        .iter()
        .take(128)
        .map(|(name, value)| {
            let value = if SECRET_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                json!(REDACTED)
            } else {
                json!(bounded(value.as_str().unwrap_or_default()).0)
            };
            (bounded(name).0, value)
        })
        .collect();
    Value::Object(redacted)
}

fn without_nulls(mut data: Map<String, Value>) -> Map<String, Value> {
    data.retain(|_, value| !value.is_null());
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> TelemetryCapture {
        TelemetryCapture {
            console: true,
            network: true,
            page: true,
            interaction: false,
            screenshot: false,
        }
    }

    #[test]
    fn secret_headers_never_leave_the_vm() {
        let headers = redacted_headers(&json!({
            "Authorization": "Bearer s3cret", "Cookie": "a=b", "Accept": "text/html"
        }));
        assert_eq!(headers["Authorization"], REDACTED);
        assert_eq!(headers["Cookie"], REDACTED);
        assert_eq!(headers["Accept"], "text/html");
    }

    #[test]
    fn console_errors_and_logs_carry_their_text_and_place() {
        let mut target = Target {
            target_id: "T".into(),
            target_type: "page".into(),
            url: "https://example.test/".into(),
            ..Target::default()
        };
        let mut requests = Requests::default();
        let params = json!({
            "type": "error",
            "args": [{"type": "string", "value": "boom"}, {"type": "number", "value": 7}],
            "stackTrace": {"callFrames": [{"url": "https://example.test/a.js", "lineNumber": 3, "columnNumber": 9}]}
        });
        let event = from_target_event(
            &all(),
            "Runtime.consoleAPICalled",
            &params,
            "S",
            &mut target,
            &mut requests,
        )
        .map(|e| (e.kind, e.data));
        let (kind, data) = event.unwrap_or(("none", Value::Null));
        assert_eq!(kind, "console_error");
        assert_eq!(data["text"], "boom 7");
        assert_eq!(data["line"], 3);
        assert_eq!(data["target_id"], "T");
        assert_eq!(data["url"], "https://example.test/");
    }

    #[test]
    fn off_categories_produce_nothing_but_navigations_still_count() {
        let mut target = Target::default();
        let mut requests = Requests::default();
        let none = TelemetryCapture::default();
        let navigated = json!({"frame": {"id": "F", "loaderId": "L", "url": "https://a.test/"}});
        assert!(
            from_target_event(
                &none,
                "Page.frameNavigated",
                &navigated,
                "S",
                &mut target,
                &mut requests
            )
            .is_none()
        );
        assert_eq!((target.nav_seq, target.url.as_str()), (1, "https://a.test/"));
    }
}
