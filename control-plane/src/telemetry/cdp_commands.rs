//! `cdp_command`: the browser-control commands a client sends over the CDP proxy (input,
//! navigation, dialogs, file selection, screenshots, targets and windows), one event each,
//! with only the arguments the SDK approves for that command. What could hold a secret
//! (typed text, URLs, referrers, scripts, templates, file paths, drag contents, autofill
//! values) becomes a length, a count, a presence flag or a URL scheme. Configuration
//! commands and the DOM/Runtime traffic a client library sends for itself are not
//! reported.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use std::sync::Arc;

use super::Telemetry;
use super::event::Event;
use super::settings::Category;
use crate::store::SessionRecord;

/// Longest client message looked at (larger ones are configuration or bulk data).
pub const MAX_COMMAND_BYTES: usize = 1 << 20;
/// Longest CDP session id kept, as the SDK clips it.
const MAX_SESSION_ID: usize = 128;

/// The commands reported, each with the arguments copied as they are (numbers, booleans
/// and ids; camelCase in CDP, snake_case in the event); `special` adds the rest.
const COMMANDS: &[(&str, &[&str])] = &[
    (
        "Input.dispatchMouseEvent",
        &[
            "x",
            "y",
            "modifiers",
            "buttons",
            "clickCount",
            "force",
            "tangentialPressure",
            "tiltX",
            "tiltY",
            "twist",
            "deltaX",
            "deltaY",
        ],
    ),
    ("Input.dispatchKeyEvent", &["modifiers", "autoRepeat", "isKeypad", "isSystemKey", "location"]),
    ("Input.insertText", &[]),
    (
        "Input.imeSetComposition",
        &["selectionStart", "selectionEnd", "replacementStart", "replacementEnd"],
    ),
    ("Input.dispatchTouchEvent", &["modifiers"]),
    ("Input.dispatchDragEvent", &["x", "y", "modifiers"]),
    ("Input.cancelDragging", &[]),
    (
        "Input.emulateTouchFromMouseEvent",
        &["x", "y", "modifiers", "clickCount", "deltaX", "deltaY"],
    ),
    ("Input.synthesizePinchGesture", &["x", "y", "scaleFactor", "relativeSpeed"]),
    (
        "Input.synthesizeScrollGesture",
        &[
            "x",
            "y",
            "xDistance",
            "yDistance",
            "xOverscroll",
            "yOverscroll",
            "preventFling",
            "speed",
            "repeatCount",
            "repeatDelayMs",
        ],
    ),
    ("Input.synthesizeTapGesture", &["x", "y", "duration", "tapCount"]),
    ("DOM.setFileInputFiles", &["nodeId", "backendNodeId", "objectId"]),
    ("DOM.focus", &["nodeId", "backendNodeId", "objectId"]),
    ("DOM.scrollIntoViewIfNeeded", &["nodeId", "backendNodeId", "objectId"]),
    ("Page.bringToFront", &[]),
    (
        "Page.captureScreenshot",
        &["quality", "fromSurface", "captureBeyondViewport", "optimizeForSpeed"],
    ),
    ("Page.captureSnapshot", &[]),
    ("Page.handleJavaScriptDialog", &["accept"]),
    ("Page.navigate", &["frameId", "referrerPolicy", "transitionType"]),
    ("Page.navigateToHistoryEntry", &["entryId"]),
    ("Page.reload", &["ignoreCache", "loaderId"]),
    (
        "Page.printToPDF",
        &[
            "landscape",
            "displayHeaderFooter",
            "printBackground",
            "scale",
            "paperWidth",
            "paperHeight",
            "marginTop",
            "marginBottom",
            "marginLeft",
            "marginRight",
            "preferCSSPageSize",
            "generateTaggedPDF",
            "generateDocumentOutline",
        ],
    ),
    ("Page.startScreencast", &["quality", "maxWidth", "maxHeight", "everyNthFrame"]),
    ("Page.stopScreencast", &[]),
    ("Page.stopLoading", &[]),
    ("Page.close", &[]),
    ("Page.setWebLifecycleState", &[]),
    ("Target.activateTarget", &["targetId"]),
    ("Target.closeTarget", &["targetId"]),
    (
        "Target.createTarget",
        &[
            "left",
            "top",
            "width",
            "height",
            "browserContextId",
            "enableBeginFrameControl",
            "newWindow",
            "background",
            "forTab",
            "hidden",
            "focus",
        ],
    ),
    ("Target.createBrowserContext", &["disposeOnDetach"]),
    ("Target.disposeBrowserContext", &["browserContextId"]),
    ("Target.openDevTools", &["targetId", "panelId"]),
    ("Browser.cancelDownload", &["guid", "browserContextId"]),
    ("Browser.close", &[]),
    ("Browser.setWindowBounds", &["windowId"]),
    ("Browser.setContentsSize", &["windowId", "width", "height"]),
    ("Autofill.trigger", &["fieldId", "frameId"]),
];

