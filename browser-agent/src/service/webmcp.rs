//! The WebMCP calls (`crate::webmcp`) on the wire.

use std::time::Duration;

use browser_agent_proto::v1::{
    AddCustomToolsRequest, CustomTool, CustomTools, WebmcpInvocation, WebmcpResult, WebmcpTool,
    WebmcpTools, WebmcpToolsRequest,
};
use tonic::Status;

use super::AgentService;

/// The longest a call may wait for its tool's answer.
const MAX_TIMEOUT_SEC: u32 = 3600;
/// When the caller gives none.
const DEFAULT_TIMEOUT_SEC: u32 = 60;

impl AgentService {
    pub(super) async fn webmcp_tools(
        &self, request: WebmcpToolsRequest,
    ) -> Result<WebmcpTools, Status> {
        let browser_ws_url = self.browser.borrow().browser_ws_url.clone();
        let custom = if request.exclude_custom { Vec::new() } else { self.webmcp_custom.all() };
        let found = crate::webmcp::list(&browser_ws_url, &self.webmcp_numbering, &custom).await?;
        let tools = found
            .into_iter()
            .map(|found| WebmcpTool {
                tool_ref: found.tool_ref,
                tool_json: found.tool.to_string(),
                tab_id: found.tab_id,
                window_id: found.window_id,
                page_url: found.page_url,
                page_title: found.page_title,
                frame_id: found.frame.as_ref().map(|(id, _)| *id),
                frame_url: found.frame.map(|(_, url)| url),
                custom_id: found.custom.as_ref().map(|(id, _, _)| id.clone()),
                custom_namespace: found.custom.as_ref().map(|(_, namespace, _)| namespace.clone()),
                target_id: found.custom.map(|(_, _, target)| target),
            })
            .collect();
        Ok(WebmcpTools { tools })
    }

    pub(super) async fn webmcp_invoke(
        &self, request: WebmcpInvocation,
    ) -> Result<WebmcpResult, Status> {
        let input: serde_json::Value = serde_json::from_str(&request.input_json)
            .map_err(|error| Status::invalid_argument(format!("input is not JSON: {error}")))?;
        if !input.is_object() {
            return Err(Status::invalid_argument("input must be a JSON object"));
        }
        let timeout = match request.timeout_sec {
            0 => DEFAULT_TIMEOUT_SEC,
            seconds => seconds.min(MAX_TIMEOUT_SEC),
        };
        let browser_ws_url = self.browser.borrow().browser_ws_url.clone();
        let outcome = crate::webmcp::invoke(
            &browser_ws_url,
            &request.tool_ref,
            input,
            Duration::from_secs(timeout.into()),
            &self.webmcp_custom,
        )
        .await?;
        Ok(WebmcpResult {
            invocation_id: outcome.invocation_id,
            status: outcome.status.to_owned(),
            error_text: outcome.error_text,
            output_json: outcome.output.map(|output| output.to_string()),
        })
    }

    pub(super) async fn webmcp_add_custom(
        &self, request: AddCustomToolsRequest,
    ) -> Result<CustomTools, Status> {
        if request.namespace.is_empty() || request.namespace.len() > 128 {
            return Err(Status::invalid_argument("namespace must be 1 to 128 characters"));
        }
        if request.source.len() > crate::webmcp::custom::MAX_SOURCE_BYTES {
            return Err(Status::invalid_argument(format!(
                "source must be at most {} bytes",
                crate::webmcp::custom::MAX_SOURCE_BYTES
            )));
        }
        let browser_ws_url = self.browser.borrow().browser_ws_url.clone();
        if browser_ws_url.is_empty() {
            return Err(Status::unavailable("Chromium is not running"));
        }
        let added = self
            .webmcp_custom
            .add(
                &browser_ws_url,
                &request.namespace,
                &request.source,
                request.force_overwrite_namespace,
            )
            .await?;
        Ok(custom_tools(added))
    }

    pub(super) fn webmcp_custom_tools(&self) -> CustomTools {
        custom_tools(self.webmcp_custom.all())
    }

    pub(super) fn webmcp_remove_custom(&self, id: &str) -> Result<(), Status> {
        self.webmcp_custom.remove(id)
    }
}

fn custom_tools(definitions: Vec<crate::webmcp::custom::Definition>) -> CustomTools {
    CustomTools {
        tools: definitions
            .into_iter()
            .map(|definition| CustomTool {
                id: definition.id,
                kind: definition.kind,
                url_patterns: definition.url_patterns,
                namespace: definition.namespace,
                tool_json: definition.tool.to_string(),
            })
            .collect(),
    }
}
