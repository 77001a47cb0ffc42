"""Computer controls through the official SDK: OS-level input on the browser's X display
lands in the page exactly where and how it was asked for."""

from __future__ import annotations

import io
import itertools
import json
import math
import subprocess
import time
import zipfile
from pathlib import Path

import httpx
import kernel
import pytest
from PIL import Image
from playwright.sync_api import sync_playwright

from harness import first_tab, vm_root, wait_until
from sdk import SEED_ERA, fields, on_browser

WIDTH, HEIGHT = 1280, 800


@pytest.fixture(scope="module")
def desktop(client, test_page_url):
    """A headful session showing the event-recording page, and a Playwright page on it."""
    session = client.browsers.create(viewport={"width": WIDTH, "height": HEIGHT}, timeout_seconds=600)
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(session.cdp_ws_url)
        page = first_tab(browser)
        page.goto(test_page_url.replace("page.html", "events.html"))
        page.bring_to_front()
        yield session, page
        browser.close()
    client.browsers.delete_by_id(session.session_id)


def events_after(page, start: int, predicate, timeout: float = 5.0) -> list[dict]:
    """The events recorded since index `start`, once `predicate` holds for them."""
    found: list[dict] = []

    def ready() -> bool:
        nonlocal found
        found = page.evaluate(f"window.events.slice({start})")
        return predicate(found)

    assert wait_until(ready, timeout, interval=0.05), found
    return found


def types(events: list[dict], *wanted: str) -> list[str]:
    return [e["type"] for e in events if e["type"] in wanted]


def test_click_variants_reach_the_page_where_asked(client, desktop):
    session, page = desktop
    computer = client.browsers.computer
    sid = session.session_id

    start = page.evaluate("window.events.length")
    computer.click_mouse(sid, x=400, y=300)
    events = events_after(page, start, lambda e: "click" in types(e, "click"))
    click = next(e for e in events if e["type"] == "click")
    assert (click["x"], click["y"], click["button"]) == (400, 300, 0)
    assert types(events, "mousedown", "mouseup", "click") == ["mousedown", "mouseup", "click"]

    start = page.evaluate("window.events.length")
    computer.click_mouse(sid, x=420, y=320, button="right")
    events = events_after(page, start, lambda e: "contextmenu" in types(e, "contextmenu"))
    menu = next(e for e in events if e["type"] == "contextmenu")
    assert (menu["x"], menu["y"], menu["button"]) == (420, 320, 2)

    start = page.evaluate("window.events.length")
    computer.click_mouse(sid, x=500, y=350, num_clicks=2)
    events = events_after(page, start, lambda e: "dblclick" in types(e, "dblclick"))
    assert types(events, "click").count("click") == 2

    start = page.evaluate("window.events.length")
    computer.click_mouse(sid, x=510, y=360, click_type="down")
    events = events_after(page, start, lambda e: "mousedown" in types(e, "mousedown"))
    assert "mouseup" not in types(events, "mouseup")
    computer.click_mouse(sid, x=510, y=360, click_type="up")
    events = events_after(page, start, lambda e: "mouseup" in types(e, "mouseup"))
    assert types(events, "mousedown", "mouseup") == ["mousedown", "mouseup"]

    start = page.evaluate("window.events.length")
    computer.click_mouse(sid, x=530, y=370, hold_keys=["shift"])
    events = events_after(page, start, lambda e: "click" in types(e, "click"))
    assert next(e for e in events if e["type"] == "click")["shift"] is True
    # The hold key was released afterwards.
    start = page.evaluate("window.events.length")
    computer.click_mouse(sid, x=540, y=380)
    events = events_after(page, start, lambda e: "click" in types(e, "click"))
    assert next(e for e in events if e["type"] == "click")["shift"] is False


def test_drag_follows_the_path_with_the_button_held(client, desktop):
    session, page = desktop
    sid = session.session_id
    start = page.evaluate("window.events.length")
    path = [[200, 250], [300, 350], [450, 300]]
    # Steps further apart than a frame (16 ms), or Chromium coalesces the moves.
    client.browsers.computer.drag_mouse(sid, path=path, steps_per_segment=5, step_delay_ms=25)
    events = events_after(page, start, lambda e: "mouseup" in types(e, "mouseup"))
    down = next(e for e in events if e["type"] == "mousedown")
    up = next(e for e in events if e["type"] == "mouseup")
    assert (down["x"], down["y"]) == (200, 250)
    assert (up["x"], up["y"]) == (450, 300)
    moves = [e for e in events if e["type"] == "mousemove"]
    between = [m for m in moves if events.index(down) < events.index(m) < events.index(up)]
    assert len(between) >= 5 and all(m["buttons"] == 1 for m in between)
    assert any((m["x"], m["y"]) == (300, 350) for m in between), "the drag skipped a path point"

    position = client.browsers.computer.get_mouse_position(sid)
    assert (position.x, position.y) == (450, 300)


