"""`cdp_ws_url` at the protocol level (websocket-client, no Playwright): the bytes of a
local browser's DevTools pass through the control plane unchanged, large messages in both
directions included, and the client is told when the browser goes away."""

from __future__ import annotations

import json
import socket
import time

import pytest
import websocket

from sdk import once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

LARGE = 3 * 1024 * 1024


class Cdp:
    def __init__(self, url: str, **options):
        self.socket = websocket.create_connection(url, max_size=None, timeout=30, **options)
        self.next_id = 0

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.socket.send(json.dumps(message))
        while True:
            answer = json.loads(self.socket.recv())
            if answer.get("id") == self.next_id:
                return answer

    def page_session(self) -> str:
        targets = self.call("Target.getTargets")["result"]["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        return self.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})[
            "result"]["sessionId"]


def test_large_messages_cross_the_tunnel_both_ways(client):
    session = client.browsers.create(headless=True)
    try:
        cdp = Cdp(session.cdp_ws_url)
        page = cdp.page_session()
        # A result of 3 MiB (Chromium's frames span many reads) ...
        big = cdp.call("Runtime.evaluate", {"expression": f"'x'.repeat({LARGE})", "returnByValue": True},
                       page)["result"]["result"]["value"]
        assert big == "x" * LARGE
        # ... and a 3 MiB message from the client, read back by the page.
        payload = "y" * LARGE
        length = cdp.call("Runtime.evaluate", {"expression": f"'{payload}'.length", "returnByValue": True},
                          page)["result"]["result"]["value"]
        assert length == LARGE
        # Small calls go on normally afterwards, many of them.
        for n in range(200):
            assert cdp.call("Runtime.evaluate", {"expression": f"{n} + 1", "returnByValue": True},
                            page)["result"]["result"]["value"] == n + 1
        cdp.socket.close()
    finally:
        client.browsers.delete_by_id(session.session_id)


def test_a_client_on_the_apps_unix_socket_is_passed_through_too(control_plane, client):
    """Apps reach the API over a Unix socket beside the data directory; their DevTools
    connections get the same pass-through as TCP clients."""
    [api_socket] = control_plane.data_dir.glob("**/api-*.sock")
    session = client.browsers.create(headless=True)
    try:
        unix = socket.socket(socket.AF_UNIX)
        unix.connect(str(api_socket))
        cdp = Cdp(session.cdp_ws_url, socket=unix)
        page = cdp.page_session()
        big = cdp.call("Runtime.evaluate", {"expression": f"'z'.repeat({LARGE})", "returnByValue": True},
                       page)["result"]["result"]["value"]
        assert big == "z" * LARGE
        assert cdp.call("Runtime.evaluate", {"expression": "6 * 7", "returnByValue": True},
                        page)["result"]["result"]["value"] == 42
        cdp.socket.close()
    finally:
        client.browsers.delete_by_id(session.session_id)


def test_a_client_s_close_gets_chromium_s_answer_and_nothing_after_it(client):
    session = client.browsers.create(headless=True)
    try:
        cdp = Cdp(session.cdp_ws_url)
        assert "product" in cdp.call("Browser.getVersion")["result"]
        cdp.socket.send_close(1000, b"done")
        opcode, data = cdp.socket.recv_data(control_frame=True)
        assert opcode == websocket.ABNF.OPCODE_CLOSE
        assert int.from_bytes(data[:2], "big") == 1000
        # The closing handshake was the two ends' own: no second close follows.
        with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
            cdp.socket.recv_data(control_frame=True)
        # The browser lives on for new connections.
        assert "product" in Cdp(session.cdp_ws_url).call("Browser.getVersion")["result"]
    finally:
        client.browsers.delete_by_id(session.session_id)


def test_the_client_is_told_when_the_browser_goes_away(client):
    session = client.browsers.create(headless=True)
    cdp = Cdp(session.cdp_ws_url)
    assert cdp.call("Browser.getVersion")["result"]["product"].startswith(("Chrome", "HeadlessChrome"))
    client.browsers.delete_by_id(session.session_id)
    started = time.monotonic()
    opcode, data = cdp.socket.recv_data(control_frame=True)
    while opcode != websocket.ABNF.OPCODE_CLOSE:
        opcode, data = cdp.socket.recv_data(control_frame=True)
    assert time.monotonic() - started < 15
    # Chromium stopped without a closing handshake: the control plane closes for it.
    assert (int.from_bytes(data[:2], "big"), data[2:]) == (1011, b"browser went away")
