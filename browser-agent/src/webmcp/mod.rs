//! WebMCP: the tools pages register (`document.modelContext.registerTool`, declarative
//! `<form toolname>`), found and called through Chromium's DevTools `WebMCP` domain.
//!
//! Each list or call is a short DevTools conversation of the agent's own: it attaches to
//! every tab and out-of-process frame, enables `WebMCP` (which reports the tools already
//! registered), and hangs up, so nothing runs while no one asks and the user's own
//! clients see none of it. A `tool_ref` names one live registration: the target and
//! frame, the document (its loader id, which a navigation replaces) and the tool's name;
//! a call checks that document is still the frame's before it invokes anything.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tonic::Status;

use crate::cdp_client::{CdpClient, Event, Incoming};

pub mod custom;

pub use custom::CustomTools;

/// How long finding the tools may take in all.
const LIST_PATIENCE: Duration = Duration::from_secs(15);
/// Marks our refs, so a foreign string is told apart from a stale ref.
const REF_PREFIX: &str = "wmcp_";

/// A tool found in a tab or frame.
pub struct Found {
    pub tool_ref: String,
    /// MCP's shape: name, description, inputSchema, annotations.
    pub tool: Value,
    pub tab_id: i64,
    pub window_id: i64,
    pub page_url: String,
    pub page_title: String,
    /// The embedded frame that registered it (its number and URL), if not the page.
    pub frame: Option<(i64, String)>,
    /// A custom tool's id and namespace, and its tab's DevTools target id.
    pub custom: Option<(String, String, String)>,
}

/// What a call came to.
pub struct Outcome {
    pub invocation_id: String,
    pub status: &'static str,
    pub error_text: Option<String>,
    pub output: Option<Value>,
}

/// What a `tool_ref` holds: where the registration lives and in which document.
#[derive(Serialize, Deserialize)]
struct ToolRef {
    /// The target (tab or out-of-process frame) whose document registered it.
    #[serde(rename = "t")]
    target: String,
    #[serde(rename = "f")]
    frame: String,
    /// The frame's document: a navigation gives it another loader id.
    #[serde(rename = "l")]
    loader: String,
    #[serde(rename = "n")]
    name: String,
    /// A custom tool's id (run in the page `target`, whose top frame is `frame`).
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    custom: Option<String>,
}