def test_keyboard_scroll_and_move(client, desktop):
    session, page = desktop
    computer = client.browsers.computer
    sid = session.session_id
    computer.click_mouse(sid, x=700, y=page.evaluate(
        "Math.round(window.screenY + (window.outerHeight - window.innerHeight) + 160)"))
    assert wait_until(lambda: page.evaluate("document.activeElement.id") == "text", 5)
    computer.type_text(sid, text="Hello World")
    assert wait_until(lambda: page.input_value("#text") == "Hello World", 5), page.input_value("#text")
    computer.press_key(sid, keys=["BackSpace", "BackSpace"])
    assert wait_until(lambda: page.input_value("#text") == "Hello Wor", 5)
    computer.press_key(sid, keys=["Ctrl+a"])
    computer.type_text(sid, text="x")
    assert wait_until(lambda: page.input_value("#text") == "x", 5), page.input_value("#text")
    # Capitals, symbols and letters of many languages come out as written, also with
    # Caps Lock on; a character no keyboard here has (Ω) too.
    computer.press_key(sid, keys=["Ctrl+a"])
    text = "Zoë's café: 1€ < 2£! Łódź, Ærøskøbing, ¿qué? Ω"
    computer.type_text(sid, text=text)
    computer.press_key(sid, keys=["Caps_Lock"])
    computer.type_text(sid, text=" aB!é")
    computer.press_key(sid, keys=["Caps_Lock"])
    assert wait_until(lambda: page.input_value("#text") == text + " aB!é", 5), page.input_value("#text")

    computer.scroll(sid, x=400, y=400, delta_y=5)
    assert wait_until(lambda: page.evaluate("window.scrollY") > 0, 5)

    computer.move_mouse(sid, x=123, y=456)
    position = computer.get_mouse_position(sid)
    assert (position.x, position.y) == (123, 456)


def batch(client, session_id: str, actions: list[dict]):
    """`computer.batch` today; through the generic client for the seed-era SDK."""
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/computer/batch", body={"actions": actions}, cast_to=object)
    return client.browsers.computer.batch(session_id, actions=actions)


def test_a_batch_runs_its_actions_in_order_in_one_call(client, desktop):
    session, page = desktop
    sid = session.session_id
    page.fill("#text", "")
    input_y = page.evaluate("Math.round(window.screenY + (window.outerHeight - window.innerHeight) + 160)")
    start = page.evaluate("window.events.length")
    batch(client, sid, [
        {"type": "click_mouse", "click_mouse": {"x": 700, "y": input_y}},
        {"type": "type_text", "type_text": {"text": "batched"}},
        {"type": "press_key", "press_key": {"keys": ["BackSpace"]}},
        {"type": "sleep", "sleep": {"duration_ms": 50}},
        {"type": "click_mouse", "click_mouse": {"x": 300, "y": 500, "button": "right"}},
        {"type": "move_mouse", "move_mouse": {"x": 222, "y": 333}},
    ])
    # Done when the call answers: everything already happened, in order.
    assert page.input_value("#text") == "batche"
    events = events_after(page, start, lambda e: "contextmenu" in types(e, "contextmenu"))
    order = types(events, "click", "keydown", "contextmenu")
    assert order[0] == "click" and order[-1] == "contextmenu" and order.count("keydown") == len("batched") + 1
    position = client.browsers.computer.get_mouse_position(sid)
    assert (position.x, position.y) == (222, 333)

    # Checked before anything runs: each problem named by its index.
    with pytest.raises(kernel.BadRequestError) as refused:
        batch(client, sid, [
            {"type": "type_text", "type_text": {"text": "never"}},
            {"type": "click_mouse", "click_mouse": {"x": 99999, "y": 1}},
            {"type": "sleep", "sleep": {"duration_ms": -1}},
            {"type": "set_cursor"},
            {"type": "scroll"},
        ])
    text = json.dumps(refused.value.body)
    for needle in ("actions[1].click_mouse", "actions[2].sleep", "actions[3].set_cursor",
                   "actions[4].scroll"):
        assert needle in text, (needle, text)
    assert page.input_value("#text") == "batche"

    # A failure while running stops the batch there and names the index.
    with pytest.raises(kernel.BadRequestError) as failed:
        batch(client, sid, [
            {"type": "click_mouse", "click_mouse": {"x": 700, "y": input_y}},
            {"type": "press_key", "press_key": {"keys": ["End"]}},
            {"type": "type_text", "type_text": {"text": "z"}},
            {"type": "press_key", "press_key": {"keys": ["NoSuchKeyAnywhere"]}},
            {"type": "type_text", "type_text": {"text": "never"}},
        ])
    assert failed.value.body["message"].startswith("actions[3]:"), failed.value.body
    assert wait_until(lambda: page.input_value("#text") == "batchez", 5), page.input_value("#text")


