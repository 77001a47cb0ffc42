"""A warm pool's lease cycle: acquire → Playwright connect over CDP → open a local page →
release (with reuse), next to the same connect → open → close against a bare Chromium
(the same binary and flags, headless, launched once) in the same run; then the same cycle
with the reset it causes (release → idle again), and acquire alone. Rounds alternate
between the two, each on a machine at rest, so neither pays for the other's work."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from harness import ControlPlane, first_tab, serve_html
from scenarios import api_client, kept_alive

CYCLES = 30
POOL_SIZE = 5
# How long a freshly restarted Chromium is left to settle before a timed step.
SETTLE = 1.0
PAGE = b"<!doctype html><title>bench</title><h1>hello</h1>"


def _bare_chromium(user_data_dir: str) -> tuple[subprocess.Popen, str]:
    flags = [
        "--headless=new", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
        f"--user-data-dir={user_data_dir}", "--no-first-run", "--no-default-browser-check",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--password-store=basic", "--window-size=1920,1080",
    ]
    if os.geteuid() == 0:
        flags += ["--no-sandbox", "--test-type"]
    chromium = subprocess.Popen(["chromium", *flags, "about:blank"], stderr=subprocess.PIPE,
                                start_new_session=True)
    assert chromium.stderr is not None
    for line in chromium.stderr:
        match = re.search(rb"DevTools listening on (ws://\S+)", line)
        if match:
            threading.Thread(target=chromium.stderr.read, daemon=True).start()
            return chromium, match.group(1).decode()
    raise RuntimeError("Chromium did not announce DevTools")


def _visit(playwright, cdp_url: str, page_url: str) -> None:
    browser = playwright.chromium.connect_over_cdp(cdp_url)
    page = first_tab(browser)
    page.goto(page_url)
    assert page.title() == "bench"
    browser.close()


def run(work_dir: Path, report) -> None:
    page_server = serve_html(lambda _path: PAGE)
    page_url = f"http://127.0.0.1:{page_server.server_address[1]}/"
    server = ControlPlane(work_dir / "data").start()
    user_data_dir = tempfile.mkdtemp(prefix="bench-chromium-")
    chromium, bare_url = _bare_chromium(user_data_dir)
    try:
        api = api_client(server)
        pool = api.post("/browser_pools", json={
            "size": POOL_SIZE, "headless": True, "fill_rate_per_minute": 6000,
        }).json()
        deadline = time.monotonic() + 120
        while api.get(f"/browser_pools/{pool['id']}").json()["available_count"] < POOL_SIZE:
            assert time.monotonic() < deadline, "the pool did not fill"
            time.sleep(0.2)
        # The standard library's client on one kept-alive connection for acquire and
        # release (it sends a small request in one segment), so the figures are the
        # service's, not the client's.
        connection, headers = kept_alive(server)

        def call(path: str, body: dict) -> dict | None:
            connection.request("POST", f"/browser_pools/{pool['id']}/{path}", json.dumps(body), headers)
            response = connection.getresponse()
            data = response.read()
            assert response.status in (200, 204), (response.status, data)
            return json.loads(data) if data else None

        def at_rest() -> None:
            """Waits until every pool browser is idle, then lets the last reset's Chromium
            settle (it keeps both cores busy for a moment after its DevTools answers)."""
            deadline = time.monotonic() + 60
            while api.get(f"/browser_pools/{pool['id']}").json()["available_count"] < POOL_SIZE:
                assert time.monotonic() < deadline, "a released browser did not become idle again"
                time.sleep(0.01)

        # Each round starts on a machine at rest, so no round pays for another's reset:
        # the pool's cycle, then the reset it caused (release → idle again), then the bare
        # cycle on a quiet machine.
        cycles, resets, acquires, bare = [], [], [], []
        with sync_playwright() as playwright:
            for index in range(CYCLES + 3):  # three untimed rounds warm both up
                at_rest()
                time.sleep(SETTLE)
                started = time.perf_counter()
                session = call("acquire", {"acquire_timeout_seconds": 30})
                acquired = time.perf_counter()
                _visit(playwright, session["cdp_ws_url"], page_url)
                call("release", {"session_id": session["session_id"], "reuse": True})
                ended = time.perf_counter()
                at_rest()
                reset = time.perf_counter() - ended
                time.sleep(SETTLE)

                reference_started = time.perf_counter()
                _visit(playwright, bare_url, page_url)
                reference = time.perf_counter() - reference_started
                if index >= 3:
                    cycles.append(ended - started)
                    resets.append(reset)
                    acquires.append(acquired - started)
                    bare.append(reference)
        references = {"connect → open page → close, bare Chromium": bare}
        report("acquire → connect → open page → release", cycles, references)
        # What a lease costs in all: its reset (a Chromium restart) is in the background,
        # but it takes the machine's CPU and the browser is not leasable meanwhile.
        report("the same, with the reset until the browser is idle again",
               [cycle + reset for cycle, reset in zip(cycles, resets)], references)
        for label, samples in (("acquire on a pool at rest", acquires),
                               ("release → idle again (the reset)", resets)):
            ordered = sorted(samples)
            print(f"{label}: median {ordered[len(ordered) // 2] * 1000:.2f} ms, "
                  f"p90 {ordered[int(len(ordered) * 0.9) - 1] * 1000:.2f} ms")
    finally:
        os.killpg(chromium.pid, 9)
        chromium.wait()
        shutil.rmtree(user_data_dir, ignore_errors=True)
        page_server.shutdown()
        server.reap_everything()
