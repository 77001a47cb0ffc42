"""Cold `POST /browsers` (no pool, headful on its own new Xvfb) until the response, next
to the same Chromium, with the same flags, launched directly on an already running
display until its DevTools `/json/version` answers.

The reference runs as an unprivileged user with a new home directory, so that Chromium
sets up its own sandbox and its per-user files as it does in every new VM (where it runs
as the VM's tenant user). A second reference is the fastest launch there is and not what
the service runs: as root (which needs `--no-sandbox`) with root's home, long used."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx

from harness import CHROMIUM, ControlPlane

RUNS = 10
VIEWPORT = (1920, 1080)


def _chromium_flags(user_data_dir: str) -> list[str]:
    flags = [
        "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
        f"--user-data-dir={user_data_dir}", "--no-first-run", "--no-default-browser-check",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--password-store=basic", "--disable-pings", "--media-router=0",
        "--disable-gpu", "--window-position=0,0", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
    ]
    return flags + ["about:blank"]


# The unprivileged user the reference runs as when the bench runs as root.
NOBODY = 65534


def _free_displays(count: int) -> list[int]:
    """Display numbers no X server holds (neither a lock file nor a socket)."""
    free = [n for n in range(200, 400) if not Path(f"/tmp/.X{n}-lock").exists()
            and not Path(f"/tmp/.X11-unix/X{n}").exists()]
    return free[:count]


def _start_xvfb(display: int | None = None) -> tuple[subprocess.Popen, str]:
    """An Xvfb as the agent starts it, on a free display number of its own (here
    `-displayfd` has handed two servers started in a row the same number)."""
    number = _free_displays(1)[0] if display is None else display
    xvfb = subprocess.Popen(
        ["Xvfb", f":{number}", "-screen", "0", f"{VIEWPORT[0]}x{VIEWPORT[1]}x24",
         "-nolisten", "tcp", "-noreset", "-extension", "GLX"],  # as the agent starts it
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not Path(f"/tmp/.X11-unix/X{number}").exists():
        assert xvfb.poll() is None and time.monotonic() < deadline, f"Xvfb :{number} did not start"
        time.sleep(0.01)
    return xvfb, f":{number}"


def _direct_launch(display: str, sandboxed: bool) -> float:
    home = tempfile.mkdtemp(prefix="bench-chromium-")
    user_data_dir = os.path.join(home, "user-data")
    os.mkdir(user_data_dir)
    command = [CHROMIUM, *_chromium_flags(user_data_dir)]
    env = {**os.environ, "DISPLAY": display}
    if not sandboxed:
        command[1:1] = ["--no-sandbox", "--test-type"]
    else:
        env["HOME"] = home
        if os.geteuid() == 0:
            for path in (home, user_data_dir):
                os.chown(path, NOBODY, NOBODY)
            command[:0] = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    started = time.perf_counter()
    chromium = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert chromium.stderr is not None
        port = None
        for line in chromium.stderr:
            match = re.search(rb"DevTools listening on ws://127.0.0.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port, "Chromium did not announce DevTools"
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=1).read()
                return time.perf_counter() - started
            except OSError:
                time.sleep(0.005)
    finally:
        os.killpg(chromium.pid, 9)
        chromium.wait()
        shutil.rmtree(home, ignore_errors=True)


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    xvfb, display = _start_xvfb()
    try:
        headers = {"Authorization": f"Bearer {server.api_key}"}
        http = httpx.Client(base_url=server.base_url, headers=headers, timeout=60)
        ours, sandboxed, unsandboxed = [], [], []
        # One untimed round of each warms the page cache, as a service that has run before.
        rounds = [False] + [True] * RUNS
        for timed in rounds:
            started = time.perf_counter()
            response = http.post("/browsers", json={"viewport": {"width": VIEWPORT[0], "height": VIEWPORT[1]}})
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            http.delete(f"/browsers/{response.json()['session_id']}").raise_for_status()
            direct = (_direct_launch(display, sandboxed=True), _direct_launch(display, sandboxed=False))
            if timed:
                ours.append(elapsed)
                sandboxed.append(direct[0])
                unsandboxed.append(direct[1])
        report("cold POST /browsers until the response", ours,
               {"Chromium directly, as ours runs": sandboxed, "Chromium as root, no sandbox": unsandboxed})
    finally:
        xvfb.kill()
        xvfb.wait()
        server.reap_everything()