def _off_line(points: list[tuple[int, int]]) -> float:
    """How far the points stray from the straight line between the first and the last."""
    (x0, y0), (x1, y1) = points[0], points[-1]
    length = math.hypot(x1 - x0, y1 - y0)
    return max(abs((x - x0) * (y1 - y0) - (y - y0) * (x1 - x0)) / length for x, y in points)


def test_smooth_moves_and_drags_curve_and_take_their_duration(client, desktop):
    session, page = desktop
    computer = client.browsers.computer
    sid = session.session_id
    computer.move_mouse(sid, x=200, y=250)
    start = page.evaluate("window.events.length")
    began = time.monotonic()
    computer.move_mouse(sid, x=900, y=600, **fields(smooth=True, duration_ms=600))
    took = time.monotonic() - began
    moves = [e for e in events_after(page, start, lambda e: any((m["x"], m["y"]) == (900, 600) for m in e))
             if e["type"] == "mousemove"]
    assert len(moves) >= 30, moves
    assert (moves[-1]["x"], moves[-1]["y"]) == (900, 600)
    # The duration asked for, within 10%, in the page's own clock and at the API.
    span = moves[-1]["t"] - moves[0]["t"]
    assert 540 <= span <= 660, span
    assert 0.54 <= took < 1.5, took
    assert _off_line([(200, 250)] + [(m["x"], m["y"]) for m in moves]) > 15

    start = page.evaluate("window.events.length")
    computer.drag_mouse(sid, path=[[300, 300], [700, 320], [650, 550]], **fields(smooth=True, duration_ms=500))
    events = events_after(page, start, lambda e: "mouseup" in types(e, "mouseup"))
    down = next(e for e in events if e["type"] == "mousedown")
    up = next(e for e in events if e["type"] == "mouseup")
    held = [e for e in events if e["type"] == "mousemove" and e["buttons"] == 1]
    assert (down["x"], down["y"]) == (300, 300) and (up["x"], up["y"]) == (650, 550)
    assert len(held) >= 25 and 450 <= up["t"] - down["t"] <= 560, (len(held), up["t"] - down["t"])
    # Through the middle point, on curves rather than straight lines.
    assert any(abs(e["x"] - 700) <= 2 and abs(e["y"] - 320) <= 2 for e in held)
    with pytest.raises(kernel.BadRequestError) as refused:
        computer.move_mouse(sid, x=10, y=10, **fields(duration_ms=300))
    assert "duration_ms needs smooth: true" in refused.value.body["message"]


def clipboard(client, session_id: str, operation: str, **body):
    """`computer.read_clipboard` / `write_clipboard` today; through the generic client for
    the seed-era SDK."""
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/computer/clipboard/{operation}", body=body, cast_to=object)
    if operation == "read":
        return client.browsers.computer.read_clipboard(session_id).to_dict()
    return client.browsers.computer.write_clipboard(session_id, **body)


def test_the_clipboard_carries_text_both_ways(client, desktop):
    session, page = desktop
    computer = client.browsers.computer
    sid = session.session_id
    input_y = page.evaluate("Math.round(window.screenY + (window.outerHeight - window.innerHeight) + 160)")
    page.fill("#text", "")
    computer.click_mouse(sid, x=700, y=input_y)
    text = "pasted from the API, ✓ 日本語"
    clipboard(client, sid, "write", text=text)
    computer.press_key(sid, keys=["Ctrl+v"])
    assert wait_until(lambda: page.input_value("#text") == text, 5), page.input_value("#text")

    page.fill("#text", "copied by the page")
    computer.click_mouse(sid, x=700, y=input_y)
    computer.press_key(sid, keys=["Ctrl+a", "Ctrl+c"])
    assert wait_until(lambda: clipboard(client, sid, "read")["text"] == "copied by the page", 5)


