"""The browser's REPL (`/browsers/{id}/repl`): a Node.js process in the VM that keeps its
top-level bindings between calls, with Playwright's `page` bound to the browser, and
answers text and images in the order the code produced them."""

from __future__ import annotations

import base64
import json
import struct
import time

import httpx
import kernel
import pytest
from kernel import Kernel

from sdk import SEED_ERA


def repl(client: Kernel, session_id: str, code: str, **options) -> dict:
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/repl", body={"code": code, **options}, cast_to=object)
    return client.browsers.repl(session_id, code=code, **options).to_dict(mode="json")


def texts(answer: dict) -> list[tuple[str, str]]:
    return [(item["channel"], item["text"]) for item in answer["content"] if item["type"] == "text"]


@pytest.fixture(scope="module")
def browser(client):
    session = client.browsers.create(timeout_seconds=300, viewport={"width": 1280, "height": 800})
    yield session
    client.browsers.delete_by_id(session.session_id)


def test_bindings_persist_and_output_comes_in_order(client, browser):
    sid = browser.session_id
    first = repl(client, sid, "let counter = 41; const hello = await Promise.resolve('hi'); console.log(hello)")
    assert first["success"] is True, first
    assert texts(first) == [("stdout", "hi\n")]
    second = repl(client, sid, "counter += 1; repl.write(String(counter)); console.error('to stderr'); "
                               "repl.write(' done'); counter")
    assert second["repl_id"] == first["repl_id"] and second["success"]
    # The expression's value is not output.
    assert texts(second) == [("write", "42"), ("stderr", "to stderr\n"), ("write", " done")]
    assert second["duration_ms"] >= 0 and not second.get("repl_terminated")
    # Lines written past the output capture, straight to the descriptor the REPL answers
    # on, are not taken for answers: this call and the next answer as their own.
    stray = repl(client, sid, "require('fs').writeSync(1, '{\"id\": 999999, \"success\": false}\\n'); "
                              "require('fs').writeSync(1, 'no newline'); repl.write('mine')")
    assert stray["success"] and texts(stray) == [("write", "mine")], stray
    assert texts(repl(client, sid, "repl.write(String(counter))")) == [("write", "42")]


def test_a_screenshot_comes_back_as_an_image(client, browser, test_page_url):
    sid = browser.session_id
    answer = repl(client, sid, f"await page.goto({json.dumps(test_page_url)}); "
                               "repl.write(JSON.stringify(await page.evaluate(() => [innerWidth, innerHeight]))); "
                               "repl.emitImage(await page.screenshot())")
    assert answer["success"], answer
    text, image = answer["content"]
    assert text["text"] and image["type"] == "image" and image["mime_type"] == "image/png"
    png = base64.b64decode(image["data_b64"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = json.loads(text["text"])
    assert width == 1280 and 600 < height <= 800
    assert struct.unpack(">II", png[16:24]) == (width, height), "the page's own size"


def test_errors_timeouts_and_resets(client, browser):
    sid = browser.session_id
    repl(client, sid, "let kept = 'yes'")
    thrown = repl(client, sid, "throw new TypeError('bad thing')")
    assert thrown["success"] is False and thrown["error"] == "TypeError: bad thing"
    assert "bad thing" in thrown["stack"]
    syntax = repl(client, sid, "function broken() {")
    assert syntax["success"] is False and syntax["error"].startswith("SyntaxError")
    assert texts(repl(client, sid, "repl.write(kept)")) == [("write", "yes")], "errors keep the REPL"

    before = repl(client, sid, "repl.write('x')")["repl_id"]
    started = time.monotonic()
    stuck = repl(client, sid, "while (true) {}", timeout_sec=1)
    assert time.monotonic() - started < 5
    assert stuck["success"] is False and stuck["repl_terminated"] is True and stuck["repl_id"] == before
    assert "timed out" in stuck["error"]
    fresh = repl(client, sid, "repl.write(typeof kept)")
    assert fresh["repl_id"] != before and texts(fresh) == [("write", "undefined")]

    repl(client, sid, "var again = 1")
    reset = repl(client, sid, "", reset=True)
    assert reset["success"] and reset["repl_id"] != fresh["repl_id"] and reset["content"] == []
    assert texts(repl(client, sid, "repl.write(typeof again)")) == [("write", "undefined")]


def test_bad_input_is_a_400_and_another_organization_gets_404(client, browser, control_plane):
    sid = browser.session_id
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    assert repl(client, sid, "")["success"] is True, "empty code evaluates nothing"
    for body, needle in [({}, "code"), ({"code": "1", "timeout_sec": 0}, "timeout_sec"),
                         ({"code": "1", "extra": 1}, "extra")]:
        answer = httpx.post(f"{control_plane.base_url}/browsers/{sid}/repl", json=body, headers=headers, timeout=10)
        assert answer.status_code == 400 and needle in json.dumps(answer.json()), (body, answer.text)
    other = Kernel(api_key=control_plane.create_api_key("org-repl-b"), base_url=control_plane.base_url,
                   max_retries=0)
    with pytest.raises(kernel.NotFoundError):
        repl(other, sid, "1")
