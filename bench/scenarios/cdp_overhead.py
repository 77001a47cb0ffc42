"""What the CDP tunnel costs: `Runtime.evaluate` round trips through the browser's
`cdp_ws_url` next to the same calls on the same browser's own DevTools socket, reached
from inside the VM's network namespace, and through the cheapest process hop there is
(`control-plane/examples/minimal_relay.rs`, in the VM's namespace: a blocking thread per
direction, reading nothing). One client program holds the three connections and takes
turns between them call by call (in every order in turn), so all see the same
moments of the machine. Small messages (`1 + 1`) and a 4 MiB result."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from harness import REPO, ControlPlane, cpu_seconds, session_processes, wait_until
from scenarios import api_client

SMALL_RUNS = 2000
LARGE_RUNS = 40
WARMUP = 50
# A browser just created is still starting (profile, components): measure once its
# processes use less than this share of one CPU over a window.
QUIET_SHARE = 0.05
QUIET_WINDOW = 0.5
QUIET_LIMIT = 30.0
MINIMAL_RELAY = REPO / "target" / "release" / "examples" / "minimal_relay"

# Connects to `cdp_ws_url`, then enters the VM's network namespace and connects to the
# browser's own DevTools socket and to the relay; attaches to the page on each (flat
# sessions, as Playwright does) and times `Runtime.evaluate` calls on each in turn.
# Prints one line per round: the tunnel's duration, the direct one's and the relay's, in
# seconds.
CLIENT = r"""
import ctypes, itertools, json, os, socket as net, sys, time
import websocket

tunnel_url, direct_url, relay_url, netns, expression, runs, warmup = sys.argv[1:8]
runs, warmup = int(runs), int(warmup)

def connect(url, **options):
    socket = websocket.create_connection(url, max_size=None, enable_multithread=False, **options)
    socket.sock.setsockopt(net.IPPROTO_TCP, net.TCP_NODELAY, 1)
    return socket

tunnel = connect(tunnel_url)
libc = ctypes.CDLL(None, use_errno=True)
namespace = os.open(netns, os.O_RDONLY)
if libc.setns(namespace, 0x40000000) != 0:  # CLONE_NEWNET
    raise OSError(ctypes.get_errno(), "setns")
os.close(namespace)
direct = connect(direct_url, suppress_origin=True)  # as Playwright, which sends no Origin
relay = connect(relay_url, suppress_origin=True)
sockets = [tunnel, direct, relay]
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

sessions = {socket: page_session(socket) for socket in sockets}
params = {"expression": expression, "returnByValue": True}

def timed(socket):
    started = time.perf_counter()
    call(socket, "Runtime.evaluate", params, sessions[socket])
    return time.perf_counter() - started

for _ in range(warmup):
    for socket in sockets:
        timed(socket)
orders = list(itertools.permutations(sockets))  # every order in turn: no one follows another more
for run in range(runs):
    durations = {}
    for socket in orders[run % len(orders)]:
        durations[socket] = timed(socket)
    print(*(durations[socket] for socket in sockets))
for socket in sockets:
    socket.close()
"""


def _devtools_url(server: ControlPlane, session_id: str) -> str:
    """The browser's own DevTools endpoint, from the file Chromium writes in its profile."""
    active = server.data_dir / "browsers" / session_id / "root" / "user-data" / "DevToolsActivePort"
    assert wait_until(active.exists, 10), active
    port, path = active.read_text().split()[:2]
    return f"ws://127.0.0.1:{port}{path}"


def _wait_until_quiet(server: ControlPlane, session_id: str) -> None:
    deadline = time.monotonic() + QUIET_LIMIT
    while time.monotonic() < deadline:
        pids = set().union(*session_processes(server, session_id).values())
        before = cpu_seconds(pids)
        time.sleep(QUIET_WINDOW)
        if cpu_seconds(pids) - before < QUIET_SHARE * QUIET_WINDOW:
            return
    print(f"cdp_overhead: the browser was still busy after {QUIET_LIMIT:.0f} s; measuring anyway")


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    relay: subprocess.Popen | None = None
    try:
        http = api_client(server)
        session = http.post("/browsers", json={"headless": True}).raise_for_status().json()
        sid = session["session_id"]
        chromium = min(session_processes(server, sid)["chromium"])
        direct = _devtools_url(server, sid)
        netns = f"/proc/{chromium}/ns/net"
        port, path = direct.removeprefix("ws://127.0.0.1:").split("/", 1)
        relay = subprocess.Popen(["nsenter", f"--net={netns}", "--", str(MINIMAL_RELAY), port],
                                 stdout=subprocess.PIPE, text=True)
        assert relay.stdout is not None
        relayed = f"ws://127.0.0.1:{relay.stdout.readline().strip()}/{path}"
        _wait_until_quiet(server, sid)
        for name, expression, runs in [
            ("small message", "1 + 1", SMALL_RUNS),
            ("4 MiB result", "'x'.repeat(4 * 1024 * 1024)", LARGE_RUNS),
        ]:
            out = subprocess.run(
                [sys.executable, "-c", CLIENT, session["cdp_ws_url"], direct, relayed, netns,
                 expression, str(runs), str(WARMUP)],
                check=True, capture_output=True, text=True, timeout=600)
            rounds = [tuple(map(float, line.split())) for line in out.stdout.splitlines()]
            report(f"cdp_overhead: Runtime.evaluate, {name}", [ours for ours, _, _ in rounds],
                   {"the browser's own DevTools socket": [direct for _, direct, _ in rounds],
                    "a minimal relay (one process hop)": [relayed for _, _, relayed in rounds]},
                   percentiles=(50, 99))
        print("goal (issue 20): small messages at most 1.1x the median and 1.3x the p99 of the own "
              "socket; 4 MiB at most 1.05x")
        http.delete(f"/browsers/{sid}")
    finally:
        if relay is not None:
            relay.kill()
            relay.wait()
        server.reap_everything()
