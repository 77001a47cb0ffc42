//! One telemetry event as the SDK reads it (`{type, category, ts, source, data}`), the
//! ones the control plane itself produces, and the check every event from a VM passes
//! before the host keeps it: the VM names a type, and the host decides its category
//! from that type, bounds its size and time, and stamps the source.

use serde_json::{Map, Value, json};

use super::settings::Category;

/// Largest `data` object kept from a VM; a larger one is kept without its data.
const MAX_VM_DATA_BYTES: usize = 64 * 1024;
/// Largest screenshot (`monitor_screenshot`, base64 PNG) kept from a VM.
pub const MAX_VM_SCREENSHOT_BYTES: usize = 1536 * 1024;
/// How far a VM's clock may be from the host's before the host's time is used.
const MAX_VM_CLOCK_SKEW_US: i64 = 60 * 1_000_000;

#[derive(Clone, Debug)]
pub struct Event {
    pub category: Category,
    pub kind: String,
    /// Unix microseconds.
    pub ts_us: i64,
    /// `cdp`, `kernel_api` or `local_process`.
    pub source_kind: &'static str,
    pub source_event: Option<String>,
    pub data: Value,
    pub truncated: bool,
}

pub fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

impl Event {
    /// An event of the control plane's own, happening now.
    pub fn api(category: Category, kind: &str, data: Value) -> Self {
        Self {
            category,
            kind: kind.to_owned(),
            ts_us: now_us(),
            source_kind: "kernel_api",
            source_event: None,
            data,
            truncated: false,
        }
    }

    /// The SDK's event object.
    pub fn body(&self) -> Value {
        let mut source = Map::new();
        source.insert("kind".into(), json!(self.source_kind));
        if let Some(event) = &self.source_event {
            source.insert("event".into(), json!(event));
        }
        let mut body = json!({
            "type": self.kind,
            "category": self.category.as_str(),
            "ts": self.ts_us,
            "source": source,
            "data": self.data,
        });
        if self.truncated {
            body["truncated"] = json!(true);
        }
        body
    }

    /// A VM's record, checked: its type must be one a VM produces, and its category is
    /// that type's. `None` for anything else.
    pub fn from_vm(
        kind: &str, ts_us: i64, data_json: &str, source_event: &str, truncated: bool,
    ) -> Option<Self> {
        let category = vm_type_category(kind)?;
        let now = now_us();
        let ts_us = if (ts_us - now).abs() > MAX_VM_CLOCK_SKEW_US { now } else { ts_us };
        let limit = if category == Category::Screenshot {
            MAX_VM_SCREENSHOT_BYTES
        } else {
            MAX_VM_DATA_BYTES
        };
        let (data, truncated) = if data_json.len() > limit {
            (json!({}), true)
        } else {
            match serde_json::from_str::<Value>(data_json) {
                Ok(data @ Value::Object(_)) => (data, truncated),
                _ => return None,
            }
        };
        let source_event =
            (!source_event.is_empty() && source_event.len() <= 64).then(|| source_event.to_owned());
        let source_kind = if category == Category::System || category == Category::Monitor {
            "local_process"
        } else {
            "cdp"
        };
        Some(Self {
            category,
            kind: kind.to_owned(),
            ts_us,
            source_kind,
            source_event,
            data,
            truncated,
        })
    }
}

/// The category of each event type a VM may report.
fn vm_type_category(kind: &str) -> Option<Category> {
    Some(match kind {
        "console_log" | "console_error" => Category::Console,
        "network_request" | "network_response" | "network_loading_failed" | "network_idle" => {
            Category::Network
        }
        "page_navigation"
        | "page_dom_content_loaded"
        | "page_load"
        | "page_tab_opened"
        | "page_crashed"
        | "page_layout_shift"
        | "page_lcp"
        | "page_layout_settled"
        | "page_navigation_settled" => Category::Page,
        "interaction_click" | "interaction_key" | "interaction_scroll_settled" => {
            Category::Interaction
        }
        "monitor_disconnected"
        | "monitor_reconnected"
        | "monitor_reconnect_failed"
        | "monitor_init_failed" => Category::Monitor,
        "service_crashed" => Category::System,
        "monitor_screenshot" => Category::Screenshot,
        _ => return None,
    })
}

/// `api_call`: an API call on the session.
pub fn api_call(operation_id: &str, request_id: &str, status: u16, duration_ms: f64) -> Event {
    let platform = is_platform_operation(operation_id);
    let (category, kind) = if platform {
        (Category::Platform, "platform_api_call")
    } else {
        (Category::Control, "api_call")
    };
    Event::api(
        category,
        kind,
        json!({
            "operation_id": operation_id,
            "request_id": request_id,
            "status": status,
            "duration_ms": duration_ms,
        }),
    )
}

