"""Browser telemetry with today's SDK: what a page did (console, network, page lifecycle)
captured by the VM's CDP monitor, the API calls and connections the control plane saw,
read back through `browsers.telemetry.events` (paged both ways) and the SSE stream
(resumed with Last-Event-ID), exported to an OTLP/HTTP collector, and kept per
organization. The collector here is a fake that decodes the official protobuf messages.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import time

from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import websocket
from kernel import Kernel, NotFoundError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from playwright.sync_api import sync_playwright

from harness import first_tab, serve, serve_html
from PIL import Image
from sdk import field, today_only
from test_replays import ARTIFACTS, wait_finished

pytestmark = today_only

SECRET_TOKEN = "s3cr3t-token-never-shown"
PAGE = f"""<!doctype html><html><head><title>telemetry</title></head><body>
<a id="tab" href="/other" target="_blank">open a tab</a>
<script>
console.log("hello telemetry", 42);
console.error("bad thing happened");
setTimeout(() => {{ throw new Error("kaboom"); }}, 0);
fetch("/missing", {{ headers: {{ "Authorization": "Bearer {SECRET_TOKEN}" }} }}).catch(() => {{}});
</script></body></html>"""


def page(path: str) -> bytes | None:
    if path.startswith("/missing"):
        return None
    return (PAGE if path.startswith("/page") else "<title>other</title>other").encode()


@pytest.fixture(scope="module")
def site():
    server = serve_html(page)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def wait_for(condition, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def all_events(client: Kernel, session_id: str, **params) -> list:
    """Every event of the session, through the SDK's own paging."""
    return [item.to_dict(mode="json") for item in
            client.browsers.telemetry.events(session_id, since="1h", limit=7, **params)]


def visit(cdp_ws_url: str, url: str, open_tab: bool = False):
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(cdp_ws_url)
        page = first_tab(browser)
        page.goto(url, wait_until="load")
        page.wait_for_timeout(500)
        if open_tab:
            with page.context.expect_page() as opened:
                page.click("#tab")
            opened.value.wait_for_load_state()
        browser.close()