impl ToolRef {
    fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("{REF_PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    fn decode(text: &str) -> Option<Self> {
        let bytes = URL_SAFE_NO_PAD.decode(text.strip_prefix(REF_PREFIX)?).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// Numbers for tabs and frames, handed out in order and kept while the Chromium process
/// lives (DevTools names them by opaque ids only).
#[derive(Default)]
pub struct Numbering {
    inner: Mutex<NumberingState>,
}

#[derive(Default)]
struct NumberingState {
    /// The Chromium the numbers belong to (its DevTools URL changes with each start).
    browser: String,
    numbers: HashMap<String, i64>,
    next: i64,
}

impl Numbering {
    fn number(&self, browser: &str, id: &str) -> i64 {
        let Ok(mut state) = self.inner.lock() else {
            return 0;
        };
        if state.browser != browser {
            *state = NumberingState { browser: browser.to_owned(), ..NumberingState::default() };
        }
        if let Some(number) = state.numbers.get(id) {
            return *number;
        }
        state.next += 1;
        let number = state.next;
        state.numbers.insert(id.to_owned(), number);
        number
    }
}

fn is_wanted(method: &str) -> bool {
    method.starts_with("WebMCP.") || method == "Target.detachedFromTarget"
}

/// Chromium's own interface in a headful browser (the tab strip's WebUI and the like).
fn is_browser_ui(url: &str) -> bool {
    url.starts_with("chrome-untrusted://")
        || url.starts_with("chrome://")
        || url.starts_with("devtools://")
}

/// A URL without its fragment.
fn without_fragment(url: &str) -> String {
    url.split('#').next().unwrap_or_default().to_owned()
}

async fn connect(browser_ws_url: &str) -> Result<CdpClient, Status> {
    if browser_ws_url.is_empty() {
        return Err(Status::unavailable("Chromium is not running"));
    }
    let mut client = CdpClient::connect(browser_ws_url).await.map_err(Status::unavailable)?;
    client.only_events(is_wanted);
    Ok(client)
}

/// A frame of a target's frame tree: its id, document, URL, and whether it is the
/// target's own top frame.
struct Frame {
    loader: String,
    url: String,
    top: bool,
}

fn frames(tree: &Value, top: bool, into: &mut HashMap<String, Frame>) {
    let frame = &tree["frame"];
    if let Some(id) = frame["id"].as_str() {
        into.insert(
            id.to_owned(),
            Frame {
                loader: frame["loaderId"].as_str().unwrap_or_default().to_owned(),
                url: frame["url"].as_str().unwrap_or_default().to_owned(),
                top,
            },
        );
    }
    for child in tree["childFrames"].as_array().into_iter().flatten() {
        frames(child, false, into);
    }
}

/// Attaches to `target`, enables WebMCP there and reads its frames; answers the session,
/// its frames and the tools WebMCP reported as registered.
async fn open(
    client: &mut CdpClient, target: &str,
) -> Result<(String, HashMap<String, Frame>, Vec<Value>), String> {
    let attached = client
        .call("", "Target.attachToTarget", json!({ "targetId": target, "flatten": true }))
        .await?;
    let session = attached["sessionId"].as_str().ok_or("no session")?.to_owned();
    client.call(&session, "WebMCP.enable", json!({})).await?;
    // Asked after the enable, so the tools it reported are already in.
    let tree = client.call(&session, "Page.getFrameTree", json!({})).await?;
    let mut found = HashMap::new();
    frames(&tree["frameTree"], true, &mut found);
    let mut tools: Vec<Value> = Vec::new();
    for incoming in client.take_queued() {
        let Incoming::Event(Event { session: from, method, params }) = incoming else {
            continue;
        };
        if from != session {
            continue;
        }
        let listed = params["tools"].as_array().cloned().unwrap_or_default();
        match method.as_str() {
            "WebMCP.toolsAdded" => tools.extend(listed),
            // One unregistered (or its frame gone) while we looked.
            "WebMCP.toolsRemoved" => tools.retain(|tool| {
                !listed.iter().any(|removed| {
                    removed["name"] == tool["name"] && removed["frameId"] == tool["frameId"]
                })
            }),
            _ => {}
        }
    }
    Ok((session, found, tools))
}

/// The tool in MCP's shape, from what DevTools reports.
fn metadata(tool: &Value) -> Value {
    let mut metadata = json!({
        "name": tool["name"],
        "description": tool["description"].as_str().unwrap_or_default(),
        "inputSchema": if tool["inputSchema"].is_object() { tool["inputSchema"].clone() } else { json!({ "type": "object" }) },
    });
    let hints = &tool["annotations"];
    let mut annotations = serde_json::Map::new();
    for (from, to) in [
        ("readOnly", "readOnlyHint"),
        ("untrustedContent", "untrustedContentHint"),
        ("consequential", "consequentialHint"),
        ("autosubmit", "autosubmit"),
    ] {
        if let Some(value) = hints[from].as_bool() {
            annotations.insert(to.to_owned(), Value::Bool(value));
        }
    }
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    metadata
}

/// The tab a target belongs to: itself for a page, else up its parents to a page.
fn tab_of<'a>(by_id: &HashMap<&'a str, &'a Value>, mut id: &'a str) -> Option<&'a str> {
    for _ in 0..32 {
        let info = by_id.get(id)?;
        if info["type"] == "page" {
            return Some(id);
        }
        id = info["parentId"].as_str()?;
    }
    None
}

/// Every tool registered in the browser's tabs and their frames.
pub async fn list(
    browser_ws_url: &str, numbering: &Numbering, custom: &[custom::Definition],
) -> Result<Vec<Found>, Status> {
    let listed =
        tokio::time::timeout(LIST_PATIENCE, list_now(browser_ws_url, numbering, custom)).await;
    listed.unwrap_or_else(|_| Err(Status::unavailable("Chromium did not answer in time")))
}

