"""What the CDP tunnel costs: `Runtime.evaluate` round trips through the browser's
`cdp_ws_url` next to the same calls on the same browser's own DevTools socket, reached
from inside the VM's network namespace. One client program holds both connections and
alternates between them call by call (which goes first alternates too), so both see the
same moments of the machine and the difference is the tunnel's. Small messages (`1 + 1`)
and a 4 MiB result."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harness import ControlPlane, session_processes, wait_until

SMALL_RUNS = 2000
LARGE_RUNS = 40
WARMUP = 50
# A browser just created is still starting (profile, components): measure once its
# processes use less than this share of one CPU over a window.
QUIET_SHARE = 0.05
QUIET_WINDOW = 0.5
QUIET_LIMIT = 30.0

# Connects to `cdp_ws_url`, then enters the VM's network namespace and connects to the
# browser's own DevTools socket; attaches to the page on each (flat sessions, as
# Playwright does) and times `Runtime.evaluate` calls on both in turn. Prints one line
# per pair: the tunnel's duration and the direct one's, in seconds.
CLIENT = r"""
import ctypes, json, os, socket as net, sys, time
import websocket

tunnel_url, direct_url, netns, expression, runs, warmup = sys.argv[1:7]
runs, warmup = int(runs), int(warmup)

def connect(url, **options):
    socket = websocket.create_connection(url, max_size=None, enable_multithread=False, **options)
    socket.sock.setsockopt(net.IPPROTO_TCP, net.TCP_NODELAY, 1)
    return socket

tunnel = connect(tunnel_url)
libc = ctypes.CDLL(None, use_errno=True)
if libc.setns(os.open(netns, os.O_RDONLY), 0x40000000) != 0:  # CLONE_NEWNET
    raise OSError(ctypes.get_errno(), "setns")
direct = connect(direct_url, suppress_origin=True)  # as Playwright, which sends no Origin
next_id = iter(range(1, 10**9))

def call(socket, method, params=None, session=None):
    message = {"id": next(next_id), "method": method, "params": params or {}}
    if session:
        message["sessionId"] = session
    socket.send(json.dumps(message))
    while True:
        answer = json.loads(socket.recv())
        if answer.get("id") == message["id"]:
            return answer

def page_session(socket):
    targets = call(socket, "Target.getTargets")["result"]["targetInfos"]
    page = next(t for t in targets if t["type"] == "page")
    attached = call(socket, "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})
    return attached["result"]["sessionId"]

sessions = {tunnel: page_session(tunnel), direct: page_session(direct)}
params = {"expression": expression, "returnByValue": True}

def timed(socket):
    started = time.perf_counter()
    call(socket, "Runtime.evaluate", params, sessions[socket])
    return time.perf_counter() - started

for _ in range(warmup):
    timed(tunnel), timed(direct)
for run in range(runs):
    if run % 2:
        through_tunnel, directly = timed(tunnel), timed(direct)
    else:
        directly, through_tunnel = timed(direct), timed(tunnel)
    print(through_tunnel, directly)
tunnel.close()
direct.close()
"""


def _devtools_url(server: ControlPlane, session_id: str) -> str:
    """The browser's own DevTools endpoint, from the file Chromium writes in its profile."""
    active = server.data_dir / "browsers" / session_id / "root" / "user-data" / "DevToolsActivePort"
    assert wait_until(active.exists, 10), active
    port, path = active.read_text().split()[:2]
    return f"ws://127.0.0.1:{port}{path}"


def _cpu_seconds(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _wait_until_quiet(server: ControlPlane, session_id: str) -> None:
    deadline = time.monotonic() + QUIET_LIMIT
    while time.monotonic() < deadline:
        pids = set().union(*session_processes(server, session_id).values())
        before = _cpu_seconds(pids)
        time.sleep(QUIET_WINDOW)
        if _cpu_seconds(pids) - before < QUIET_SHARE * QUIET_WINDOW:
            return
    print(f"cdp_overhead: the browser was still busy after {QUIET_LIMIT:.0f} s; measuring anyway")


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.api_key}"})
        session = http.post("/browsers", json={"headless": True}).raise_for_status().json()
        sid = session["session_id"]
        chromium = min(session_processes(server, sid)["chromium"])
        direct = _devtools_url(server, sid)
        _wait_until_quiet(server, sid)
        for name, expression, runs in [
            ("small message", "1 + 1", SMALL_RUNS),
            ("4 MiB result", "'x'.repeat(4 * 1024 * 1024)", LARGE_RUNS),
        ]:
            out = subprocess.run(
                [sys.executable, "-c", CLIENT, session["cdp_ws_url"], direct, f"/proc/{chromium}/ns/net",
                 expression, str(runs), str(WARMUP)],
                check=True, capture_output=True, text=True, timeout=600)
            pairs = [tuple(map(float, line.split())) for line in out.stdout.splitlines()]
            report(f"cdp_overhead: Runtime.evaluate, {name}", [ours for ours, _ in pairs],
                   {"the browser's own DevTools socket": [direct for _, direct in pairs]},
                   percentiles=(50, 99))
        print("goal (issue 20): small messages at most 1.1x the median and 1.3x the p99; 4 MiB at most 1.05x")
        http.delete(f"/browsers/{sid}")
    finally:
        server.reap_everything()