def test_page_console_network_and_tabs_are_captured_and_read_back(client, control_plane, site):
    browser = client.browsers.create(telemetry={"browser": {
        "console": {"enabled": True}, "network": {"enabled": True}, "page": {"enabled": True}}})
    session_id = browser.session_id
    try:
        view = browser.telemetry.to_dict(mode="json")
        assert view["browser"]["console"]["enabled"] and view["browser"]["control"]["enabled"]
        assert not view["browser"]["interaction"]["enabled"]
        visit(browser.cdp_ws_url, f"{site}/page", open_tab=True)

        def captured():
            events = all_events(client, session_id)
            types = {e["event"]["type"] for e in events}
            wanted = {"console_log", "console_error", "network_request", "network_response",
                      "page_navigation", "page_load", "page_tab_opened", "cdp_connect", "cdp_disconnect",
                      "network_idle", "page_layout_settled", "page_navigation_settled"}
            return events if wanted <= types else None

        wait_for(captured, what="the page's events")
        # Both tabs at rest (their settle events come a second after their load).
        time.sleep(2)
        events = all_events(client, session_id)
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "events out of order or with gaps"
        by_type = lambda kind: [e["event"] for e in events if e["event"]["type"] == kind]  # noqa: E731
        logs = by_type("console_log")
        assert any(e["data"]["text"] == "hello telemetry 42" and e["category"] == "console" for e in logs)
        errors = [e["data"]["text"] for e in by_type("console_error")]
        assert "bad thing happened" in errors
        assert any("kaboom" in text for text in errors), errors
        missing = [e for e in by_type("network_response") if e["data"]["url"].endswith("/missing")]
        assert missing and missing[0]["data"]["status"] == 404
        sent = [e for e in by_type("network_request") if e["data"]["url"].endswith("/missing")]
        assert sent[0]["data"]["headers"]["Authorization"] == "[REDACTED]"
        assert any(e["data"]["url"].endswith("/other") for e in by_type("page_tab_opened"))
        assert all(e["source"]["kind"] == "cdp" for e in logs)
        assert {e["data"]["target_id"] for e in logs}, "console events name their target"
        # At rest: after the page's load, its layout settled, then its navigation.
        page_types = [e["event"]["type"] for e in events if e["event"]["data"].get("url", "").endswith("/page")]
        assert page_types.index("page_load") < page_types.index("page_layout_settled") \
            < page_types.index("page_navigation_settled"), page_types
        assert "network_idle" in page_types and all(e["category"] == "network" for e in by_type("network_idle"))

        # Paged newest first, the same events in reverse.
        newest_first = [item.to_dict(mode="json") for item in
                        client.browsers.telemetry.events(session_id, order="desc", limit=6)]
        assert [e["seq"] for e in newest_first] == list(reversed(seqs))
        only_console = all_events(client, session_id, category=["console"])
        assert {e["event"]["category"] for e in only_console} == {"console"}
        assert len(only_console) == len(logs) + len(errors)

        # The SDK's stream helper from the oldest retained, then a resume in the middle.
        streamed = []
        stream = client.browsers.telemetry.stream(session_id, replay="all")
        for frame in stream:
            streamed.append(frame.seq)
            if frame.seq == seqs[-1]:
                break
        stream.close()
        assert streamed == seqs
        middle = seqs[len(seqs) // 2]
        resumed = client.browsers.telemetry.stream(session_id, last_event_id=str(middle))
        first = next(iter(resumed))
        resumed.close()
        assert first.seq == middle + 1

        headers = {"Authorization": f"Bearer {control_plane.api_key}"}
        har = httpx.get(f"{control_plane.base_url}/browsers/{session_id}/telemetry/har", headers=headers).json()
        urls = [entry["request"]["url"] for entry in har["log"]["entries"]]
        assert har["log"]["version"] == "1.2" and any(url.endswith("/missing") for url in urls)
        raw_events = httpx.get(f"{control_plane.base_url}/browsers/{session_id}/telemetry/events",
                               params={"since": "1h", "limit": 1000}, headers=headers).text
        for text in (raw_events, json.dumps(har), json.dumps(events)):
            assert SECRET_TOKEN not in text
    finally:
        client.browsers.delete_by_id(session_id)
    # Still readable after the session ended.
    assert len(all_events(client, session_id)) >= len(seqs)


def test_capture_starts_only_when_asked_and_categories_change_live(client, site):
    for telemetry in (None, {}, {"enabled": False}):
        kwargs = {} if telemetry is None else {"telemetry": telemetry}
        browser = client.browsers.create(**kwargs)
        try:
            assert browser.telemetry is None
            client.browsers.computer.capture_screenshot(browser.session_id)
            visit(browser.cdp_ws_url, f"{site}/page")
            time.sleep(1)
            assert all_events(client, browser.session_id) == [], telemetry
        finally:
            client.browsers.delete_by_id(browser.session_id)

    browser = client.browsers.create(telemetry={"enabled": True})
    session_id = browser.session_id
    try:
        view = browser.telemetry.to_dict(mode="json")["browser"]
        assert {name for name, category in view.items() if category["enabled"]} == {
            "control", "connection", "system", "captcha"}
        client.browsers.computer.capture_screenshot(session_id)
        calls = wait_for(lambda: [e for e in all_events(client, session_id)
                                  if e["event"]["type"] == "api_call"], what="an api_call event")
        assert calls[0]["event"]["data"]["operation_id"] == "browsers.computer.screenshot"
        assert calls[0]["event"]["data"]["status"] == 200
        with sync_playwright() as playwright:
            cdp = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
            page = first_tab(cdp)
            page.goto(f"{site}/page?token=never-shown", wait_until="load")
            page.mouse.click(30, 40)
            page.keyboard.insert_text("typed-secret")
            page.keyboard.press("Enter")
            cdp.close()
        wait_for(lambda: any(e["event"]["type"] == "cdp_disconnect" for e in all_events(client, session_id)),
                 what="the CDP client's disconnect")
        events = all_events(client, session_id)
        assert not [e for e in events if e["event"]["category"] == "console"]
        # The client's browser-control commands, without what could hold a secret.
        connection = next(e["event"]["data"]["connection_id"] for e in events if e["event"]["type"] == "cdp_connect")
        commands = [e["event"] for e in events if e["event"]["type"] == "cdp_command"]
        assert commands and all(c["category"] == "control" and c["data"]["connection_id"] == connection
                                for c in commands)
        by_method = lambda method: [c["data"] for c in commands if c["data"]["method"] == method]  # noqa: E731
        assert [n["url_scheme"] for n in by_method("Page.navigate")] == ["http"]
        clicks = [m for m in by_method("Input.dispatchMouseEvent") if m["event_type"] == "mousePressed"]
        assert [(m["x"], m["y"], m["button"], m["click_count"]) for m in clicks] == [(30, 40, "left", 1)]
        assert {"text_length": 12}.items() <= by_method("Input.insertText")[0].items()
        assert any(k.get("named_key") == "Enter" for k in by_method("Input.dispatchKeyEvent"))
        assert "typed-secret" not in json.dumps(events) and "never-shown" not in json.dumps(events)

        updated = client.browsers.update(session_id, telemetry={"browser": {"console": {"enabled": True}}})
        assert updated.telemetry.browser.console.enabled and updated.telemetry.browser.control.enabled
        assert client.browsers.retrieve(session_id).telemetry.browser.console.enabled

        def console_after_visit():
            visit(browser.cdp_ws_url, f"{site}/page")
            return [e for e in all_events(client, session_id) if e["event"]["category"] == "console"]
        console = wait_for(console_after_visit, what="console events once enabled")
        assert any(e["event"]["data"].get("text") == "hello telemetry 42" for e in console)

        client.browsers.update(session_id, telemetry={"browser": {"console": {"enabled": False}}})
        time.sleep(1.5)
        before = len([e for e in all_events(client, session_id) if e["event"]["category"] == "console"])
        visit(browser.cdp_ws_url, f"{site}/page")
        time.sleep(1.5)
        after = len([e for e in all_events(client, session_id) if e["event"]["category"] == "console"])
        assert after == before, "console events after the category was disabled"

        # Interaction events come from the computer API, typed text only as its length.
        client.browsers.update(session_id, telemetry={"browser": {"interaction": {"enabled": True}}})
        client.browsers.computer.click_mouse(session_id, x=100, y=120)
        client.browsers.computer.type_text(session_id, text="hunter2-password")
        client.browsers.computer.press_key(session_id, keys=["Return"])
        interactions = wait_for(lambda: (lambda found: found if len(found) >= 3 else None)(
            [e["event"] for e in all_events(client, session_id) if e["event"]["category"] == "interaction"]),
            what="interaction events")
        # Recorded where each call was served (replicas may store them in another order).
        data = [event["data"] for event in interactions]
        assert any({"x": 100, "y": 120}.items() <= item.items() for item in data), data
        assert {"text_length": 16} in data and any(item.get("key") == "Return" for item in data), data
        assert "hunter2" not in json.dumps(all_events(client, session_id))

        stopped = client.browsers.update(session_id, telemetry={"enabled": False})
        assert not stopped.telemetry.browser.control.enabled
    finally:
        client.browsers.delete_by_id(session_id)


def test_the_monitor_follows_chromium_across_a_restart(client, site):
    browser = client.browsers.create(telemetry={"browser": {"console": {"enabled": True}}})
    session_id = browser.session_id
    try:
        visit(browser.cdp_ws_url, f"{site}/page")
        wait_for(lambda: any(e["event"]["type"] == "console_log" for e in all_events(client, session_id)),
                 what="console events before the restart")
        # A new timezone restarts Chromium cleanly.
        client.browsers.update(session_id, location={"timezone": "Asia/Tokyo"})
        types = lambda: [e["event"]["type"] for e in all_events(client, session_id)]  # noqa: E731
        wait_for(lambda: "monitor_reconnected" in types(), what="the monitor's reconnection")
        seen = types()
        assert seen.index("monitor_disconnected") < seen.index("monitor_reconnected")
        before = seen.count("console_log")
        visit(browser.cdp_ws_url, f"{site}/page")
        wait_for(lambda: types().count("console_log") > before, what="console events after the restart")
        disconnected = next(e["event"] for e in all_events(client, session_id)
                            if e["event"]["type"] == "monitor_disconnected")
        assert disconnected["category"] == "monitor" and disconnected["data"]["reason"] == "chrome_restarted"
    finally:
        client.browsers.delete_by_id(session_id)


def test_proxy_refusals_and_live_view_input_become_events(client, site):
    """A request the egress proxy refuses (an address the operator's policy does not allow)
    becomes a `proxy_error` joined to the browser's own request, for a plain request and
    for a tunnel; a person's clicks and keys in the live view become interaction events,
    typed text only as its length."""
    browser = client.browsers.create(
        telemetry={"browser": {"network": {"enabled": True}, "interaction": {"enabled": True}}})
    session_id = browser.session_id
    try:
        with sync_playwright() as playwright:
            cdp = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
            page = first_tab(cdp)
            page.goto(f"{site}/page", wait_until="load")
            refused = page.goto("http://10.255.255.1/refused")
            assert refused.status == 403 and refused.headers["x-kernel-proxy-error"] == "network_policy_denied"
            page.goto(f"{site}/page", wait_until="load")
            page.evaluate("fetch('https://10.255.255.2/data').catch(() => {})")
            page.wait_for_timeout(500)
            cdp.close()

        def proxy_errors():
            found = {e["event"]["data"]["url"]: e["event"] for e in all_events(client, session_id)
                     if e["event"]["type"] == "proxy_error"}
            wanted = {"http://10.255.255.1/refused", "https://10.255.255.2/data"}
            return found if wanted <= found.keys() else None
        errors = wait_for(proxy_errors, what="the two requests' proxy_error events")
        plain, tunnel = errors["http://10.255.255.1/refused"], errors["https://10.255.255.2/data"]
        assert plain["category"] == "network" and plain["data"]["code"] == "network_policy_denied"
        assert (plain["data"]["method"], plain["data"]["status"]) == ("GET", 403)
        assert (tunnel["data"]["method"], tunnel["data"]["status"]) == ("CONNECT", 403)
        requests = {e["event"]["data"]["request_id"] for e in all_events(client, session_id)
                    if e["event"]["type"] == "network_request"}
        assert plain["data"]["request_id"] in requests and tunnel["data"]["request_id"] in requests
        # Once per refused request (the page's own, and its icon's), never for one allowed.
        listed = [e["event"]["data"]["request_id"] for e in all_events(client, session_id)
                  if e["event"]["type"] == "proxy_error"]
        assert len(listed) == len(set(listed)), listed
        assert all("10.255.255." in url for url in errors), errors

        live = urlsplit(field(client.browsers.retrieve(session_id), "browser_live_view_url"))
        socket = websocket.create_connection(
            urlunsplit(("ws", live.netloc, live.path + "/ws", live.query, "")), timeout=30)
        try:
            for message in ({"t": "down", "x": 50, "y": 60, "b": 1}, {"t": "up", "x": 50, "y": 60, "b": 1},
                            {"t": "key", "key": "Tab", "down": True}, {"t": "key", "key": "Tab", "down": False},
                            {"t": "text", "text": "typed-secret"}):
                socket.send(json.dumps(message))

            def interactions():
                found = [e["event"]["data"] for e in all_events(client, session_id)
                         if e["event"]["category"] == "interaction"]
                return found if len(found) >= 3 else None
            data = wait_for(interactions, what="the live view's interaction events")
        finally:
            socket.close()
        assert len(data) == 3, data
        assert any(item.get("x") == 50 and item.get("y") == 60 for item in data), data
        assert any(item.get("key") == "Tab" for item in data) and {"text_length": 12} in data, data
        assert "typed-secret" not in json.dumps(all_events(client, session_id))
    finally:
        client.browsers.delete_by_id(session_id)


def test_screenshots_come_at_a_bounded_rate(client, site):
    browser = client.browsers.create(headless=True, telemetry={"browser": {"screenshot": {"enabled": True}}})
    session_id = browser.session_id
    try:
        visit(browser.cdp_ws_url, f"{site}/page")
        shots = wait_for(lambda: [e["event"] for e in all_events(client, session_id)
                                  if e["event"]["type"] == "monitor_screenshot"], timeout=40,
                         what="a screenshot event")
        assert shots[0]["category"] == "screenshot"
        image = Image.open(io.BytesIO(base64.b64decode(shots[0]["data"]["png"])))
        assert image.format == "PNG" and image.width > 100 and image.height > 100
        time.sleep(12)
        stamps = [e["event"]["ts"] for e in all_events(client, session_id)
                  if e["event"]["type"] == "monitor_screenshot"]
        assert all(b - a >= 9_000_000 for a, b in zip(stamps, stamps[1:])), "more than one per 10 s"
    finally:
        client.browsers.delete_by_id(session_id)


def test_a_pool_gives_its_telemetry_and_a_lease_overrides_it_for_itself(client):
    from test_pools import new_pool, wait_available
    pool = new_pool(client, 1, name="telemetry-pool", telemetry={"enabled": True})
    try:
        shown = field(pool, "telemetry")["browser"]
        assert shown["control"]["enabled"] and not shown["console"]["enabled"]
        wait_available(client, pool.id, 1)
        leased = client.browser_pools.acquire(pool.id, telemetry={"browser": {"console": {"enabled": True}}})
        assert leased.telemetry.browser.console.enabled and leased.telemetry.browser.control.enabled
        client.browser_pools.release(pool.id, session_id=leased.session_id, reuse=True)
        wait_available(client, pool.id, 1)
        again = client.browser_pools.acquire(pool.id)
        assert again.session_id == leased.session_id
        assert again.telemetry.browser.control.enabled and not again.telemetry.browser.console.enabled
        client.browser_pools.release(pool.id, session_id=again.session_id, reuse=False)
    finally:
        client.browser_pools.delete(pool.id, force=True)


def test_bad_telemetry_settings_are_refused(client):
    from kernel import BadRequestError
    for telemetry in ({"enabled": False, "browser": {"console": {"enabled": True}}},
                      {"enabled": True, "storage": {"enabled": False}},
                      {"browser": {"bogus": {"enabled": True}}},
                      {"enabled": True, "export": {"otlp": {"enabled": False, "destination": {"name": "x"}}}}):
        with pytest.raises(BadRequestError):
            client.browsers.create(telemetry=telemetry)
    with pytest.raises(NotFoundError):
        client.browsers.create(telemetry={"enabled": True, "export": {"otlp": {"destination": {"name": "nope"}}}})
    with pytest.raises(BadRequestError):
        client.browsers.telemetry.events("whatever", order="desc", since="5m")


class Collector(http.server.BaseHTTPRequestHandler):
    """A fake OTLP/HTTP collector: keeps each decoded request and its headers, answering
    `status`."""
    status = 200
    received: list

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        request = ExportTraceServiceRequest() if self.path == "/v1/traces" else ExportLogsServiceRequest()
        request.ParseFromString(body)
        type(self).received.append((self.path, dict(self.headers), request))
        self.send_response(type(self).status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def collected(handler, path: str, signal: str, items: str):
    """(path, headers, resource attributes, item) of every log record (`signal` "logs",
    `items` "log_records") or span ("spans", "spans") the collector received at `path`."""
    for received_path, headers, request in handler.received:
        if received_path != path:
            continue
        for batch in getattr(request, f"resource_{signal}"):
            resource = {a.key: a.value.string_value for a in batch.resource.attributes}
            for scope in getattr(batch, f"scope_{signal}"):
                for item in getattr(scope, items):
                    yield received_path, headers, resource, item


def collector(status: int):
    handler = type("Handler", (Collector,), {"status": status, "received": []})
    server = serve(handler)
    return server, handler


def test_events_are_exported_over_otlp_and_failures_are_reported(client, control_plane, site):
    good, good_handler = collector(200)
    bad, _ = collector(500)
    created = []
    try:
        destination = client.telemetry.destinations.create(
            name="fake-collector", endpoint=f"http://127.0.0.1:{good.server_address[1]}",
            headers={"x-ingest-key": "ingest-secret-value"})
        assert destination.headers == {"X-Ingest-Key": ""}
        assert client.telemetry.destinations.retrieve("fake-collector").id == destination.id
        failing = client.telemetry.destinations.create(
            name="failing-collector", endpoint=f"http://127.0.0.1:{bad.server_address[1]}")
        with pytest.raises(Exception):
            client.telemetry.destinations.create(name="signal-path",
                                                 endpoint="http://127.0.0.1:4318/v1/logs")

        exported = client.browsers.create(telemetry={
            "browser": {"console": {"enabled": True}, "page": {"enabled": True}},
            "export": {"otlp": {"destination": {"name": "fake-collector"}}}})
        created.append(exported.session_id)
        assert exported.telemetry.export.otlp.destination == destination.id
        visit(exported.cdp_ws_url, f"{site}/page")

        def console_record():
            return next((found for found in collected(good_handler, "/v1/logs", "logs", "log_records")
                         if found[3].event_name == "console_log"), None)

        path, headers, attributes, record = wait_for(console_record, what="an exported console_log")
        assert path == "/v1/logs"
        assert {k.lower(): v for k, v in headers.items()}["x-ingest-key"] == "ingest-secret-value"
        assert attributes["session.id"] == exported.session_id
        assert attributes["kernel.browser.id"] == exported.session_id
        assert attributes["kernel.organization.id"]
        assert json.loads(record.body.string_value)["data"]["text"] == "hello telemetry 42"
        assert record.time_unix_nano > 0
        wait_for(lambda: client.telemetry.destinations.retrieve(destination.id).last_export_at,
                 what="the destination's last export")

        # What has a duration is a span too: the API call, and the navigation to its load.
        client.browsers.computer.capture_screenshot(exported.session_id)

        def spans_received():
            found = {span.name: (resource, span)
                     for _, _, resource, span in collected(good_handler, "/v1/traces", "spans", "spans")}
            return found if {"navigation", "browsers.computer.screenshot"} <= found.keys() else None
        spans = wait_for(spans_received, what="the exported spans")
        resource, navigation = spans["navigation"]
        assert resource["session.id"] == exported.session_id
        url = next(a.value.string_value for a in navigation.attributes if a.key == "url.full")
        assert url == f"{site}/page"
        assert navigation.end_time_unix_nano > navigation.start_time_unix_nano
        _, call = spans["browsers.computer.screenshot"]
        status = next(a.value.int_value for a in call.attributes if a.key == "http.response.status_code")
        assert status == 200 and call.trace_id == navigation.trace_id and len(call.trace_id) == 16

        failing_browser = client.browsers.create(telemetry={
            "enabled": True, "export": {"otlp": {"destination": {"id": failing.id}}}})
        created.append(failing_browser.session_id)
        client.browsers.computer.capture_screenshot(failing_browser.session_id)
        state = wait_for(lambda: (lambda d: d if d.consecutive_failures >= 1 else None)(
            client.telemetry.destinations.retrieve(failing.id)), timeout=60, what="a recorded failure")
        assert state.last_error == "server_error" and state.last_error_at
        # The browser is unaffected: it answers at once.
        started = time.monotonic()
        client.browsers.computer.capture_screenshot(failing_browser.session_id)
        assert time.monotonic() - started < 5

        other = Kernel(api_key=control_plane.create_api_key("telemetry-org-b"),
                       base_url=control_plane.base_url, max_retries=0)
        for call in (lambda: other.telemetry.destinations.retrieve(destination.id),
                     lambda: other.telemetry.destinations.update(destination.id, name="taken"),
                     lambda: other.telemetry.destinations.delete(destination.id),
                     lambda: list(other.browsers.telemetry.events(exported.session_id)),
                     lambda: other.browsers.telemetry.stream(exported.session_id)):
            with pytest.raises(NotFoundError):
                call()
        assert [d.id for d in other.telemetry.destinations.list()] == []
        other_headers = {"Authorization": f"Bearer {other.api_key}"}
        har = httpx.get(f"{control_plane.base_url}/browsers/{exported.session_id}/telemetry/har",
                        headers=other_headers)
        assert har.status_code == 404

        rotated = client.telemetry.destinations.update(destination.id, headers={"x-ingest-key": None})
        assert rotated.headers == {}
    finally:
        for session_id in created:
            client.browsers.delete_by_id(session_id)
        for name in ("fake-collector", "failing-collector"):
            try:
                client.telemetry.destinations.delete(name)
            except NotFoundError:
                pass
        good.shutdown()
        bad.shutdown()


def test_inspector_shows_the_events_and_seeks_the_replay(client, site):
    browser = client.browsers.create(telemetry={"browser": {
        "console": {"enabled": True}, "network": {"enabled": True}, "page": {"enabled": True}}})
    session_id = browser.session_id
    try:
        replay = client.browsers.replays.start(session_id)
        time.sleep(1)
        visit(browser.cdp_ws_url, f"{site}/page")
        time.sleep(1)
        client.browsers.replays.stop(replay.replay_id, id_or_name=session_id)
        replay = wait_finished(client, session_id, replay.replay_id, timeout=60)
        inspector_url = field(client.browsers.retrieve(session_id), "inspector_url")
        assert field(client.browsers.replays.list(session_id)[0], "inspector_url").split("&jwt=")[0] == \
            inspector_url.split("&jwt=")[0]
        started = replay.started_at.timestamp()
        with sync_playwright() as playwright:
            viewer = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = viewer.new_page(viewport={"width": 1400, "height": 900})
            page.goto(inspector_url)
            page.wait_for_selector('#timeline tr[data-type="console_log"]')
            page.click('nav button[data-tab="console"]')
            assert "hello telemetry 42" in page.inner_text("#console")
            assert "kaboom" in page.inner_text("#console")
            page.click('nav button[data-tab="network"]')
            network = page.inner_text("#network")
            assert "/missing" in network and "404" in network
            page.click('nav button[data-tab="timeline"]')

            page.select_option("#type", "console_error")
            types = page.eval_on_selector_all("#timeline tbody tr", "rows => rows.map(r => r.dataset.type)")
            assert types and set(types) == {"console_error"}
            page.select_option("#type", "")
            page.fill("#search", "kaboom")
            texts = page.eval_on_selector_all("#timeline tbody tr", "rows => rows.map(r => r.innerText)")
            assert texts and all("kaboom" in text for text in texts)
            page.fill("#search", "")

            # Clicking an event seeks the video to its moment.
            page.wait_for_function("document.getElementById('video').readyState >= 1")
            row = page.locator('#timeline tr[data-type="console_log"]').first
            offset = int(row.get_attribute("data-ts")) / 1e6 - started
            assert 0 < offset < page.evaluate("document.getElementById('video').duration")
            row.click()
            current = page.evaluate("document.getElementById('video').currentTime")
            assert abs(current - offset) < 0.05, (current, offset)
            # The video's moment marks the events that happened then.
            seq = row.get_attribute("data-seq")
            page.wait_for_selector(f'#timeline tr.now[data-seq="{seq}"]')
            page.evaluate("document.getElementById('video').currentTime = 0")
            page.wait_for_selector(f'#timeline tr.now[data-seq="{seq}"]', state="detached")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=ARTIFACTS / "inspector.png")
            viewer.close()
        shot = Image.open(ARTIFACTS / "inspector.png").convert("RGB")
        assert len(shot.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20, "the inspector looks blank"
    finally:
        client.browsers.delete_by_id(session_id)


def test_an_inspector_link_opens_one_session_only(client, control_plane):
    browser = client.browsers.create(telemetry={"enabled": True})
    try:
        url = field(browser, "inspector_url")
        assert httpx.get(url).status_code == 200
        base, token = url.split("&jwt=")
        assert httpx.get(f"{base}&jwt={token[:-2]}xx").status_code == 401
        other = client.browsers.create()
        try:
            forged = url.replace(browser.session_id, other.session_id)
            assert httpx.get(forged).status_code == 401
            events = httpx.get(forged.replace("/inspector?", "/inspector/events?"))
            assert events.status_code == 401
        finally:
            client.browsers.delete_by_id(other.session_id)
        page = httpx.get(url)
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["referrer-policy"] == "no-referrer"
    finally:
        client.browsers.delete_by_id(browser.session_id)
