"""Browser sessions through the official Kernel SDK and Playwright, against the real
control plane, real agents, real Xvfb and Chromium."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import kernel
import pytest
from kernel import Kernel
from playwright.sync_api import sync_playwright

from conftest import TEST_PAGE_TITLE
from harness import first_tab, is_alive, read_page, session_processes, wait_until
from sdk import seed_era_only


def test_session_lifecycle_with_sdk_and_playwright(control_plane, client, test_page_url):
    created = client.browsers.create(viewport={"width": 1280, "height": 800}, timeout_seconds=120)
    assert created.session_id and created.cdp_ws_url.startswith("ws://")
    assert created.timeout_seconds == 120 and created.headless is False
    assert created.viewport is not None and (created.viewport.width, created.viewport.height) == (1280, 800)

    retrieved = client.browsers.retrieve(created.session_id)
    assert retrieved.session_id == created.session_id
    assert created.session_id in [b.session_id for b in client.browsers.list()]

    processes = session_processes(control_plane, created.session_id)
    assert processes["agent"] and processes["xvfb"] and processes["chromium"], processes

    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(retrieved.cdp_ws_url)
        page = first_tab(browser)
        page.goto(test_page_url)
        assert page.title() == TEST_PAGE_TITLE
        # The X screen has the requested size and the window fills it (Chromium's X11
        # window may come out one pixel short of --window-size).
        assert page.evaluate("[screen.width, screen.height]") == [1280, 800]
        outer = page.evaluate("[window.screenX, window.screenY, window.outerWidth, window.outerHeight]")
        assert outer[:2] == [0, 0] and 1279 <= outer[2] <= 1280 and 799 <= outer[3] <= 800, outer
        browser.close()

    client.browsers.delete_by_id(created.session_id)
    with pytest.raises(kernel.NotFoundError):
        client.browsers.retrieve(created.session_id)
    # The VM is cut off before the answer and taken apart just after it.
    def leftover():
        return {pid for pids in processes.values() for pid in pids if is_alive(pid)}

    assert wait_until(lambda: not leftover(), 5), f"processes of the deleted session are still alive: {leftover()}"
    assert created.session_id not in [b.session_id for b in client.browsers.list()]
    assert wait_until(lambda: not (control_plane.data_dir / "browsers" / created.session_id).exists(), 5)


def test_headless_session_works_over_cdp(control_plane, client, test_page_url):
    created = client.browsers.create(headless=True)
    try:
        assert created.headless is True
        processes = session_processes(control_plane, created.session_id)
        assert processes["chromium"] and not processes["xvfb"], processes
        assert read_page(created.cdp_ws_url, test_page_url, lambda page: page.title()) == TEST_PAGE_TITLE
    finally:
        client.browsers.delete_by_id(created.session_id)


@seed_era_only
def test_persistent_sessions_are_shared_and_deleted_by_persistent_id(control_plane, client):
    first = client.browsers.create(persistence={"id": "shared-work"})
    second = client.browsers.create(persistence={"id": "shared-work"})
    assert first.session_id == second.session_id
    assert second.persistence is not None and second.persistence.id == "shared-work"
    other = client.browsers.create(persistence={"id": "other-work"})
    assert other.session_id != first.session_id

    processes = session_processes(control_plane, first.session_id)
    assert processes["agent"] and processes["chromium"]
    raw = client.browsers.with_raw_response.delete(persistent_id="shared-work")
    assert "deprecation" in {k.lower() for k in raw.headers.keys()}
    with pytest.raises(kernel.NotFoundError):
        client.browsers.retrieve(first.session_id)
    assert wait_until(lambda: not any(is_alive(p) for pids in processes.values() for p in pids), 5)
    # Deleting again: nothing live has that persistent id any more.
    with pytest.raises(kernel.NotFoundError):
        client.browsers.delete(persistent_id="shared-work")
    # The persistent id can start a new session afterwards.
    third = client.browsers.create(persistence={"id": "shared-work"})
    assert third.session_id != first.session_id
    for session in (third, other):
        client.browsers.delete_by_id(session.session_id)


def test_authentication_and_organization_isolation(control_plane, client):
    for headers in ({}, {"Authorization": "Bearer sk_wrong_key"}, {"Authorization": "Basic abc"}):
        response = httpx.get(f"{control_plane.base_url}/browsers", headers=headers)
        assert response.status_code == 401
        assert response.json()["code"] == "unauthorized"
    with pytest.raises(kernel.AuthenticationError):
        Kernel(api_key="sk_abc_def", base_url=control_plane.base_url, max_retries=0).browsers.list()

    mine = client.browsers.create()
    try:
        intruder = Kernel(
            api_key=control_plane.create_api_key("org-b"), base_url=control_plane.base_url, max_retries=0
        )
        with pytest.raises(kernel.NotFoundError):
            intruder.browsers.retrieve(mine.session_id)
        with pytest.raises(kernel.NotFoundError):
            intruder.browsers.delete_by_id(mine.session_id)
        assert mine.session_id not in [b.session_id for b in intruder.browsers.list()]
        # Persistent ids are per organization too.
        theirs = intruder.browsers.create(extra_body={"persistence": {"id": "same-name"}}, headless=True)
        ours = client.browsers.create(extra_body={"persistence": {"id": "same-name"}}, headless=True)
        assert theirs.session_id != ours.session_id
        with pytest.raises(kernel.NotFoundError):
            intruder.browsers.retrieve(ours.session_id)
        intruder.browsers.delete_by_id(theirs.session_id)
        client.browsers.delete_by_id(ours.session_id)
        # Still alive for its owner after all of that.
        assert client.browsers.retrieve(mine.session_id).session_id == mine.session_id
    finally:
        client.browsers.delete_by_id(mine.session_id)


def test_cdp_url_needs_its_own_valid_token(control_plane, client):
    first = client.browsers.create(headless=True)
    second = client.browsers.create(headless=True)
    try:
        ws_base = control_plane.base_url.replace("http://", "ws://")
        token_of_second = second.cdp_ws_url.split("jwt=", 1)[1]
        with sync_playwright() as playwright:
            for url in (
                f"{ws_base}/browsers/{first.session_id}/cdp",
                f"{ws_base}/browsers/{first.session_id}/cdp?jwt=garbage",
                f"{ws_base}/browsers/{first.session_id}/cdp?jwt={token_of_second}",
            ):
                with pytest.raises(Exception, match="401"):
                    playwright.chromium.connect_over_cdp(url, timeout=5000)
        client.browsers.delete_by_id(first.session_id)
        # A deleted session's URL no longer works, even with its genuine token.
        with sync_playwright() as playwright, pytest.raises(Exception, match="404"):
            playwright.chromium.connect_over_cdp(first.cdp_ws_url, timeout=5000)
    finally:
        client.browsers.delete_by_id(second.session_id)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["code"], str) and isinstance(body["message"], str), body
    return body


def test_bad_input_answers_the_error_shape(control_plane):
    base = control_plane.base_url
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    json_headers = {**auth, "content-type": "application/json"}

    body = _error(httpx.post(f"{base}/browsers", headers=json_headers, content=b'{"headless": tru'), 400)
    assert body["code"] == "bad_request" and "malformed JSON" in body["message"]

    body = _error(httpx.post(f"{base}/browsers", headers=json_headers, content=b'{"headless": true} trailing'), 400)
    assert "malformed JSON" in body["message"]

    body = _error(httpx.post(f"{base}/browsers", headers=json_headers, json={"headles": True}), 400)
    assert body["details"][0]["code"] == "invalid_input" and "headles" in body["details"][0]["message"]

    body = _error(httpx.post(f"{base}/browsers", headers=json_headers, json={"timeout_seconds": "long"}), 400)
    assert "timeout_seconds" in body["details"][0]["message"]

    body = _error(httpx.post(f"{base}/browsers", headers=json_headers, json={"timeout_seconds": 5}), 400)
    assert "timeout_seconds" in body["details"][0]["message"] and "10" in body["details"][0]["message"]

    body = _error(
        httpx.post(f"{base}/browsers", headers=json_headers, json={"viewport": {"width": 0, "height": 100000}}), 400
    )
    assert len(body["details"]) == 2

    _error(httpx.post(f"{base}/browsers", headers={**auth, "content-type": "text/plain"}, content=b"hi"), 415)
    _error(httpx.post(f"{base}/browsers", headers=json_headers, content=b"{" + b" " * (2 << 20) + b"}"), 413)
    assert _error(httpx.get(f"{base}/no/such/route", headers=auth), 404)["code"] == "not_found"
    assert _error(httpx.put(f"{base}/browsers", headers=auth), 405)["code"] == "method_not_allowed"
    _error(httpx.get(f"{base}/browsers?limit=many", headers=auth), 400)
    _error(httpx.get(f"{base}/browsers?status=sleeping", headers=auth), 400)
    _error(httpx.delete(f"{base}/browsers", headers=auth), 400)
    _error(httpx.get(f"{base}/browsers/doesnotexist", headers=auth), 404)
    _error(httpx.get(f"{base}/browsers/%FF", headers=auth), 400)
    _error(httpx.delete(f"{base}/browsers/doesnotexist", headers=auth), 404)
    # Nothing was started by any of the rejected requests.
    assert httpx.get(f"{base}/browsers", headers=auth).json() == []


def test_list_pages_with_sdk_headers(control_plane, client):
    created = [client.browsers.create(headless=True) for _ in range(3)]
    try:
        first_page = client.browsers.list(limit=2)
        assert len(first_page.items) == 2 and first_page.has_more is True
        everything = [b.session_id for b in client.browsers.list(limit=2)]  # auto-pages
        assert sorted(everything) == sorted(c.session_id for c in created)
    finally:
        for session in created:
            client.browsers.delete_by_id(session.session_id)


def test_openapi_document_and_health(control_plane):
    document = httpx.get(f"{control_plane.base_url}/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    for path in ("/browsers", "/browsers/{id}", "/browsers/{id}/cdp", "/healthz", "/readyz"):
        assert path in document["paths"], path
    assert httpx.get(f"{control_plane.base_url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{control_plane.base_url}/readyz").status_code == 200


def test_puppeteer_connects_with_browser_ws_endpoint(client, test_page_url):
    created = client.browsers.create(headless=True)
    try:
        script = Path(__file__).parent / "node-clients" / "connect.mjs"
        result = subprocess.run(
            ["node", str(script), created.cdp_ws_url, test_page_url],
            capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1]) == {"title": TEST_PAGE_TITLE}
    finally:
        client.browsers.delete_by_id(created.session_id)