/// Records one CDP connection's commands as its session's telemetry.
pub struct CommandRecorder {
    telemetry: Arc<Telemetry>,
    session: SessionRecord,
    connection_id: String,
}

impl CommandRecorder {
    pub fn new(telemetry: Arc<Telemetry>, session: SessionRecord, connection_id: String) -> Self {
        Self { telemetry, session, connection_id }
    }

    /// One message the client sent (a text frame's payload, unmasked).
    pub fn record(&self, message: &[u8]) {
        if let Some(event) = command_event(message, &self.connection_id) {
            self.telemetry.record_current(&self.session, event);
        }
    }
}

#[derive(Deserialize)]
struct Command {
    id: Option<i64>,
    method: String,
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
    #[serde(default)]
    params: Map<String, Value>,
}

/// The `cdp_command` event of one client message, if it is a reported command.
pub fn command_event(message: &[u8], connection_id: &str) -> Option<Event> {
    if message.len() > MAX_COMMAND_BYTES || !names_a_reported_method(message) {
        return None;
    }
    let command: Command = serde_json::from_slice(message).ok()?;
    let (method, copied) = COMMANDS.iter().find(|(method, _)| *method == command.method)?;
    let params = &command.params;
    let mut data = Map::new();
    data.insert("method".into(), json!(method));
    data.insert("connection_id".into(), json!(connection_id));
    if let Some(id) = command.id {
        data.insert("command_id".into(), json!(id));
    }
    if let Some(session) = &command.session_id {
        let clipped: String = session.chars().take(MAX_SESSION_ID).collect();
        data.insert("session_id".into(), json!(clipped));
    }
    for name in *copied {
        if let Some(value) = params.get(*name).filter(|value| is_plain(value)) {
            data.insert(snake_case(name), value.clone());
        }
    }
    special(method, params, &mut data);
    Some(Event::api(Category::Control, "cdp_command", Value::Object(data)))
}

/// A quick look for `"method"` naming a reported command, before any parsing: most of a
/// client's messages are DOM and Runtime traffic.
fn names_a_reported_method(message: &[u8]) -> bool {
    const DOMAINS: [&[u8]; 6] =
        [b"\"Input.", b"\"DOM.", b"\"Page.", b"\"Target.", b"\"Browser.", b"\"Autofill."];
    DOMAINS.iter().any(|domain| message.windows(domain.len()).any(|window| window == *domain))
}

/// Numbers, booleans and short strings (ids): never objects or long text.
fn is_plain(value: &Value) -> bool {
    match value {
        Value::Number(_) | Value::Bool(_) => true,
        Value::String(text) => text.len() <= 128,
        _ => false,
    }
}

