"""WebMCP with today's SDK (`browsers.webmcp.list_tools` and `invoke_tool`): tools that
pages register (an imperative `document.modelContext.registerTool` tool, a declarative
`<form toolname>` tool, and one in a cross-site frame) are listed with refs from the right
tab and frame, called through those refs, and refused once their document is gone."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from kernel import BadRequestError, ConflictError, Kernel, NotFoundError
from playwright.sync_api import sync_playwright

from harness import first_tab, serve_html, wait_until
from mcp_kit import call, mcp_client
from sdk import today_only

pytestmark = today_only

FRAME_PORT_MARK = "FRAME_PORT"

TOOLS_PAGE = """<!doctype html><title>tools</title>
<form toolname="book_table" tooldescription="Book a table">
  <input name="guests" type="number" toolparamdescription="How many people" required>
  <input name="day" type="text" toolparamdescription="Which day">
  <button type="submit">Book</button>
</form>
<form toolname="search" tooldescription="Search the menu" toolautosubmit id="search">
  <input name="q" type="text" toolparamdescription="What to look for">
</form>
<iframe src="http://localhost:FRAME_PORT/frame.html" allow="tools"></iframe>
<script>
document.modelContext.registerTool({
  name: "add", description: "Adds two numbers",
  inputSchema: {type: "object", properties: {a: {type: "number"}, b: {type: "number"}}, required: ["a", "b"]},
  annotations: {readOnlyHint: true},
  execute: async ({a, b}) => ({content: [{type: "text", text: String(a + b)}]}),
});
document.modelContext.registerTool({
  name: "fail", description: "Always throws", inputSchema: {type: "object", properties: {}},
  execute: async () => { throw new Error("no luck"); },
});
document.querySelector("form").addEventListener("submit", (e) => { e.preventDefault(); document.title = "submitted"; });
// An autosubmitted form answers the agent through the submit event (`respondWith`).
document.getElementById("search").addEventListener("submit", (e) => {
  e.preventDefault();
  e.respondWith(Promise.resolve("found " + new FormData(e.target).get("q")));
});
</script>"""

FRAME_PAGE = """<!doctype html><title>frame</title><script>
document.modelContext.registerTool({
  name: "echo", description: "Echoes its text",
  inputSchema: {type: "object", properties: {text: {type: "string"}}},
  execute: async ({text}) => "echo:" + text,
});
</script>"""

OTHER_PAGE = """<!doctype html><title>other</title><script>
document.modelContext.registerTool({name: "other_tool", description: "Another tab's tool",
  inputSchema: {type: "object", properties: {}}, execute: async () => "other"});
