"""PATCH `viewport` resizes a running browser live: its screen (screenshots, input
bounds, recordings) and Chromium's window, without restarting it."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import httpx
import kernel
import pytest
from PIL import Image
from playwright.sync_api import sync_playwright

from harness import first_tab, wait_until
from sdk import field, on_browser, update_browser

GREEN = (10, 200, 30)


def refused(call, status: int, *needles: str):
    with pytest.raises(kernel.APIStatusError) as error:
        call()
    assert error.value.status_code == status, error.value.body
    for needle in needles:
        assert needle in error.value.body["message"], error.value.body


def screenshot(control_plane, session_id: str) -> Image.Image:
    answer = httpx.post(f"{control_plane.base_url}/browsers/{session_id}/computer/screenshot",
                        headers={"Authorization": f"Bearer {control_plane.api_key}"}, json={})
    assert answer.status_code == 200, answer.text
    return Image.open(io.BytesIO(answer.content)).convert("RGB")


def video_size(path: Path) -> tuple[int, int]:
    probe = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                            "stream=width,height", "-of", "json", str(path)],
                           check=True, capture_output=True, text=True)
    stream = json.loads(probe.stdout)["streams"][0]
    return stream["width"], stream["height"]


def test_the_screen_window_and_page_follow_a_new_viewport(client, control_plane, test_page_url):
    session = client.browsers.create(viewport={"width": 1024, "height": 768}, timeout_seconds=300)
    sid = session.session_id
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(session.cdp_ws_url)
            page = first_tab(browser)
            page.goto(test_page_url.replace("page.html", "events.html"))
            page.bring_to_front()
            measure = "[screen.width, screen.height, outerWidth, outerHeight, innerWidth]"
            assert page.evaluate(measure) == [1024, 768, 1024, 768, 1024]

            for width, height in [(1280, 720), (800, 600)]:
                updated = update_browser(client, sid, viewport={"width": width, "height": height})
                assert field(updated, "viewport")["width"] == width
                assert field(updated, "viewport")["height"] == height
                # The page sees the new screen and a window that fills it.
                expected = [width, height, width, height, width]
                assert wait_until(lambda: page.evaluate(measure) == expected, 5), page.evaluate(measure)
                # The screen is that size, and the page reaches its far corner.
                image = screenshot(control_plane, sid)
                assert image.size == (width, height)
                assert wait_until(lambda: screenshot(control_plane, sid).getpixel((width - 40, height - 10)) == GREEN, 5)
                retrieved = client.browsers.retrieve(sid)
                assert field(retrieved, "viewport")["width"] == width

            # Input follows the new bounds: inside lands in the page, outside is refused.
            start = page.evaluate("window.events.length")
            client.browsers.computer.click_mouse(sid, x=700, y=590)
            assert wait_until(lambda: any(e["type"] == "click" and (e["x"], e["y"]) == (700, 590)
                                          for e in page.evaluate(f"window.events.slice({start})")), 5)
            refused(lambda: client.browsers.computer.click_mouse(sid, x=1000, y=700), 400,
                    "outside the 800x600 screen")
            browser.close()

        # Up to the server's resize limit (1920x1080 by default), not beyond.
        refused(lambda: update_browser(client, sid, viewport={"width": 2560, "height": 1440}), 400,
                "viewport", "1920x1080")
        refused(lambda: update_browser(client, sid, viewport={"width": 50, "height": 600}), 400,
                "viewport.width must be between 100 and 7680")
        refused(lambda: update_browser(client, sid, viewport={"width": 800}), 400, "height")
        assert screenshot(control_plane, sid).size == (800, 600), "a refused resize changes nothing"
    finally:
        client.browsers.delete_by_id(sid)


def test_a_recording_blocks_a_resize_unless_forced_which_starts_a_new_segment(client, control_plane, tmp_path):
    session = client.browsers.create(viewport={"width": 1024, "height": 768}, timeout_seconds=300)
    sid = session.session_id
    try:
        first = client.browsers.replays.start(sid)
        refused(lambda: update_browser(client, sid, viewport={"width": 800, "height": 600}), 409,
                first.replay_id, "viewport.force")
        assert screenshot(control_plane, sid).size == (1024, 768)

        update_browser(client, sid, viewport={"width": 800, "height": 600, "force": True})
        assert screenshot(control_plane, sid).size == (800, 600)
        replays = client.browsers.replays.list(**on_browser(sid))
        assert len(replays) == 2, replays
        second = next(r for r in replays if r.replay_id != first.replay_id)
        assert next(r for r in replays if r.replay_id == first.replay_id).finished_at is not None
        assert second.finished_at is None, "the new segment records"
        client.browsers.replays.stop(second.replay_id, **on_browser(sid))

        for replay, size in [(first, (1024, 768)), (second, (800, 600))]:
            video = tmp_path / f"{replay.replay_id}.mp4"
            video.write_bytes(client.browsers.replays.download(replay.replay_id, **on_browser(sid)).read())
            assert video_size(video) == size
    finally:
        client.browsers.delete_by_id(sid)


def test_headless_browsers_refuse_a_new_viewport_by_name(client):
    session = client.browsers.create(headless=True)
    try:
        refused(lambda: update_browser(client, session.session_id, viewport={"width": 800, "height": 600}),
                400, "headless", "not supported by this server")
    finally:
        client.browsers.delete_by_id(session.session_id)
