"""The official MCP Python client (`mcp`) pointed at a control plane's `/mcp`."""

from __future__ import annotations

import json

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def mcp_client(control_plane, api_key: str | None) -> Client:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    http = create_mcp_http_client(headers=headers)
    return Client(streamable_http_client(f"{control_plane.base_url}/mcp", http_client=http))


async def call(session: Client, tool: str, **arguments):
    """A tool's result; its first text content parsed as JSON when it is JSON."""
    result = await session.call_tool(tool, arguments)
    texts = [block.text for block in result.content if block.type == "text"]
    value = texts[0] if texts else None
    try:
        value = json.loads(value) if value is not None else None
    except json.JSONDecodeError:
        pass
    return result, value
