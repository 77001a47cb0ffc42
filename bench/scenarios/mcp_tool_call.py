"""`execute_playwright_code` through the MCP server (`tools/call` on `/mcp`) next to the
same `POST /browsers/{id}/playwright/execute` through REST, alternately in the same run,
each from the standard library's client on a kept-alive connection so the figures are
the server's. Then the same tool call through the official MCP Python client (`mcp`),
for what an assistant's client adds. Goal: MCP at most 1.2x REST."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from harness import ControlPlane
from scenarios import alternate, api_client, kept_alive

RUNS = 100
WARMUP = 10
TITLE = "bench page"
CODE = "return await page.title()"
# The stateless protocol version: no session, each request says who it is.
PROTOCOL = "2026-07-28"


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        http = api_client(server)
        sid = http.post("/browsers", json={"headless": True}).raise_for_status().json()["session_id"]
        connection, headers = kept_alive(server)
        # The headers the protocol asks of a stateless request (the method and the tool
        # named outside the body, for gateways).
        mcp_headers = {**headers, "Accept": "application/json, text/event-stream",
                       "MCP-Protocol-Version": PROTOCOL, "Mcp-Method": "tools/call",
                       "Mcp-Name": "execute_playwright_code"}

        def rest(code: str) -> float:
            started = time.perf_counter()
            connection.request("POST", f"/browsers/{sid}/playwright/execute", json.dumps({"code": code}), headers)
            response = connection.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200 and answer["success"], answer
            return time.perf_counter() - started

        calls = iter(range(1, 1_000_000))

        def mcp(code: str) -> float:
            body = {"jsonrpc": "2.0", "id": next(calls), "method": "tools/call", "params": {
                "name": "execute_playwright_code", "arguments": {"session_id": sid, "code": code},
                "_meta": {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
                          "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                          "io.modelcontextprotocol/clientCapabilities": {}}}}
            started = time.perf_counter()
            connection.request("POST", "/mcp", json.dumps(body), mcp_headers)
            response = connection.getresponse()
            data = response.read()
            elapsed = time.perf_counter() - started
            assert response.status == 200, (response.status, data)
            result = json.loads(data)["result"]
            assert not result.get("isError"), result
            assert json.loads(result["content"][0]["text"])["result"] in (TITLE, None), result
            return elapsed

        rest(f"await page.setContent('<title>{TITLE}</title>')")
        ours, references = alternate(lambda: mcp(CODE), lambda: rest(CODE), RUNS, WARMUP)
        connection.close()
        report("mcp_tool_call: execute_playwright_code through /mcp", ours,
               {"the same through REST": references}, percentiles=(50, 99))

        official = asyncio.run(_official_client(server, sid))
        ordered = sorted(official)
        print(f"through the official MCP Python client (one connection, {len(ordered)} calls): "
              f"median {ordered[len(ordered) // 2] * 1000:.2f} ms")
        http.delete(f"/browsers/{sid}").raise_for_status()
    finally:
        server.reap_everything()


async def _official_client(server: ControlPlane, sid: str) -> list[float]:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {server.api_key}"})
    samples = []
    async with Client(streamable_http_client(f"{server.base_url}/mcp", http_client=http)) as session:
        for index in range(WARMUP + RUNS // 2):
            started = time.perf_counter()
            result = await session.call_tool("execute_playwright_code", {"session_id": sid, "code": CODE})
            elapsed = time.perf_counter() - started
            assert not result.is_error, result
            if index >= WARMUP:
                samples.append(elapsed)
    return samples
