//! The agent's WebMCP calls: the tools of the browser's pages, and the custom tools
//! callers define for it.

use std::time::Duration;

use browser_agent_proto::v1::{
    AddCustomToolsRequest, CustomToolRef, CustomTools, Empty, WebmcpInvocation, WebmcpResult,
    WebmcpTools, WebmcpToolsRequest,
};

use super::{AgentClient, AgentError};

impl AgentClient {
    /// The WebMCP tools of the browser's tabs and frames.
    pub async fn webmcp_tools(&self, exclude_custom: bool) -> Result<WebmcpTools, AgentError> {
        let request = Self::input_request(WebmcpToolsRequest { exclude_custom }, Duration::ZERO);
        Ok(self.inner.clone().list_webmcp_tools(request).await?.into_inner())
    }

    /// Adds a batch of custom WebMCP tools (the agent evaluates their source).
    pub async fn add_webmcp_custom_tools(
        &self, request: AddCustomToolsRequest,
    ) -> Result<CustomTools, AgentError> {
        let request = Self::input_request(request, Duration::from_secs(10));
        Ok(self.inner.clone().add_webmcp_custom_tools(request).await?.into_inner())
    }

    pub async fn webmcp_custom_tools(&self) -> Result<CustomTools, AgentError> {
        let request = Self::input_request(Empty {}, Duration::ZERO);
        Ok(self.inner.clone().list_webmcp_custom_tools(request).await?.into_inner())
    }

    pub async fn remove_webmcp_custom_tool(&self, id: String) -> Result<(), AgentError> {
        let request = Self::input_request(CustomToolRef { id }, Duration::ZERO);
        self.inner.clone().remove_webmcp_custom_tool(request).await?;
        Ok(())
    }

    /// Calls a WebMCP tool; the agent waits up to the call's `timeout_sec` for its answer.
    pub async fn invoke_webmcp_tool(
        &self, invocation: WebmcpInvocation,
    ) -> Result<WebmcpResult, AgentError> {
        let expected = Duration::from_secs(invocation.timeout_sec.into());
        let request = Self::input_request(invocation, expected);
        Ok(self.inner.clone().invoke_webmcp_tool(request).await?.into_inner())
    }
}
