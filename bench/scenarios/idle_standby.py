"""Idle browsers: what 10 browsers nobody uses cost in CPU when frozen (the default: after
`--freeze-idle-after-seconds` their VMs' processes are stopped) next to the same 10 kept
running (`--freeze-idle-after-seconds 0`, today's idle cost), in the same run; and the
first CDP call after a thaw (WebSocket connect + `Browser.getVersion` on a frozen
browser) next to the same call on a browser that is awake."""

from __future__ import annotations

import json
import time
from pathlib import Path

import websocket

from harness import ControlPlane, cpu_seconds, process_state, session_processes, wait_until
from scenarios import api_client

from .density import _vm_pids

BROWSERS = 10
FREEZE_AFTER_SECONDS = 3
# Once every browser has started and settled.
SETTLE_SECONDS = 10
WINDOW_SECONDS = 20
THAW_ROUNDS = 3


def _all_frozen(server: ControlPlane, ids: list[str]) -> bool:
    for sid in ids:
        kinds = session_processes(server, sid)
        browser_side = kinds["chromium"] | kinds["xvfb"]
        if not browser_side or not all(process_state(pid) == "T" for pid in browser_side):
            return False
    return True


def _first_call(cdp_ws_url: str) -> float:
    started = time.perf_counter()
    socket = websocket.create_connection(cdp_ws_url, suppress_origin=True)
    socket.send(json.dumps({"id": 1, "method": "Browser.getVersion"}))
    while json.loads(socket.recv()).get("id") != 1:
        pass
    elapsed = time.perf_counter() - started
    socket.close()
    return elapsed


def _idle_share(server: ControlPlane, ids: list[str]) -> float:
    """CPU the browsers' VMs used over the window, as a share of one core."""
    pids = set().union(*(_vm_pids(server, sid) for sid in ids))
    before = cpu_seconds(pids)
    time.sleep(WINDOW_SECONDS)
    return (cpu_seconds(pids) - before) / WINDOW_SECONDS


def _start(work_dir: Path, name: str, freeze_after: int) -> tuple[ControlPlane, list[dict]]:
    server = ControlPlane(work_dir / name, extra_args=[
        "--freeze-idle-after-seconds", str(freeze_after)]).start()
    http = api_client(server, timeout=120)
    browsers = []
    for index in range(BROWSERS):
        response = http.post("/browsers", json={"headless": index % 2 == 0, "timeout_seconds": 3600})
        response.raise_for_status()
        browsers.append(response.json())
    return server, browsers


def run(work_dir: Path, report) -> None:
    # Today's idle cost: the same browsers, never frozen.
    server, browsers = _start(work_dir, "awake", 0)
    try:
        time.sleep(SETTLE_SECONDS)
        awake_share = _idle_share(server, [b["session_id"] for b in browsers])
    finally:
        server.reap_everything()

    server, browsers = _start(work_dir, "frozen", FREEZE_AFTER_SECONDS)
    try:
        ids = [b["session_id"] for b in browsers]
        time.sleep(SETTLE_SECONDS)
        assert wait_until(lambda: _all_frozen(server, ids), timeout=60), "the browsers did not freeze"
        frozen_share = _idle_share(server, ids)
        after_thaw, awake = [], []
        for _ in range(THAW_ROUNDS):
            assert wait_until(lambda: _all_frozen(server, ids), timeout=60), "the browsers did not freeze"
            for browser in browsers:
                after_thaw.append(_first_call(browser["cdp_ws_url"]))
                awake.append(_first_call(browser["cdp_ws_url"]))
    finally:
        server.reap_everything()

    print(f"\n== {BROWSERS} idle browsers ({BROWSERS // 2} headful, {BROWSERS // 2} headless), "
          f"CPU over {WINDOW_SECONDS} s, every process of their VMs")
    print(f"{'frozen (default)':34}{frozen_share * 100:>10.2f}% of one core")
    print(f"{'kept running (today)':34}{awake_share * 100:>10.2f}% of one core")
    report("first CDP call after a thaw (connect + Browser.getVersion)", after_thaw,
           {"the same call, browser awake": awake})
