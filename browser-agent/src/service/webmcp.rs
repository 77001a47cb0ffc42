//! The WebMCP calls (`crate::webmcp`) on the wire.

use std::time::Duration;

use browser_agent_proto::v1::{WebmcpInvocation, WebmcpResult, WebmcpTool, WebmcpTools};
use tonic::Status;

use super::AgentService;

/// The longest a call may wait for its tool's answer.
const MAX_TIMEOUT_SEC: u32 = 3600;
/// When the caller gives none.
const DEFAULT_TIMEOUT_SEC: u32 = 60;

impl AgentService {
    pub(super) async fn webmcp_tools(&self) -> Result<WebmcpTools, Status> {
        let browser_ws_url = self.browser.borrow().browser_ws_url.clone();
        let found = crate::webmcp::list(&browser_ws_url, &self.webmcp_numbering).await?;
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
            })
            .collect();
        Ok(WebmcpTools { tools })
    }

    pub(super) async fn webmcp_invoke(
        &self,
        request: WebmcpInvocation,
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
        )
        .await?;
        Ok(WebmcpResult {
            invocation_id: outcome.invocation_id,
            status: outcome.status.to_owned(),
            error_text: outcome.error_text,
            output_json: outcome.output.map(|output| output.to_string()),
        })
    }
}
