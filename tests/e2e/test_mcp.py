"""The MCP server at /mcp, driven by the official MCP Python client (`mcp`): an assistant
connects with an API key, lists the tools, and runs a browser through them."""

from __future__ import annotations

import asyncio
import base64
import datetime
import io
import json
import subprocess

import httpx
import pytest
from PIL import Image

from conftest import TEST_PAGE_TITLE
from harness import wait_until
from mcp import MCPError
from mcp_kit import call, mcp_client
from sdk import once, today_only

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


def test_an_assistant_runs_a_browser_through_the_mcp_tools(control_plane, client, test_page_url):
    async def scenario():
        async with mcp_client(control_plane, control_plane.api_key) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert {"manage_browsers", "navigate_page", "read_page", "screenshot", "computer_action",
                    "execute_playwright_code", "exec_command", "execute_repl", "manage_replays",
                    "manage_profiles", "manage_browser_pools", "get_telemetry", "webmcp"} <= names

            # Headful: it has a screen for computer actions.
            result, created = await call(session, "manage_browsers", action="create", headless=False)
            assert not result.is_error, created
            session_id = created["session_id"]
            # The same browser the REST API sees, in the key's organization.
            assert client.browsers.retrieve(session_id).session_id == session_id
            try:
                result, page = await call(session, "navigate_page", session_id=session_id, url=test_page_url)
                assert not result.is_error, page
                assert page["title"] == TEST_PAGE_TITLE and page["status"] == 200

                result, read = await call(session, "read_page", session_id=session_id)
                assert (read["title"], read["text"].strip(), read["truncated"]) == (TEST_PAGE_TITLE, "hello", False)
                result, cut = await call(session, "read_page", session_id=session_id, max_characters=2)
                assert (cut["text"], cut["truncated"]) == ("he", True)

                result, _ = await call(session, "screenshot", session_id=session_id)
                assert not result.is_error, result.content
                [image] = [block for block in result.content if block.type == "image"]
                assert image.mime_type == "image/png"
                png = Image.open(io.BytesIO(base64.b64decode(image.data)))
                assert png.format == "PNG" and png.width > 100 and png.height > 100

                # A click through computer actions reaches the page; the screenshot after it
                # comes back as an image.
                await call(session, "execute_playwright_code", session_id=session_id, code=(
                    "await page.evaluate(() => document.addEventListener('click', "
                    "e => { document.title = 'clicked at ' + e.screenX; }));"))
                result, _ = await call(session, "computer_action", session_id=session_id, actions=[
                    {"type": "click_mouse", "click_mouse": {"x": 400, "y": 500}}, {"type": "screenshot"}])
                assert not result.is_error, result.content
                assert [block.type for block in result.content] == ["text", "image"]
                result, read = await call(session, "read_page", session_id=session_id)
                assert read["title"] == "clicked at 400"

                # Playwright code runs in the same tab; what it returns comes back.
                result, ran = await call(session, "execute_playwright_code", session_id=session_id,
                                         code="return await page.locator('h1').innerText();")
                assert not result.is_error and ran["success"] and ran["result"] == "hello"

                result, executed = await call(session, "exec_command", session_id=session_id,
                                              command="sh", args=["-c", "echo out; echo err >&2; exit 3"])
                assert (executed["exit_code"], executed["stdout"], executed["stderr"]) == (3, "out\n", "err\n")

                # A failing call is a tool error the model can read, not a protocol error.
                result, _ = await call(session, "manage_browsers", action="get", session_id="no-such-browser")
                assert result.is_error and "404" in result.content[0].text
            finally:
                result, _ = await call(session, "manage_browsers", action="delete", session_id=session_id)
            assert not result.is_error
            assert session_id not in {b.session_id for b in client.browsers.list()}

    asyncio.run(scenario())