SAMPLES_PER_SECOND = 4


def _pointer_seen(video: Path, x: int, y: int) -> list[bool]:
    """For each quarter second of a recording, whether anything but the page's green
    shows around (x, y): the frames a player shows (the `fps` filter fills the slots of
    a variable-frame-rate recording), cut to the 24x24 pixels around the point (even
    sides: the video is 4:2:0)."""
    side = 24
    pixels = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(video),
         "-vf", f"fps={SAMPLES_PER_SECOND},crop={side}:{side}:{x - side // 2}:{y - side // 2}",
         "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        check=True, capture_output=True,
    ).stdout
    size = side * side * 3
    assert pixels and len(pixels) % size == 0, f"{video}: {len(pixels)} bytes of frames"
    return [
        any(abs(r - 10) > 60 or abs(g - 200) > 60 or abs(b - 30) > 60
            for r, g, b in zip(frame[0::3], frame[1::3], frame[2::3]))
        for frame in (pixels[at:at + size] for at in range(0, len(pixels), size))
    ]


def test_a_hidden_cursor_is_gone_from_recordings_until_shown(client, desktop, tmp_path):
    session, page = desktop
    sid = session.session_id
    x, y = 300, 600
    client.browsers.computer.move_mouse(sid, x=x, y=y)

    def set_cursor(hidden: bool):
        if SEED_ERA:
            return client.post(f"/browsers/{sid}/computer/cursor", body={"hidden": hidden}, cast_to=object)
        return client.browsers.computer.set_cursor_visibility(sid, hidden=hidden).to_dict()

    replay = client.browsers.replays.start(sid)
    try:
        time.sleep(1.0)
        # Hidden from inside a batch; shown again by the route.
        batch(client, sid, [{"type": "set_cursor", "set_cursor": {"hidden": True}}])
        time.sleep(1.5)
        set_cursor(False)
        time.sleep(1.0)
    finally:
        assert set_cursor(False) == {"ok": True}
        client.browsers.replays.stop(replay.replay_id, **on_browser(sid))
    video = tmp_path / "cursor.mp4"
    video.write_bytes(client.browsers.replays.download(replay.replay_id, **on_browser(sid)).read())

    # Read whole rather than at set times: on a busy host a call can take seconds, and
    # where its effect lands in the video with it. The pointer shows, is gone for at
    # least most of the 1.5 s it was hidden, then shows again until the end.
    seen = _pointer_seen(video, x, y)
    runs = [(state, len(list(group))) for state, group in itertools.groupby(seen)]
    assert [state for state, _ in runs] == [True, False, True], runs
    assert runs[1][1] >= SAMPLES_PER_SECOND, runs
    assert runs[0][1] >= 2 and runs[2][1] >= 2, runs


def test_screenshots_show_the_screen(control_plane, desktop):
    session, page = desktop
    base = f"{control_plane.base_url}/browsers/{session.session_id}/computer"
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    whole = httpx.post(f"{base}/screenshot", headers=headers, json={})
    assert whole.status_code == 200 and whole.headers["content-type"] == "image/png"
    image = Image.open(io.BytesIO(whole.content)).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    # The page's background, well inside the content area.
    assert image.getpixel((640, 600)) == (10, 200, 30)

    region = {"x": 600, "y": 500, "width": 100, "height": 50}
    part = httpx.post(f"{base}/screenshot", headers=headers, json={"region": region})
    cropped = Image.open(io.BytesIO(part.content)).convert("RGB")
    assert cropped.size == (100, 50) and cropped.getpixel((40, 25)) == (10, 200, 30)