/// `clickCount` → `click_count`; an acronym stays one word (`preferCSSPageSize` →
/// `prefer_css_page_size`).
fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (index, c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            let previous_lower = chars[index - 1].is_ascii_lowercase();
            let acronym_ends = chars[index - 1].is_ascii_uppercase()
                && chars.get(index + 1).is_some_and(char::is_ascii_lowercase);
            if previous_lower || acronym_ends {
                out.push('_');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// `value` if it is one of `allowed`, else `other` (as the SDK reports unknown values).
fn one_of(value: Option<&Value>, allowed: &[&str]) -> Option<Value> {
    let value = value?.as_str()?;
    Some(json!(if allowed.contains(&value) { value } else { "other" }))
}

fn text_length(value: Option<&Value>) -> Option<Value> {
    value?.as_str().map(|text| json!(text.chars().count()))
}

fn count(value: Option<&Value>) -> Option<Value> {
    value?.as_array().map(|items| json!(items.len()))
}

fn present(value: Option<&Value>) -> Value {
    json!(value.is_some_and(|value| match value {
        Value::Null => false,
        Value::String(text) => !text.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => true,
    }))
}

fn url_scheme(value: Option<&Value>) -> Option<Value> {
    let url = url::Url::parse(value?.as_str()?).ok()?;
    Some(json!(url.scheme()))
}

/// The arguments each command reports in a form of its own.
fn special(method: &str, params: &Map<String, Value>, data: &mut Map<String, Value>) {
    let mut put = |name: &str, value: Option<Value>| {
        if let Some(value) = value {
            data.insert(name.to_owned(), value);
        }
    };
    const MOUSE_EVENTS: &[&str] = &["mousePressed", "mouseReleased", "mouseMoved", "mouseWheel"];
    const BUTTONS: &[&str] = &["none", "left", "middle", "right", "back", "forward"];
    const GESTURE_SOURCES: &[&str] = &["default", "touch", "mouse"];
    const WINDOW_STATES: &[&str] = &["normal", "minimized", "maximized", "fullscreen"];
    match method {
        "Input.dispatchMouseEvent" | "Input.emulateTouchFromMouseEvent" => {
            put("event_type", one_of(params.get("type"), MOUSE_EVENTS));
            put("button", one_of(params.get("button"), BUTTONS));
            put("pointer_type", one_of(params.get("pointerType"), &["mouse", "pen"]));
        }
        "Input.dispatchKeyEvent" => {
            put(
                "event_type",
                one_of(params.get("type"), &["keyDown", "keyUp", "rawKeyDown", "char"]),
            );
            put("text_length", text_length(params.get("text")));
            put("command_count", count(params.get("commands")));
            // A key that commands the page (`Enter`, `F5`, `ArrowDown`), never one that
            // types a character (an emoji or a composed letter is more than one char
            // too, but no such name).
            let key = params.get("key").and_then(Value::as_str).unwrap_or_default();
            let named = key.len() > 1
                && key.len() <= 32
                && key.starts_with(|c: char| c.is_ascii_uppercase())
                && key.chars().all(|c| c.is_ascii_alphanumeric());
            if named {
                put("named_key", Some(json!(key)));
            }
        }
        "Input.insertText" | "Input.imeSetComposition" => {
            put("text_length", text_length(params.get("text")).or(Some(json!(0))));
        }
        "Input.dispatchTouchEvent" => {
            put(
                "event_type",
                one_of(params.get("type"), &["touchStart", "touchEnd", "touchMove", "touchCancel"]),
            );
            put("touch_point_count", count(params.get("touchPoints")).or(Some(json!(0))));
            let first = params
                .get("touchPoints")
                .and_then(|points| points.get(0))
                .and_then(Value::as_object);
            for name in [
                "x",
                "y",
                "radiusX",
                "radiusY",
                "rotationAngle",
                "force",
                "tangentialPressure",
                "tiltX",
                "tiltY",
                "twist",
            ] {
                let value = first.and_then(|point| point.get(name)).filter(|v| v.is_number());
                put(&snake_case(name), value.cloned());
            }
        }
        "Input.dispatchDragEvent" => {
            put(
                "event_type",
                one_of(params.get("type"), &["dragEnter", "dragOver", "drop", "dragCancel"]),
            );
            let drag = params.get("data");
            put("drag_item_count", count(drag.and_then(|d| d.get("items"))));
            put("drag_file_count", count(drag.and_then(|d| d.get("files"))));
            put(
                "drag_operations_mask",
                drag.and_then(|d| d.get("dragOperationsMask")).filter(|v| v.is_number()).cloned(),
            );
        }
        "Input.synthesizePinchGesture"
        | "Input.synthesizeScrollGesture"
        | "Input.synthesizeTapGesture" => {
            put("gesture_source_type", one_of(params.get("gestureSourceType"), GESTURE_SOURCES));
        }
        "DOM.setFileInputFiles" => {
            put("file_count", count(params.get("files")).or(Some(json!(0))));
        }
        "DOM.scrollIntoViewIfNeeded" => {
            let rect = params.get("rect");
            for name in ["x", "y", "width", "height"] {
                let value = rect.and_then(|r| r.get(name)).filter(|v| v.is_number());
                put(&format!("rect_{name}"), value.cloned());
            }
        }
        "Page.captureScreenshot" => {
            put("format", one_of(params.get("format"), &["jpeg", "png", "webp"]));
            let clip = params.get("clip");
            for name in ["x", "y", "width", "height", "scale"] {
                let value = clip.and_then(|c| c.get(name)).filter(|v| v.is_number());
                put(&format!("clip_{name}"), value.cloned());
            }
        }
        "Page.captureSnapshot" => put("format", one_of(params.get("format"), &["mhtml"])),
        "Page.handleJavaScriptDialog" => {
            put("prompt_text_length", text_length(params.get("promptText")));
        }
        "Page.navigate" => {
            put("url_scheme", url_scheme(params.get("url")));
            put("referrer_present", Some(present(params.get("referrer"))));
        }
        "Page.reload" => {
            put("script_length", text_length(params.get("scriptToEvaluateOnLoad")));
        }
        "Page.printToPDF" => {
            put(
                "transfer_mode",
                one_of(params.get("transferMode"), &["ReturnAsBase64", "ReturnAsStream"]),
            );
            put("header_template_present", Some(present(params.get("headerTemplate"))));
            put("footer_template_present", Some(present(params.get("footerTemplate"))));
            put("page_ranges_present", Some(present(params.get("pageRanges"))));
        }
        "Page.startScreencast" => {
            put("format", one_of(params.get("format"), &["jpeg", "png"]));
        }
        "Page.setWebLifecycleState" => {
            put("state", one_of(params.get("state"), &["frozen", "active"]));
        }
        "Target.createTarget" => {
            put("url_scheme", url_scheme(params.get("url")));
            put("window_state", one_of(params.get("windowState"), WINDOW_STATES));
        }
        "Target.createBrowserContext" => {
            put("proxy_server_present", Some(present(params.get("proxyServer"))));
            put("proxy_bypass_list_present", Some(present(params.get("proxyBypassList"))));
            put(
                "universal_network_access_origin_count",
                count(params.get("originsWithUniversalNetworkAccess")),
            );
        }
        "Browser.cancelDownload" => {
            if let Some(guid) = data.remove("guid") {
                data.insert("download_guid".into(), guid);
            }
        }
        "Browser.setWindowBounds" => {
            let bounds = params.get("bounds");
            for name in ["left", "top", "width", "height"] {
                let value = bounds.and_then(|b| b.get(name)).filter(|v| v.is_number());
                put(name, value.cloned());
            }
            put("window_state", one_of(bounds.and_then(|b| b.get("windowState")), WINDOW_STATES));
        }
        "Autofill.trigger" => {
            if params.get("card").is_some() {
                put("mode", Some(json!("card")));
            } else if let Some(address) = params.get("address") {
                put("mode", Some(json!("address")));
                put("address_field_count", count(address.get("fields")));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(message: Value) -> Option<Value> {
        command_event(message.to_string().as_bytes(), "c1").map(|event| event.data)
    }

    #[test]
    fn input_is_reported_without_what_was_typed() {
        let click = data(json!({"id": 7, "sessionId": "S", "method": "Input.dispatchMouseEvent",
            "params": {"type": "mousePressed", "x": 10.5, "y": 20, "button": "left", "clickCount": 1}}))
        .expect("reported");
        assert_eq!(
            click,
            json!({"method": "Input.dispatchMouseEvent", "connection_id": "c1", "command_id": 7,
                "session_id": "S", "event_type": "mousePressed", "x": 10.5, "y": 20,
                "button": "left", "click_count": 1})
        );
        let typed =
            data(json!({"id": 8, "method": "Input.insertText", "params": {"text": "hunter2"}}))
                .expect("reported");
        assert_eq!(typed["text_length"], 7);
        assert!(!typed.to_string().contains("hunter2"));
        let key = data(json!({"id": 9, "method": "Input.dispatchKeyEvent",
            "params": {"type": "keyDown", "key": "p", "text": "p"}}))
        .expect("reported");
        assert!(key.get("named_key").is_none() && key["text_length"] == 1);
        let enter = data(json!({"method": "Input.dispatchKeyEvent",
            "params": {"type": "keyDown", "key": "Enter"}}))
        .expect("reported");
        assert_eq!(enter["named_key"], "Enter");
        for typed in ["é", "e\u{301}", "👍🏽", "ab"] {
            let key = data(json!({"method": "Input.dispatchKeyEvent",
                "params": {"type": "keyDown", "key": typed}}))
            .expect("reported");
            assert!(key.get("named_key").is_none(), "{typed}");
        }
        let odd = data(json!({"method": "Input.dispatchMouseEvent", "params": {"type": "pinch"}}))
            .expect("reported");
        assert_eq!(odd["event_type"], "other");
    }

    #[test]
    fn urls_and_paths_become_schemes_and_counts() {
        let navigate = data(json!({"id": 1, "method": "Page.navigate",
            "params": {"url": "https://example.com/secret?token=x", "referrer": "https://r.example/"}}))
        .expect("reported");
        assert_eq!(navigate["url_scheme"], "https");
        assert_eq!(navigate["referrer_present"], true);
        assert!(!navigate.to_string().contains("example.com"));
        let files = data(json!({"id": 2, "method": "DOM.setFileInputFiles",
            "params": {"files": ["/home/kernel/a.pdf", "/b"], "backendNodeId": 4}}))
        .expect("reported");
        assert_eq!(files["file_count"], 2);
        assert_eq!(files["backend_node_id"], 4);
        assert!(!files.to_string().contains("a.pdf"));
        let pdf = data(json!({"method": "Page.printToPDF",
            "params": {"preferCSSPageSize": true, "generateTaggedPDF": false, "headerTemplate": "<b>x</b>"}}))
        .expect("reported");
        assert_eq!(pdf["prefer_css_page_size"], true);
        assert_eq!(pdf["generate_tagged_pdf"], false);
        assert_eq!(pdf["header_template_present"], true);
    }

    #[test]
    fn names_are_the_sdk_s() {
        assert_eq!(snake_case("preferCSSPageSize"), "prefer_css_page_size");
        assert_eq!(snake_case("generateTaggedPDF"), "generate_tagged_pdf");
        assert_eq!(snake_case("xDistance"), "x_distance");
        assert_eq!(snake_case("tiltX"), "tilt_x");
        assert_eq!(snake_case("backendNodeId"), "backend_node_id");
    }

    #[test]
    fn library_traffic_and_undecodable_messages_are_not_reported() {
        assert!(
            data(json!({"id": 1, "method": "Runtime.evaluate", "params": {"expression": "1"}}))
                .is_none()
        );
        assert!(data(json!({"id": 2, "method": "Page.enable"})).is_none());
        assert!(command_event(b"{\"method\":\"Page.navigate\"", "c1").is_none());
        assert!(command_event(b"not json Page.", "c1").is_none());
    }
}
