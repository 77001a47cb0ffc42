//! WebMCP: the tools a browser's pages register (imperative and declarative form tools)
//! and the custom tools callers define for it, listed across every tab and frame and
//! called by their `tool_ref` (the SDK's `browsers.webmcp.list_tools`, `invoke_tool` and
//! `custom_tools`). The agent finds and calls them
//! through Chromium's DevTools (see the agent's `webmcp`); everything a page provides
//! (names, schemas, annotations, output) is untrusted and passed on as it is.

use axum::Json;
use axum::http::StatusCode;
use browser_agent_proto::v1::{AddCustomToolsRequest, WebmcpInvocation};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;

/// Largest `input`, serialized.
const MAX_INPUT_BYTES: usize = 1024 * 1024;
const DEFAULT_TIMEOUT_SEC: i64 = 60;
const MAX_TIMEOUT_SEC: i64 = 3600;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ToolsQuery {
    /// Leave out custom tools: page-provided tools only.
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
pub struct CustomToolSource {
    pub id: String,
    pub namespace: String,
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
    /// For a custom tool: which one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomToolSource>,
    /// For a custom tool: the DevTools target id of the tab it runs in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_id: Option<String>,
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
#[utoipa::path(get, path = "/browsers/{id}/webmcp/tools", params(ToolsQuery),
    responses((status = 200, body = ToolsResponse)))]
pub async fn list_tools(
    org: Org, PathParam(id): PathParam<String>, QueryParams(query): QueryParams<ToolsQuery>,
) -> Result<Json<ToolsResponse>, ApiError> {
    let agent = org.agent(&id).await?;
    let listed = agent.webmcp_tools(query.exclude_custom.unwrap_or(false)).await?;
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
                custom: found
                    .custom_id
                    .zip(found.custom_namespace)
                    .map(|(id, namespace)| CustomToolSource { id, namespace }),
                target_id: found.target_id,
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
#[utoipa::path(post, path = "/browsers/{id}/webmcp/invoke", request_body = InvokeBody,
    responses((status = 200, body = InvocationResult), (status = 504, body = ErrorBody)))]
pub async fn invoke_tool(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<InvokeBody>,
) -> Result<Json<InvocationResult>, ApiError> {
    let mut problems = Vec::new();
    if body.tool_ref.is_empty() {
        problems.push("tool_ref must not be empty".to_owned());
    }
    let input = body.input.to_string();
    if !body.input.is_object() {
        problems.push("input must be a JSON object".to_owned());
    } else if input.len() > MAX_INPUT_BYTES {
        problems.push(format!("input must be at most {MAX_INPUT_BYTES} bytes as JSON"));
    }
    let timeout_sec = body.timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC);
    if !(1..=MAX_TIMEOUT_SEC).contains(&timeout_sec) {
        problems.push(format!("timeout_sec must be between 1 and {MAX_TIMEOUT_SEC}"));
    }
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let agent = org.agent(&id).await?;
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
        output: result.output_json.and_then(|output| serde_json::from_str(&output).ok()),
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddCustomToolsBody {
    /// Groups the batch: 1 to 128 characters.
    pub namespace: String,
    /// A JavaScript expression evaluating to a non-empty array of definitions `{kind:
    /// "page", match: {url_patterns: ["https://example.com/*"]}, tool: {name,
    /// description, inputSchema, outputSchema?, annotations?}, execute(input) {…}}`; at
    /// most 8,000,000 bytes as UTF-8.
    pub source: String,
    /// Replace every tool of the namespace with this batch, at once.
    pub force_overwrite_namespace: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CustomToolMatch {
    /// `*` stands for any run of characters; matched against the page's and its frames'
    /// URLs without fragment.
    pub url_patterns: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CustomToolDefinition {
    pub id: String,
    /// `page`: its `execute` runs in the tab's top-level page.
    pub kind: String,
    #[serde(rename = "match")]
    pub matcher: CustomToolMatch,
    pub namespace: String,
    #[schema(value_type = Object)]
    pub tool: Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CustomToolsResponse {
    pub tools: Vec<CustomToolDefinition>,
}

fn definitions(tools: browser_agent_proto::v1::CustomTools) -> CustomToolsResponse {
    CustomToolsResponse {
        tools: tools
            .tools
            .into_iter()
            .map(|tool| CustomToolDefinition {
                id: tool.id,
                kind: tool.kind,
                matcher: CustomToolMatch { url_patterns: tool.url_patterns },
                namespace: tool.namespace,
                tool: serde_json::from_str(&tool.tool_json).unwrap_or(Value::Null),
            })
            .collect(),
    }
}

/// Add a namespaced batch of custom tools, listed (with `list_tools`) on every tab whose
/// page or frames match their URL patterns and run in that tab's page. The batch is
/// added at once or not at all; a name already in the namespace is a 409 unless
/// `force_overwrite_namespace` replaces the namespace.
#[utoipa::path(post, path = "/browsers/{id}/webmcp/custom-tools", request_body = AddCustomToolsBody,
    responses((status = 200, body = CustomToolsResponse), (status = 409, body = ErrorBody)))]
pub async fn add_custom_tools(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<AddCustomToolsBody>,
) -> Result<Json<CustomToolsResponse>, ApiError> {
    let mut problems = Vec::new();
    if body.namespace.is_empty() || body.namespace.chars().count() > 128 {
        problems.push("namespace must be 1 to 128 characters".to_owned());
    }
    if body.source.trim().is_empty() {
        problems.push("source must not be empty".to_owned());
    } else if body.source.len() > 8_000_000 {
        problems.push("source must be at most 8000000 bytes as UTF-8".to_owned());
    }
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let agent = org.agent(&id).await?;
    let added = agent
        .add_webmcp_custom_tools(AddCustomToolsRequest {
            namespace: body.namespace,
            source: body.source,
            force_overwrite_namespace: body.force_overwrite_namespace.unwrap_or(false),
        })
        .await?;
    Ok(Json(definitions(added)))
}

/// List the browser's custom tools.
#[utoipa::path(get, path = "/browsers/{id}/webmcp/custom-tools",
    responses((status = 200, body = CustomToolsResponse)))]
pub async fn list_custom_tools(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<CustomToolsResponse>, ApiError> {
    let agent = org.agent(&id).await?;
    Ok(Json(definitions(agent.webmcp_custom_tools().await?)))
}

/// Remove a custom tool; invocations already running go on.
#[utoipa::path(delete, path = "/browsers/{id}/webmcp/custom-tools/{tool_id}",
    responses((status = 204)))]
pub async fn remove_custom_tool(
    org: Org, PathParam((id, tool_id)): PathParam<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let agent = org.agent(&id).await?;
    agent.remove_webmcp_custom_tool(tool_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