/// `proxy_error`: the VM's `network_loading_failed` (a refused tunnel) or
/// `network_response` (a refused plain request) of a request the session's egress proxy
/// noted it refused or could not carry (`failures` finds it, once). `None` for any other
/// event.
pub fn proxy_error(
    vm_event: &Event, failures: &crate::egress::ProxyFailures, session_id: &str,
) -> Option<Event> {
    let data = &vm_event.data;
    let refused_here = match vm_event.kind.as_str() {
        "network_loading_failed" => data["error_text"]
            .as_str()
            .is_some_and(|text| text.contains("ERR_TUNNEL") || text.contains("ERR_PROXY")),
        "network_response" => matches!(data["status"].as_u64(), Some(403 | 502)),
        _ => false,
    };
    if !refused_here {
        return None;
    }
    let failure = failures.take(session_id, data["url"].as_str()?)?;
    // The context (target, frame, navigation, URL) is the browser's; the code is ours.
    let mut error: Map<String, Value> = [
        "target_id",
        "target_type",
        "session_id",
        "frame_id",
        "loader_id",
        "nav_seq",
        "url",
        "request_id",
        "resource_type",
    ]
    .into_iter()
    .filter_map(|key| Some((key.to_owned(), data.get(key)?.clone())))
    .collect();
    error.insert("code".into(), json!(failure.code));
    error.insert("status".into(), json!(failure.status));
    error.insert("method".into(), json!(failure.method));
    Some(Event {
        category: Category::Network,
        kind: "proxy_error".into(),
        ts_us: vm_event.ts_us,
        source_kind: "cdp",
        source_event: vm_event.source_event.clone(),
        data: Value::Object(error),
        truncated: false,
    })
}

/// Calls that manage the VM rather than drive the browser (the SDK's `platform`).
fn is_platform_operation(operation_id: &str) -> bool {
    ["replays", "fs", "process", "telemetry", "update", "retrieve", "logs"]
        .iter()
        .any(|prefix| operation_id.split('.').nth(1) == Some(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failure_the_proxy_noted_becomes_a_proxy_error_once() {
        let failures = crate::egress::ProxyFailures::default();
        let failed = Event::from_vm(
            "network_loading_failed",
            now_us(),
            r#"{"url":"https://blocked.example/x","request_id":"7.1","error_text":"net::ERR_TUNNEL_CONNECTION_FAILED","target_id":"T"}"#,
            "Network.loadingFailed",
            false,
        )
        .expect("a VM event");
        // Made up by the VM: the proxy refused nothing.
        assert!(proxy_error(&failed, &failures, "s1").is_none());
        failures.note(
            "s1",
            crate::egress::ProxyFailure {
                code: "network_policy_denied",
                status: 403,
                method: "CONNECT".into(),
                host: "blocked.example".into(),
                port: 443,
            },
        );
        let error = proxy_error(&failed, &failures, "s1").expect("joined");
        assert_eq!(error.kind, "proxy_error");
        assert_eq!(error.category, Category::Network);
        assert_eq!(error.data["code"], "network_policy_denied");
        assert_eq!(error.data["status"], 403);
        assert_eq!(error.data["request_id"], "7.1");
        assert_eq!(error.data["target_id"], "T");
        assert!(error.data.get("error_text").is_none());
        assert!(proxy_error(&failed, &failures, "s1").is_none());
    }

    #[test]
    fn a_vm_cannot_choose_the_category_or_send_unknown_types() {
        let event = Event::from_vm(
            "console_log",
            now_us(),
            r#"{"text":"hi"}"#,
            "Runtime.consoleAPICalled",
            false,
        );
        assert!(
            event
                .as_ref()
                .is_some_and(|e| e.category == Category::Console && e.source_kind == "cdp")
        );
        assert!(Event::from_vm("api_call", now_us(), "{}", "", false).is_none());
        assert!(Event::from_vm("console_log", now_us(), "[1]", "", false).is_none());
        assert!(Event::from_vm("console_log", now_us(), "not json", "", false).is_none());
    }

    #[test]
    fn a_vm_clock_far_off_is_replaced_and_huge_data_dropped() {
        let event = Event::from_vm("page_load", 1, "{}", "", false);
        assert!(event.is_some_and(|e| (e.ts_us - now_us()).abs() < 5_000_000));
        let huge = format!(r#"{{"text":"{}"}}"#, "x".repeat(MAX_VM_DATA_BYTES));
        let event = Event::from_vm("console_log", now_us(), &huge, "", false);
        assert!(event.is_some_and(|e| e.truncated && e.data == json!({})));
    }
}
