//! WebMCP: the tools a browser's pages register (imperative and declarative form tools),
//! listed across every tab and frame and called by their `tool_ref` (the SDK's
//! `browsers.webmcp.list_tools` and `invoke_tool`). The agent finds and calls them
//! through Chromium's DevTools (see the agent's `webmcp`); everything a page provides
//! (names, schemas, annotations, output) is untrusted and passed on as it is.

use axum::Json;
use browser_agent_proto::v1::WebmcpInvocation;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, PathParam, QueryParams};
use super::org::Org;

/// Largest `input`, serialized.
const MAX_INPUT_BYTES: usize = 1024 * 1024;
const DEFAULT_TIMEOUT_SEC: i64 = 60;
const MAX_TIMEOUT_SEC: i64 = 3600;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ToolsQuery {
    /// Leave out custom tools (this server has none: page tools only).
    pub exclude_custom: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ToolFrame {
    /// A number for the embedded frame, stable while the browser's Chromium runs.
    pub frame_id: i64,
    /// Without the fragment.
    pub url: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ToolSource {
    /// The embedded frame that registered the tool; null for the top-level page.
    pub frame: Option<ToolFrame>,
    pub page_title: String,
    /// Without the fragment.
    pub page_url: String,
    pub tab_id: i64,
    pub window_id: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebmcpTool {
    pub source: ToolSource,
    /// MCP's tool shape (`name`, `description`, `inputSchema`, `annotations`), as the
    /// page registered it: untrusted.
    #[schema(value_type = Object)]
    pub tool: Value,
    /// Names this live registration; stale once its document navigates or closes.
    pub tool_ref: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ToolsResponse {
    pub tools: Vec<WebmcpTool>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InvokeBody {
    /// From `GET /browsers/{id}/webmcp/tools`.
    pub tool_ref: String,
    /// The tool's input, matching its `inputSchema`; at most 1 MiB as JSON.
    #[schema(value_type = Object)]
    pub input: Value,
    /// Seconds to wait for the tool's answer: 1 to 3600, default 60.
    #[schema(minimum = 1, maximum = 3600)]
    pub timeout_sec: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct InvocationResult {
    pub invocation_id: String,
    /// `completed`, `canceled`, `error`, or `awaiting_submission`: a declarative form
    /// without autosubmit was filled in; submit it yourself (Playwright, computer
    /// controls) after checking it, without invoking again.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_text: Option<String>,
    /// What the tool answered: untrusted page output.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
}

/// List the WebMCP tools registered by the pages of every tab and embedded frame.
#[utoipa::path(get, path = "/browsers/{id}/webmcp/tools", tag = "webmcp", params(
        ("id" = String, Path, description = "Browser session id or name"), ToolsQuery),
    security(("bearer" = [])),
    responses((status = 200, body = ToolsResponse), (status = 404, body = ErrorBody)))]
pub async fn list_tools(
    org: Org,
    PathParam(id): PathParam<String>,
    QueryParams(_query): QueryParams<ToolsQuery>,
) -> Result<Json<ToolsResponse>, ApiError> {
    let session = org.sessions.live(&org.id, &id).await?;
    let agent = org.sessions.agent(&session)?;
    let listed = agent.webmcp_tools().await?;
    let tools = listed
        .tools
        .into_iter()
        .map(|found| WebmcpTool {
            source: ToolSource {
                frame: found.frame_id.map(|frame_id| ToolFrame {
                    frame_id,
                    url: found.frame_url.clone().unwrap_or_default(),
                }),
                page_title: found.page_title,
                page_url: found.page_url,
                tab_id: found.tab_id,
                window_id: found.window_id,
            },
            tool: serde_json::from_str(&found.tool_json).unwrap_or(Value::Null),
            tool_ref: found.tool_ref,
        })
        .collect();
    Ok(Json(ToolsResponse { tools }))
}

/// Invoke exactly the live registration `tool_ref` names and answer its result. A form
/// tool without autosubmit answers `awaiting_submission` once filled in; a stale ref is
/// a 404; no answer within `timeout_sec` is a 504 (the outcome is then unknown: the tool
/// is never retried).
#[utoipa::path(post, path = "/browsers/{id}/webmcp/invoke", tag = "webmcp", request_body = InvokeBody,
    params(("id" = String, Path, description = "Browser session id or name")), security(("bearer" = [])),
    responses((status = 200, body = InvocationResult), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn invoke_tool(
    org: Org,
    PathParam(id): PathParam<String>,
    JsonBody(body): JsonBody<InvokeBody>,
) -> Result<Json<InvocationResult>, ApiError> {
    let mut problems = Vec::new();
    if body.tool_ref.is_empty() {
        problems.push("tool_ref must not be empty".to_owned());
    }
    let input = body.input.to_string();
    if !body.input.is_object() {
        problems.push("input must be a JSON object".to_owned());
    } else if input.len() > MAX_INPUT_BYTES {
        problems.push(format!(
            "input must be at most {MAX_INPUT_BYTES} bytes as JSON"
        ));
    }
    let timeout_sec = body.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC);
    if !(1..=MAX_TIMEOUT_SEC).contains(&timeout_sec) {
        problems.push(format!(
            "timeout_sec must be between 1 and {MAX_TIMEOUT_SEC}"
        ));
    }
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let session = org.sessions.live(&org.id, &id).await?;
    let agent = org.sessions.agent(&session)?;
    let result = agent
        .invoke_webmcp_tool(WebmcpInvocation {
            tool_ref: body.tool_ref,
            input_json: input,
            timeout_sec: timeout_sec as u32,
        })
        .await?;
    Ok(Json(InvocationResult {
        invocation_id: result.invocation_id,
        status: result.status,
        error_text: result.error_text,
        output: result
            .output_json
            .and_then(|output| serde_json::from_str(&output).ok()),
    }))
}