async fn list_now(
    browser_ws_url: &str, numbering: &Numbering, custom: &[custom::Definition],
) -> Result<Vec<Found>, Status> {
    let mut client = connect(browser_ws_url).await?;
    let targets =
        client.call("", "Target.getTargets", json!({})).await.map_err(Status::unavailable)?;
    let infos: Vec<Value> = targets["targetInfos"].as_array().cloned().unwrap_or_default();
    let by_id: HashMap<&str, &Value> =
        infos.iter().filter_map(|info| Some((info["targetId"].as_str()?, info))).collect();
    // The addresses of each tab's out-of-process frames, which custom tools match too.
    let mut frame_urls: HashMap<&str, Vec<&str>> = HashMap::new();
    for info in &infos {
        if info["type"] == "iframe"
            && let (Some(id), Some(url)) = (info["targetId"].as_str(), info["url"].as_str())
            && let Some(tab) = tab_of(&by_id, id)
        {
            frame_urls.entry(tab).or_default().push(url);
        }
    }
    let mut found = Vec::new();
    for info in &infos {
        let (Some(target), Some(kind)) = (info["targetId"].as_str(), info["type"].as_str()) else {
            continue;
        };
        if !matches!(kind, "page" | "iframe") {
            continue;
        }
        let Some(tab) = tab_of(&by_id, target) else {
            continue;
        };
        let tab_info = by_id[tab];
        let page_url = tab_info["url"].as_str().unwrap_or_default();
        if is_browser_ui(page_url) {
            continue;
        }
        // A tab that closed meanwhile is simply not listed.
        let Ok((_, frames, tools)) = open(&mut client, target).await else {
            continue;
        };
        // The custom tools this tab shows: on its top-level page, if its page or one of
        // its frames matches.
        let top = frames.iter().find(|(_, frame)| frame.top && kind == "page");
        let urls: Vec<&str> = frames
            .values()
            .map(|frame| frame.url.as_str())
            .chain(frame_urls.get(target).into_iter().flatten().copied())
            .collect();
        let matching: Vec<&custom::Definition> = match top {
            Some(_) => custom
                .iter()
                .filter(|definition| {
                    definition
                        .url_patterns
                        .iter()
                        .any(|pattern| urls.iter().any(|url| custom::matches(pattern, url)))
                })
                .collect(),
            None => Vec::new(),
        };
        if tools.is_empty() && matching.is_empty() {
            continue;
        }
        let window_id = client
            .call("", "Browser.getWindowForTarget", json!({ "targetId": tab }))
            .await
            .ok()
            .and_then(|window| window["windowId"].as_i64())
            .unwrap_or_default();
        if let Some((top_id, top)) = top {
            for definition in matching {
                found.push(Found {
                    tool_ref: ToolRef {
                        target: target.to_owned(),
                        frame: top_id.clone(),
                        loader: top.loader.clone(),
                        name: definition.tool["name"].as_str().unwrap_or_default().to_owned(),
                        custom: Some(definition.id.clone()),
                    }
                    .encode(),
                    tool: definition.tool.clone(),
                    tab_id: numbering.number(browser_ws_url, tab),
                    window_id,
                    page_url: without_fragment(page_url),
                    page_title: tab_info["title"].as_str().unwrap_or_default().to_owned(),
                    frame: None,
                    custom: Some((
                        definition.id.clone(),
                        definition.namespace.clone(),
                        target.to_owned(),
                    )),
                });
            }
        }
        for tool in tools {
            let (Some(frame_id), Some(name)) = (tool["frameId"].as_str(), tool["name"].as_str())
            else {
                continue;
            };
            let Some(frame) = frames.get(frame_id) else {
                continue;
            };
            let embedded = !(frame.top && kind == "page");
            found.push(Found {
                tool_ref: ToolRef {
                    target: target.to_owned(),
                    frame: frame_id.to_owned(),
                    loader: frame.loader.clone(),
                    name: name.to_owned(),
                    custom: None,
                }
                .encode(),
                tool: metadata(&tool),
                tab_id: numbering.number(browser_ws_url, tab),
                window_id,
                page_url: without_fragment(page_url),
                page_title: tab_info["title"].as_str().unwrap_or_default().to_owned(),
                frame: embedded.then(|| {
                    (numbering.number(browser_ws_url, frame_id), without_fragment(&frame.url))
                }),
                custom: None,
            });
        }
    }
    Ok(found)
}

