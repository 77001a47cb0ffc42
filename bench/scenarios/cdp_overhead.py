"""What the CDP tunnel costs: `Runtime.evaluate` round trips through the browser's
`cdp_ws_url` (client → control plane → gRPC → agent → Chromium) next to the same calls on
the same browser's own DevTools socket, from a client inside the VM's network namespace.
One client program (websocket-client, one connection, one page session) measures both,
so the difference is the tunnel's. Small messages (`1 + 1`) and a 4 MiB result."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from harness import ControlPlane, session_processes, wait_until

SMALL_RUNS = 2000
LARGE_RUNS = 40
WARMUP = 50

# Attaches to a page through the browser endpoint (flat sessions, as Playwright does)
# and times `Runtime.evaluate` calls; prints one duration in seconds per line.
CLIENT = r"""
import json, socket as net, sys, time
import websocket

url, expression, runs, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
socket = websocket.create_connection(url, max_size=None, enable_multithread=False)
socket.sock.setsockopt(net.IPPROTO_TCP, net.TCP_NODELAY, 1)
next_id = iter(range(1, 10**9))

def call(method, params=None, session=None):
    message = {"id": next(next_id), "method": method, "params": params or {}}
    if session:
        message["sessionId"] = session
    socket.send(json.dumps(message))
    while True:
        answer = json.loads(socket.recv())
        if answer.get("id") == message["id"]:
            return answer

targets = call("Target.getTargets")["result"]["targetInfos"]
page = next(t for t in targets if t["type"] == "page")
session = call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["result"]["sessionId"]
params = {"expression": expression, "returnByValue": True}
for _ in range(warmup):
    call("Runtime.evaluate", params, session)
for _ in range(runs):
    started = time.perf_counter()
    call("Runtime.evaluate", params, session)
    print(time.perf_counter() - started)
socket.close()
"""


def _devtools_url(server: ControlPlane, session_id: str) -> str:
    """The browser's own DevTools endpoint, from the file Chromium writes in its profile."""
    active = server.data_dir / "browsers" / session_id / "root" / "user-data" / "DevToolsActivePort"
    assert wait_until(active.exists, 10), active
    port, path = active.read_text().split()[:2]
    return f"ws://127.0.0.1:{port}{path}"


def _measure(command_prefix: list[str], url: str, expression: str, runs: int) -> list[float]:
    out = subprocess.run([*command_prefix, sys.executable, "-c", CLIENT, url, expression, str(runs), str(WARMUP)],
                         check=True, capture_output=True, text=True, timeout=600)
    return [float(line) for line in out.stdout.split()]


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.api_key}"})
        session = http.post("/browsers", json={"headless": True}).raise_for_status().json()
        sid = session["session_id"]
        chromium = min(session_processes(server, sid)["chromium"])
        direct = _devtools_url(server, sid)
        into_vm = ["nsenter", f"--net=/proc/{chromium}/ns/net", "--"]
        for name, expression, runs in [
            ("small message", "1 + 1", SMALL_RUNS),
            ("4 MiB result", "'x'.repeat(4 * 1024 * 1024)", LARGE_RUNS),
        ]:
            # Alternating blocks, so that neither side gets the quieter moments.
            ours: list[float] = []
            reference: list[float] = []
            for _ in range(2):
                ours += _measure([], session["cdp_ws_url"], expression, runs // 2)
                reference += _measure(into_vm, direct, expression, runs // 2)
                time.sleep(0.5)
            report(f"cdp_overhead: Runtime.evaluate, {name}", ours,
                   {"the browser's own DevTools socket": reference}, percentiles=(50, 99))
        print("goal (issue 20): small messages at most 1.1x the median and 1.3x the p99; 4 MiB at most 1.05x")
        http.delete(f"/browsers/{sid}")
    finally:
        server.reap_everything()