def test_a_wrong_key_is_refused_and_another_organizations_browser_is_invisible(control_plane, client):
    async def refused(api_key):
        with pytest.raises(Exception) as raised:
            async with mcp_client(control_plane, api_key) as session:
                await session.list_tools()
        return raised.value

    for key in ("not-a-key", None):
        asyncio.run(refused(key))
        # What the client was told: 401 in the API's Error shape.
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        answer = httpx.post(f"{control_plane.base_url}/mcp", headers=headers, timeout=30, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        assert answer.status_code == 401 and answer.json()["code"] == "unauthorized", answer.text

    theirs = client.browsers.create(headless=True)
    other_key = control_plane.create_api_key("org-mcp-b")

    async def scenario():
        async with mcp_client(control_plane, other_key) as session:
            result, listed = await call(session, "manage_browsers", action="list")
            assert not result.is_error and theirs.session_id not in json.dumps(listed)
            for tool, arguments in (("manage_browsers", {"action": "get"}),
                                    ("read_page", {}),
                                    ("screenshot", {}),
                                    ("manage_browsers", {"action": "delete"})):
                result, _ = await call(session, tool, session_id=theirs.session_id, **arguments)
                assert result.is_error and "404" in result.content[0].text, (tool, result.content)

    async def owner_screenshot():
        async with mcp_client(control_plane, control_plane.api_key) as session:
            # Headless: no screen, so the page itself is captured.
            result, _ = await call(session, "screenshot", session_id=theirs.session_id)
            assert not result.is_error, result.content
            [image] = result.content
            assert Image.open(io.BytesIO(base64.b64decode(image.data))).format == "PNG"

    try:
        asyncio.run(scenario())
        # Still there: B's delete did not reach it.
        assert client.browsers.retrieve(theirs.session_id).session_id == theirs.session_id
        asyncio.run(owner_screenshot())
    finally:
        client.browsers.delete_by_id(theirs.session_id)


def test_browsers_screens_and_replays_are_readable_resources(control_plane, client, test_page_url, tmp_path):
    session = client.browsers.create(headless=False)
    sid = session.session_id
    prefix = f"kernel://browsers/{sid}"
    other_key = control_plane.create_api_key("org-mcp-resources-b")

    async def scenario():
        async with mcp_client(control_plane, control_plane.api_key) as mcp:
            templates = {t.uri_template for t in (await mcp.list_resource_templates()).resource_templates}
            assert templates == {"kernel://browsers/{session_id}", "kernel://browsers/{session_id}/screenshot",
                                 "kernel://browsers/{session_id}/replays",
                                 "kernel://browsers/{session_id}/replays/{replay_id}"}
            listed = {str(r.uri): r for r in (await mcp.list_resources()).resources}
            assert {"kernel://browsers", prefix, f"{prefix}/screenshot", f"{prefix}/replays"} <= set(listed)
            assert listed[f"{prefix}/screenshot"].mime_type == "image/png"

            [browsers] = (await mcp.read_resource("kernel://browsers")).contents
            assert sid in {b["session_id"] for b in json.loads(browsers.text)}

            # A replay recorded through the tools, then read back as a video resource.
            result, started = await call(mcp, "manage_replays", action="start", session_id=sid)
            assert not result.is_error, started
            await call(mcp, "navigate_page", session_id=sid, url=test_page_url)
            await asyncio.sleep(2)
            result, _ = await call(mcp, "manage_replays", action="stop", session_id=sid,
                                   replay_id=started["replay_id"])
            assert not result.is_error, result.content

            async def finished():
                for _ in range(120):
                    [replays] = (await mcp.read_resource(f"{prefix}/replays")).contents
                    mine = [r for r in json.loads(replays.text) if r["replay_id"] == started["replay_id"]]
                    if mine and mine[0].get("finished_at"):
                        return
                    await asyncio.sleep(0.25)
                raise AssertionError(f"the replay did not finish: {replays.text}")

            await finished()
            [video] = (await mcp.read_resource(f"{prefix}/replays/{started['replay_id']}")).contents
            assert video.mime_type == "video/mp4"
            path = tmp_path / "replay.mp4"
            path.write_bytes(base64.b64decode(video.blob))
            probed = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0",
                                     str(path)], capture_output=True, text=True, check=True)
            assert float(probed.stdout) >= 1.5, probed

            # The screen as the page now shows it (the test page is white around "hello").
            [shot] = (await mcp.read_resource(f"{prefix}/screenshot")).contents
            assert shot.mime_type == "image/png"
            png = Image.open(io.BytesIO(base64.b64decode(shot.blob)))
            assert png.format == "PNG" and png.width > 100 and png.height > 100

            [one] = (await mcp.read_resource(prefix)).contents
            assert json.loads(one.text)["session_id"] == sid
            for wrong in ("kernel://browsers/no-such-browser", "kernel://browsers/x/fs", "file:///etc/passwd",
                          f"{prefix}/replays/no-such-replay"):
                with pytest.raises(MCPError):
                    await mcp.read_resource(wrong)

        # Another organization can neither see nor read any of it.
        async with mcp_client(control_plane, other_key) as theirs:
            assert not any(sid in str(r.uri) for r in (await theirs.list_resources()).resources)
            for uri in (prefix, f"{prefix}/screenshot", f"{prefix}/replays",
                        f"{prefix}/replays/{started['replay_id']}"):
                with pytest.raises(MCPError) as raised:
                    await theirs.read_resource(uri)
                assert "404" in str(raised.value), raised.value

    try:
        asyncio.run(scenario())
    finally:
        client.browsers.delete_by_id(sid)


@today_only
def test_mcp_calls_are_authorized_and_audited_like_rest_calls(control_plane, client):
    since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=1)

    async def create_and_delete():
        async with mcp_client(control_plane, control_plane.api_key) as session:
            result, created = await call(session, "manage_browsers", action="create", headless=True)
            assert not result.is_error, created
            result, _ = await call(session, "manage_browsers", action="delete", session_id=created["session_id"])
            assert not result.is_error
            return created["session_id"]

    session_id = asyncio.run(create_and_delete())
    end = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=1)
    assert wait_until(lambda: {("POST", "/browsers"), ("DELETE", f"/browsers/{session_id}")} <= {
        (entry.method, entry.path) for entry in client.audit_logs.list(start=since, end=end)}, 10)

    # A key whose policy only reads browsers lists them through MCP but cannot create one.
    scoped = client.api_keys.create(
        name="mcp read only", policy={"statements": [{"action": "browsers:read", "resource": "*"}]})

    async def read_only():
        async with mcp_client(control_plane, scoped.key) as session:
            result, _ = await call(session, "manage_browsers", action="list")
            assert not result.is_error
            result, _ = await call(session, "manage_browsers", action="create", headless=True)
            assert result.is_error and "403" in result.content[0].text

    asyncio.run(read_only())
