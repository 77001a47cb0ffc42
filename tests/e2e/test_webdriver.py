"""WebDriver BiDi (`webdriver_ws_url`): chromedriver in the browser's VM, attached to the
session's own Chromium whatever a client asks for, reached through the control plane
with the session's token. Puppeteer (protocol webDriverBiDi) and Selenium's Python BiDi
client each drive a page through it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright
from selenium.webdriver.common.bidi.browsing_context import BrowsingContext
from selenium.webdriver.common.bidi.common import command_builder
from selenium.webdriver.remote.websocket_connection import WebSocketConnection

from conftest import TEST_PAGE_TITLE

from sdk import once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


@pytest.fixture(scope="module")
def browser(client):
    session = client.browsers.create(timeout_seconds=300, headless=True)
    yield session
    client.browsers.delete_by_id(session.session_id)


def webdriver_ws_url(client, session_id: str) -> str:
    return client.get(f"/browsers/{session_id}", cast_to=object)["webdriver_ws_url"]


def test_puppeteer_drives_a_page_over_webdriver_bidi(client, browser, control_plane, test_page_url):
    url = webdriver_ws_url(client, browser.session_id)
    assert url.startswith(control_plane.base_url.replace("http", "ws", 1) + f"/browsers/{browser.session_id}/webdriver?jwt=")
    script = Path(__file__).parent / "node-clients" / "bidi.mjs"
    result = subprocess.run(["node", str(script), url, test_page_url], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"title": TEST_PAGE_TITLE, "protocol": "webDriverBiDi"}


def test_selenium_bidi_drives_the_sessions_own_browser(client, browser, test_page_url):
    url = webdriver_ws_url(client, browser.session_id)
    connection = WebSocketConnection(url, 30, 0.1)
    try:
        # A client that names a Chrome binary of its own still gets this browser.
        connection.execute(command_builder("session.new", {"capabilities": {"alwaysMatch": {
            "goog:chromeOptions": {"binary": "/usr/bin/false"}}}}))
        contexts = BrowsingContext(connection).get_tree()
        context = contexts[0].context
        BrowsingContext(connection).navigate(context=context, url=test_page_url + "?via=selenium", wait="complete")
        evaluated = connection.execute(command_builder("script.evaluate", {
            "expression": "document.title", "target": {"context": context}, "awaitPromise": False}))
        assert evaluated["result"]["value"] == TEST_PAGE_TITLE
        connection.execute(command_builder("session.end", {}))
    finally:
        connection.close()
    # It was the session's browser: its tab shows the page Selenium opened, over CDP too.
    with sync_playwright() as playwright:
        cdp = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
        assert test_page_url + "?via=selenium" in [page.url for page in cdp.contexts[0].pages]
        cdp.close()


def test_the_endpoint_needs_the_sessions_token(client, browser, control_plane):
    base = f"{control_plane.base_url}/browsers/{browser.session_id}/webdriver"
    assert httpx.get(base).status_code == 401
    other = client.browsers.create(headless=True)
    try:
        foreign = webdriver_ws_url(client, other.session_id).split("jwt=", 1)[1]
        assert httpx.get(base, params={"jwt": foreign}).status_code == 401
    finally:
        client.browsers.delete_by_id(other.session_id)