</script>"""


@pytest.fixture(scope="module")
def pages():
    """The tools page on 127.0.0.1 embeds a frame from localhost: another site, so
    Chromium runs it out of process (`allow="tools"` lets it register tools)."""
    server = serve_html(lambda path: FRAME_PAGE.encode() if path.startswith("/frame")
                        else OTHER_PAGE.encode() if path.startswith("/other")
                        else TOOLS_PAGE.replace(FRAME_PORT_MARK, str(server.server_address[1])).encode())
    port = server.server_address[1]
    yield f"http://127.0.0.1:{port}/tools.html", f"http://127.0.0.1:{port}/other.html"
    server.shutdown()


def by_name(tools) -> dict:
    return {tool.tool.name: tool for tool in tools}


def test_page_tools_are_listed_per_tab_and_frame_and_called_by_ref(client, control_plane, pages):
    tools_url, other_url = pages
    browser = client.browsers.create(headless=True)
    try:
        with sync_playwright() as playwright:
            cdp = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
            page = first_tab(cdp)
            page.goto(tools_url)
            assert wait_until(lambda: {"add", "fail", "book_table", "search", "echo"} <= set(
                by_name(client.browsers.webmcp.list_tools(browser.session_id).tools)), 15), \
                [(t.tool.name, t.source.frame) for t in client.browsers.webmcp.list_tools(browser.session_id).tools]
            tools = by_name(client.browsers.webmcp.list_tools(browser.session_id).tools)

            add, form, echo = tools["add"], tools["book_table"], tools["echo"]
            assert add.source.frame is None and add.source.page_url == tools_url
            assert add.source.page_title == "tools" and add.tool.description == "Adds two numbers"
            assert add.tool.input_schema["required"] == ["a", "b"]
            assert add.tool.annotations.read_only_hint is True
            assert form.source.frame is None and set(form.tool.input_schema["properties"]) == {"guests", "day"}
            # The cross-site frame's tool: same tab, its own frame.
            assert echo.source.frame is not None and echo.source.frame.url.endswith("/frame.html")
            assert echo.source.tab_id == add.source.tab_id and echo.source.page_url == tools_url
            assert len({tool.tool_ref for tool in tools.values()}) == len(tools)

            added = client.browsers.webmcp.invoke_tool(browser.session_id, tool_ref=add.tool_ref, input={"a": 2, "b": 40})
            assert added.status == "completed" and added.invocation_id
            assert added.output == {"content": [{"type": "text", "text": "42"}]}
            echoed = client.browsers.webmcp.invoke_tool(browser.session_id, tool_ref=echo.tool_ref, input={"text": "hi"})
            assert (echoed.status, echoed.output) == ("completed", "echo:hi")
            failed = client.browsers.webmcp.invoke_tool(
                browser.session_id, tool_ref=tools["fail"].tool_ref, input={})
            assert failed.status == "error" and "no luck" in (failed.error_text or "")

            # The form is filled in and left for its submission.
            booked = client.browsers.webmcp.invoke_tool(browser.session_id, tool_ref=form.tool_ref,
                                                        input={"guests": 4, "day": "friday"})
            assert booked.status == "awaiting_submission"
            assert wait_until(lambda: page.evaluate(
                "[...document.querySelectorAll('form[toolname=book_table] input')].map(i => i.value)") == ["4", "friday"], 5)
            assert page.title() == "tools"
            # A form with toolautosubmit is submitted, and its page's answer comes back.
            searched = client.browsers.webmcp.invoke_tool(
                browser.session_id, tool_ref=tools["search"].tool_ref, input={"q": "soup"})
            assert (searched.status, searched.output) == ("completed", "found soup")
            assert tools["search"].tool.annotations.autosubmit is True

            # A second tab's tools come with another tab id.
            other = cdp.contexts[0].new_page()
            other.goto(other_url)
            assert wait_until(lambda: "other_tool" in by_name(
                client.browsers.webmcp.list_tools(browser.session_id).tools), 15)
            other_tool = by_name(client.browsers.webmcp.list_tools(browser.session_id).tools)["other_tool"]
            assert other_tool.source.tab_id != add.source.tab_id and other_tool.source.page_url == other_url

            # After a navigation the old document's refs are refused, the new ones work.
            page.goto(tools_url)
            with pytest.raises(NotFoundError, match="stale"):
                client.browsers.webmcp.invoke_tool(browser.session_id, tool_ref=add.tool_ref, input={"a": 1, "b": 1})
            assert wait_until(lambda: "add" in by_name(client.browsers.webmcp.list_tools(browser.session_id).tools), 15)
            fresh = by_name(client.browsers.webmcp.list_tools(browser.session_id).tools)["add"]
            assert fresh.tool_ref != add.tool_ref
            again = client.browsers.webmcp.invoke_tool(browser.session_id, tool_ref=fresh.tool_ref, input={"a": 1, "b": 1})
            assert again.output == {"content": [{"type": "text", "text": "2"}]}
            cdp.close()

        # The same through the MCP server's `webmcp` tool (the page stays open without
        # Playwright).
        async def through_mcp():
            async with mcp_client(control_plane, control_plane.api_key) as session:
                result, listed = await call(session, "webmcp", action="list", session_id=browser.session_id)
                refs = {tool["tool"]["name"]: tool["tool_ref"] for tool in listed["tools"]}
                result, invoked = await call(session, "webmcp", action="invoke", session_id=browser.session_id,
                                             tool_ref=refs["add"], input={"a": 20, "b": 22})
                assert not result.is_error and invoked["status"] == "completed", invoked
                return invoked["output"]

        assert asyncio.run(through_mcp()) == {"content": [{"type": "text", "text": "42"}]}

        # Bad input: a clear 400, never a call.
        for bad in ({"tool_ref": fresh.tool_ref, "input": [1]},
                    {"tool_ref": fresh.tool_ref, "input": {}, "timeout_sec": 0},
                    {"tool_ref": "", "input": {}}):
            answer = httpx.post(f"{control_plane.base_url}/browsers/{browser.session_id}/webmcp/invoke",
                                headers={"Authorization": f"Bearer {control_plane.api_key}"}, json=bad, timeout=30)
            assert answer.status_code == 400 and answer.json()["code"] == "bad_request", answer.text
        with pytest.raises(BadRequestError):
            client.browsers.webmcp.invoke_tool(browser.session_id, tool_ref="not-a-ref", input={})

        # Another organization sees none of it.
        other_org = Kernel(api_key=control_plane.create_api_key("org-webmcp-b"),
                           base_url=control_plane.base_url, max_retries=0)
        with pytest.raises(NotFoundError):
            other_org.browsers.webmcp.list_tools(browser.session_id)
        with pytest.raises(NotFoundError):
            other_org.browsers.webmcp.invoke_tool(browser.session_id, tool_ref=fresh.tool_ref, input={"a": 1, "b": 1})
    finally:
        client.browsers.delete_by_id(browser.session_id)


CUSTOM_SOURCE = """[{
  kind: "page",
  match: {url_patterns: ["http://127.0.0.1:*/tools.html"]},
  tool: {name: "page_title", description: "The page's title",
         inputSchema: {type: "object", properties: {suffix: {type: "string"}}}},
  async execute({suffix}) { return document.title + (suffix ?? ""); },
}]"""


def test_custom_tools_appear_on_matching_pages_only_and_run_there(client, control_plane, pages):
    tools_url, other_url = pages
    browser = client.browsers.create(headless=True)
    sid = browser.session_id
    try:
        added = client.browsers.webmcp.custom_tools.add(sid, namespace="shop", source=CUSTOM_SOURCE)
        [definition] = added.tools
        assert (definition.namespace, definition.kind, definition.tool.name) == ("shop", "page", "page_title")
        assert definition.match.url_patterns == ["http://127.0.0.1:*/tools.html"]
        assert [t.id for t in client.browsers.webmcp.custom_tools.list(sid).tools] == [definition.id]

        with sync_playwright() as playwright:
            cdp = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
            page = first_tab(cdp)
            page.goto(tools_url)
            other = cdp.contexts[0].new_page()
            other.goto(other_url)
            assert wait_until(lambda: "other_tool" in by_name(client.browsers.webmcp.list_tools(sid).tools), 15)
            tools = client.browsers.webmcp.list_tools(sid).tools
            custom = [tool for tool in tools if tool.source.custom is not None]
            # On the matching tab only, once, on its top-level page.
            assert [(tool.tool.name, tool.source.page_url) for tool in custom] == [("page_title", tools_url)]
            assert custom[0].source.custom.id == definition.id and custom[0].source.target_id
            assert "page_title" not in by_name(client.browsers.webmcp.list_tools(sid, exclude_custom=True).tools)

            result = client.browsers.webmcp.invoke_tool(sid, tool_ref=custom[0].tool_ref, input={"suffix": "!"})
            assert (result.status, result.output) == ("completed", "tools!")

            # It survives a navigation (a new ref for the new document).
            page.reload()

            def custom_refs():
                return [tool.tool_ref for tool in client.browsers.webmcp.list_tools(sid).tools if tool.source.custom]
            assert wait_until(lambda: custom_refs() and custom_refs() != [custom[0].tool_ref], 15)
            with pytest.raises(NotFoundError, match="stale"):
                client.browsers.webmcp.invoke_tool(sid, tool_ref=custom[0].tool_ref, input={})
            # A page whose address no longer matches loses it.
            page.goto(tools_url + "?query")
            assert wait_until(lambda: not custom_refs(), 15)
            cdp.close()

        # A name already in the namespace is refused, unless the namespace is replaced.
        with pytest.raises(ConflictError):
            client.browsers.webmcp.custom_tools.add(sid, namespace="shop", source=CUSTOM_SOURCE)
        replaced = client.browsers.webmcp.custom_tools.add(sid, namespace="shop", source=CUSTOM_SOURCE,
                                                          force_overwrite_namespace=True)
        assert [t.id for t in client.browsers.webmcp.custom_tools.list(sid).tools] == [replaced.tools[0].id]
        client.browsers.webmcp.custom_tools.remove(replaced.tools[0].id, id_or_name=sid)
        assert client.browsers.webmcp.custom_tools.list(sid).tools == []
        assert not any(tool.source.custom for tool in client.browsers.webmcp.list_tools(sid).tools)
        with pytest.raises(NotFoundError):
            client.browsers.webmcp.custom_tools.remove(replaced.tools[0].id, id_or_name=sid)

        for bad in ("42", "[]", CUSTOM_SOURCE.replace('kind: "page"', 'kind: "cdp"'),
                    CUSTOM_SOURCE.replace('url_patterns: ["http://127.0.0.1:*/tools.html"]', "url_patterns: []"),
                    "throw new Error('broken')", "["):
            with pytest.raises(BadRequestError):
                client.browsers.webmcp.custom_tools.add(sid, namespace="bad", source=bad)
        assert client.browsers.webmcp.custom_tools.list(sid).tools == []

        other_org = Kernel(api_key=control_plane.create_api_key("org-webmcp-c"),
                           base_url=control_plane.base_url, max_retries=0)
        with pytest.raises(NotFoundError):
            other_org.browsers.webmcp.custom_tools.list(sid)
        with pytest.raises(NotFoundError):
            other_org.browsers.webmcp.custom_tools.add(sid, namespace="x", source=CUSTOM_SOURCE)
    finally:
        client.browsers.delete_by_id(sid)