def test_bad_computer_input_is_a_clear_400(client, control_plane, desktop):
    session, _ = desktop
    base = f"{control_plane.base_url}/browsers/{session.session_id}/computer"
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    cases = [
        ("drag_mouse", {"path": [[1, 1]]}, "path"),
        ("drag_mouse", {"path": [[1, 1], [2, 2, 3]]}, "path[1]"),
        ("drag_mouse", {"path": [[1, 1], [2, "x"]]}, "path"),
        ("drag_mouse", {"path": [[1, 1], [2, 2]], "steps_per_segment": 0}, "steps_per_segment"),
        ("drag_mouse", {"path": [[1, 1], [2, 2]], "delay": -1}, "delay"),
        ("drag_mouse", {"path": [[1, 1], [2, 2]], "step_delay_ms": -5}, "step_delay_ms"),
        ("drag_mouse", {"path": [[1, 1], [2, 2]], "button": "back"}, "button"),
        ("click_mouse", {"x": 5000, "y": 10}, "1280x800"),
        ("click_mouse", {"x": -1, "y": 10}, "1280x800"),
        ("click_mouse", {"x": 10, "y": 10, "button": "thumb"}, "button"),
        ("click_mouse", {"x": 10, "y": 10, "click_type": "triple"}, "click_type"),
        ("click_mouse", {"x": 10, "y": 10, "num_clicks": 0}, "num_clicks"),
        ("click_mouse", {"x": 10, "y": 10, "hold_keys": ["hyperdrive"]}, "hyperdrive"),
        ("click_mouse", {"x": 10}, "y"),
        ("click_mouse", {"x": 10, "y": 10, "z": 1}, "z"),
        ("press_key", {"keys": []}, "keys"),
        ("press_key", {"keys": ["NoSuchKey"]}, "NoSuchKey"),
        ("screenshot", {"region": {"x": 1200, "y": 0, "width": 200, "height": 10}}, "region.width"),
        ("move_mouse", {"x": 10, "y": 900}, "1280x800"),
    ]
    for operation, body, named in cases:
        response = httpx.post(f"{base}/{operation}", headers=auth, json=body)
        assert response.status_code == 400, (operation, body, response.status_code, response.text)
        error = response.json()
        assert error["code"] == "bad_request"
        assert named in error["message"] + " ".join(d["message"] for d in error.get("details", [])), (operation, error)


def test_headless_sessions_have_no_computer_controls(client):
    session = client.browsers.create(headless=True)
    try:
        with pytest.raises(kernel.BadRequestError, match="headless"):
            client.browsers.computer.click_mouse(session.session_id, x=1, y=1)
        with pytest.raises(kernel.BadRequestError, match="headless"):
            client.browsers.computer.get_mouse_position(session.session_id)
    finally:
        client.browsers.delete_by_id(session.session_id)


def test_typescript_sdk_runs_the_five_seed_operations(client, control_plane, desktop, tmp_path):
    session, page = desktop
    archive = tmp_path / "archive.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("hello.txt", "from typescript")
    start = page.evaluate("window.events.length")
    script = Path(__file__).parent / "node-clients" / "seed_ops.mjs"
    result = subprocess.run(
        ["node", str(script), control_plane.base_url, control_plane.api_key, session.session_id, str(archive)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"x": 350, "y": 500}

    root = vm_root(control_plane, session.session_id)
    assert (root / "ts/moved.txt").read_text() == "from typescript"
    assert not (root / "ts/unzipped/hello.txt").exists()
    # The right click and the drag each end with a mouseup.
    events = events_after(page, start, lambda e: types(e, "mouseup").count("mouseup") >= 2)
    menu = next(e for e in events if e["type"] == "contextmenu")
    assert (menu["x"], menu["y"]) == (610, 410)
    drag_down = next(e for e in events if e["type"] == "mousedown" and e["button"] == 0)
    drag_up = [e for e in events if e["type"] == "mouseup"][-1]
    assert (drag_down["x"], drag_down["y"], drag_up["x"], drag_up["y"]) == (250, 450, 350, 500)


def test_another_organization_reaches_none_of_the_new_controls(client, control_plane, desktop):
    session, _ = desktop
    other = {"Authorization": f"Bearer {control_plane.create_api_key('org-computer-b')}"}
    base = f"{control_plane.base_url}/browsers/{session.session_id}"
    for path, body in [("computer/batch", {"actions": [{"type": "sleep", "sleep": {"duration_ms": 1}}]}),
                       ("computer/clipboard/read", {}), ("computer/clipboard/write", {"text": "x"}),
                       ("computer/cursor", {"hidden": True}), ("fs/watch", {"path": "/"})]:
        answer = httpx.post(f"{base}/{path}", json=body, headers=other)
        assert answer.status_code == 404 and answer.json()["code"] == "not_found", (path, answer.text)
    upload = httpx.post(f"{base}/fs/upload", headers=other,
                        files={"files[0][file]": ("x", b"x")}, data={"files[0][dest_path]": "/x"})
    assert upload.status_code == 404, upload.text
    # Bad input to the new routes is the Error shape.
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    for path, body in [("computer/clipboard/write", {"text": 5}), ("computer/cursor", {}),
                       ("computer/batch", {"actions": []})]:
        answer = httpx.post(f"{base}/{path}", json=body, headers=auth)
        assert answer.status_code == 400 and answer.json()["code"] == "bad_request", (path, answer.text)
