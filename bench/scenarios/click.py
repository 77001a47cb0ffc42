"""A click through the REST API (`POST /browsers/{id}/computer/click_mouse`, until the
answer) next to the same click on the same display by an in-process enigo (the agent's own
library, no API) and by a `xdotool click --delay 0 1` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from harness import REPO, ControlPlane, session_processes
from scenarios import api_client, kept_alive, rotate_in_blocks

RUNS = 500
WARMUP = 20
BLOCK = 25
X, Y = 640, 400


def _display_of(xvfb_pid: int) -> str:
    """The display an Xvfb serves, from the X11 socket among its open files (as its own
    network namespace sees them: abstract sockets live there)."""
    inodes = set()
    for fd in Path(f"/proc/{xvfb_pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for line in Path(f"/proc/{xvfb_pid}/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and "/.X11-unix/X" in fields[7]:
            return ":" + fields[7].rsplit("X", 1)[1]
    raise RuntimeError("no X11 socket found for Xvfb")


def _into_network_of(pid: int) -> list[str]:
    """A command prefix that runs a reference in the network namespace of the VM's Xvfb
    (where its display is), or nothing for a VM on the host's network."""
    theirs, ours = os.readlink(f"/proc/{pid}/ns/net"), os.readlink("/proc/self/ns/net")
    return [] if theirs == ours else ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]


def headful_browser(server, http) -> tuple[str, int, str]:
    """A new 1280x800 headful browser of `server`: its id, its Xvfb's pid and display."""
    session = http.post("/browsers", json={"viewport": {"width": 1280, "height": 800}}).raise_for_status().json()
    xvfb = next(iter(session_processes(server, session["session_id"])["xvfb"]))
    return session["session_id"], xvfb, _display_of(xvfb)


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        http = api_client(server)
        sid, xvfb, display = headful_browser(server, http)

        connection, headers = kept_alive(server)
        body = json.dumps({"x": X, "y": Y})
        example = REPO / "target" / "release" / "examples" / "click_latency"
        into_vm = _into_network_of(xvfb)
        enigo = subprocess.Popen([*into_vm, str(example), display, str(X), str(Y)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, bufsize=1)
        env = {**os.environ, "DISPLAY": display}

        def rest_click() -> float:
            started = time.perf_counter()
            connection.request("POST", f"/browsers/{sid}/computer/click_mouse", body, headers)
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
            return time.perf_counter() - started

        def enigo_click() -> float:
            enigo.stdin.write("click\n")
            return int(enigo.stdout.readline()) / 1_000_000

        def xdotool_click() -> float:
            started = time.perf_counter()
            # (nsenter execs xdotool: one more exec than on the host's network)
            subprocess.run([*into_vm, "xdotool", "click", "--delay", "0", "1"], env=env, check=True)
            return time.perf_counter() - started

        # In blocks of BLOCK clicks per method, the order of methods rotating every round:
        # all three meet the same browser state and drift, while no click directly follows
        # another method's (an xdotool run is a fork/exec storm that would slow whatever
        # runs next on this 2-core machine).
        ours, in_process, xdotool = rotate_in_blocks([rest_click, enigo_click, xdotool_click],
                                                     RUNS, WARMUP, BLOCK)
        enigo.stdin.close()
        enigo.wait()
        connection.close()

        report("click: REST API round trip", ours,
               {"in-process enigo": in_process, "xdotool subprocess": xdotool},
               percentiles=(50, 99))
        http.delete(f"/browsers/{sid}").raise_for_status()
    finally:
        server.reap_everything()