/// Calls the registration `tool_ref` names with `input`, waiting up to `patience` for
/// its answer.
pub async fn invoke(
    browser_ws_url: &str, tool_ref: &str, input: Value, patience: Duration,
    custom_tools: &CustomTools,
) -> Result<Outcome, Status> {
    let reference = ToolRef::decode(tool_ref).ok_or_else(|| {
        Status::invalid_argument("tool_ref is not a tool reference of this browser")
    })?;
    let stale = || {
        Status::not_found(format!(
            "tool_ref is stale: the document that registered `{}` was replaced or closed; list the tools again",
            reference.name
        ))
    };
    let mut client = connect(browser_ws_url).await?;
    let (session, frames, tools) =
        open(&mut client, &reference.target).await.map_err(|_| stale())?;
    if frames.get(&reference.frame).map(|frame| frame.loader.as_str()) != Some(&reference.loader) {
        return Err(stale());
    }
    if let Some(id) = &reference.custom {
        let definition = custom_tools.get(id).ok_or_else(|| {
            Status::not_found(format!("custom tool {id} was removed; list the tools again"))
        })?;
        return invoke_custom(&mut client, &session, &definition, &input, patience).await;
    }
    let tool = tools
        .iter()
        .find(|tool| {
            tool["frameId"] == reference.frame.as_str() && tool["name"] == reference.name.as_str()
        })
        .ok_or_else(|| {
            Status::not_found(format!(
                "the page no longer registers `{}`; list the tools again",
                reference.name
            ))
        })?;
    // A form tool without autosubmit is filled in and then waits for its submission.
    let awaits_submission =
        !tool["backendNodeId"].is_null() && tool["annotations"]["autosubmit"] != json!(true);
    let invoked = client
        .call(
            &session,
            "WebMCP.invokeTool",
            json!({ "frameId": reference.frame, "toolName": reference.name, "input": input }),
        )
        .await
        .map_err(|error| Status::invalid_argument(format!("the tool refused the call: {error}")))?;
    let invocation_id = invoked["invocationId"].as_str().unwrap_or_default().to_owned();
    if awaits_submission {
        return Ok(Outcome {
            invocation_id,
            status: "awaiting_submission",
            error_text: None,
            output: None,
        });
    }
    let unknown = |why: &str| {
        Status::deadline_exceeded(format!(
            "outcome unknown: invocation {invocation_id} of `{}` began, then {why}; check for its effects before calling it again",
            reference.name
        ))
    };
    let answered = tokio::time::timeout(patience, async {
        loop {
            match client.next().await {
                Ok(Incoming::Event(event)) if event.method == "WebMCP.toolResponded" => {
                    if event.params["invocationId"] == invocation_id.as_str() {
                        return Ok(event.params);
                    }
                }
                Ok(Incoming::Event(event))
                    if event.method == "Target.detachedFromTarget"
                        && event.params["sessionId"] == session.as_str() =>
                {
                    return Err("its tab or frame went away");
                }
                Ok(_) => {}
                Err(_) => return Err("Chromium went away"),
            }
        }
    })
    .await;
    let responded = match answered {
        Ok(Ok(responded)) => responded,
        Ok(Err(why)) => return Err(unknown(why)),
        Err(_) => return Err(unknown(&format!("no answer came within {patience:?}"))),
    };
    let status = match responded["status"].as_str() {
        Some("Completed") => "completed",
        Some("Canceled") => "canceled",
        _ => "error",
    };
    Ok(Outcome {
        invocation_id,
        status,
        // A tool that threw leaves the text empty and says it in the exception.
        error_text: responded["errorText"]
            .as_str()
            .filter(|text| !text.is_empty())
            .or_else(|| responded["exception"]["description"].as_str())
            .map(str::to_owned),
        output: responded.get("output").cloned(),
    })
}

/// Runs a custom tool's `execute` with `input` in the tab's page.
async fn invoke_custom(
    client: &mut CdpClient, session: &str, definition: &custom::Definition, input: &Value,
    patience: Duration,
) -> Result<Outcome, Status> {
    let invocation_id = custom::new_id("inv");
    let expression = custom::call_expression(definition, input);
    let timeout_ms = patience.as_millis().min(u128::from(u32::MAX)) as u64;
    let evaluated = tokio::time::timeout(
        patience + Duration::from_secs(1),
        custom::evaluate(client, session, &expression, timeout_ms),
    )
    .await
    .map_err(|_| {
        Status::deadline_exceeded(format!(
            "outcome unknown: invocation {invocation_id} began, then no answer came within {patience:?}"
        ))
    })??;
    let (status, error_text, output) = match evaluated {
        Ok(output) if output.to_string().len() > custom::MAX_OUTPUT_BYTES => (
            "error",
            Some(format!("the output is larger than {} KiB", custom::MAX_OUTPUT_BYTES / 1024)),
            None,
        ),
        Ok(output) => ("completed", None, Some(output)),
        Err(thrown) => ("error", Some(thrown), None),
    };
    Ok(Outcome { invocation_id, status, error_text, output })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ref_round_trips_and_foreign_text_is_refused() {
        let reference = ToolRef {
            target: "T".into(),
            frame: "F".into(),
            loader: "L".into(),
            name: "add".into(),
            custom: None,
        };
        let decoded =
            ToolRef::decode(&reference.encode()).map(|r| (r.target, r.frame, r.loader, r.name));
        assert_eq!(decoded, Some(("T".into(), "F".into(), "L".into(), "add".into())));
        assert!(ToolRef::decode("add").is_none());
        assert!(ToolRef::decode("wmcp_!!!").is_none());
    }

    #[test]
    fn numbers_are_kept_per_chromium_process() {
        let numbering = Numbering::default();
        assert_eq!(numbering.number("ws://a", "tab1"), 1);
        assert_eq!(numbering.number("ws://a", "tab2"), 2);
        assert_eq!(numbering.number("ws://a", "tab1"), 1);
        assert_eq!(numbering.number("ws://b", "tab2"), 1);
    }

    #[test]
    fn devtools_hints_become_mcp_annotations() {
        let tool = json!({ "name": "book", "description": "Book", "annotations": { "readOnly": true, "autosubmit": false } });
        assert_eq!(
            metadata(&tool),
            json!({ "name": "book", "description": "Book", "inputSchema": { "type": "object" },
                    "annotations": { "readOnlyHint": true, "autosubmit": false } })
        );
    }
}
