"""Density: headful 1920x1080 browsers on an idle page, created one after another until
20 are live. Prints the memory (PSS, summed over every process of the VM: sandbox, agent,
Xvfb, Chromium, sound server) per browser VM next to a bare Xvfb + Chromium pair with the
same flags on the same page (20 of them, live together, measured the same way), and the
create latency as the host fills."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from harness import ControlPlane, descendants, processes_mentioning, serve_html
from scenarios import api_client

from .cold_create import VIEWPORT, _chromium_flags, _free_displays, _start_xvfb

BROWSERS = 20
SETTLE_SECONDS = 15
IDLE_PAGE = b"<!doctype html><title>idle</title><h1>An idle page</h1>"


def _pss_kib(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue  # gone meanwhile
    return total


def _vm_pids(server: ControlPlane, session_id: str) -> set[int]:
    holders = processes_mentioning(str(server.data_dir / "browsers" / session_id / "root"))
    return holders.union(*(descendants(pid) for pid in holders))


def _ours(work_dir: Path, page_url: str) -> tuple[list[float], list[float]]:
    server = ControlPlane(work_dir / "data", extra_args=["--max-live-browsers", str(BROWSERS)]).start()
    try:
        http = api_client(server, timeout=120)
        latencies, ids = [], []
        for _ in range(BROWSERS):
            started = time.perf_counter()
            response = http.post("/browsers", json={
                "viewport": {"width": VIEWPORT[0], "height": VIEWPORT[1]}, "start_url": page_url,
                "timeout_seconds": 3600})
            latencies.append(time.perf_counter() - started)
            response.raise_for_status()
            ids.append(response.json()["session_id"])
        time.sleep(SETTLE_SECONDS)
        memory = [_pss_kib(_vm_pids(server, sid)) / 1024 for sid in ids]
        return latencies, memory
    finally:
        server.reap_everything()


def _bare_pairs(page_url: str) -> list[float]:
    pairs = []
    try:
        for display in _free_displays(BROWSERS):
            xvfb, _ = _start_xvfb(display)
            profile = tempfile.mkdtemp(prefix="bench-density-")
            flags = [flag for flag in _chromium_flags(profile) if flag != "about:blank"]
            chromium = subprocess.Popen(["chromium", *flags, page_url], env={**os.environ, "DISPLAY": f":{display}"},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
            pairs.append((xvfb, chromium, profile))
            time.sleep(0.5)  # one at a time, as the service starts them
        time.sleep(SETTLE_SECONDS)
        return [_pss_kib({xvfb.pid, chromium.pid} | descendants(chromium.pid)) / 1024
                for xvfb, chromium, _ in pairs]
    finally:
        for xvfb, chromium, profile in pairs:
            os.killpg(chromium.pid, 9)
            chromium.wait()
            xvfb.kill()
            xvfb.wait()
            shutil.rmtree(profile, ignore_errors=True)


def run(work_dir: Path, report) -> None:
    server = serve_html(lambda path: IDLE_PAGE)
    page_url = f"http://127.0.0.1:{server.server_address[1]}/idle.html"
    try:
        latencies, ours = _ours(work_dir, page_url)
        bare = _bare_pairs(page_url)
    finally:
        server.shutdown()
    print(f"\n== density: {BROWSERS} headful {VIEWPORT[0]}x{VIEWPORT[1]} browsers on an idle page")
    print(f"{'PSS per browser':34}{'median':>12}{'max':>12}{'all':>12}")
    for label, samples in (("ours (whole VM)", ours), ("bare Xvfb + Chromium", bare)):
        print(f"{label:34}{statistics.median(samples):>9.1f}MiB{max(samples):>9.1f}MiB"
              f"{sum(samples) / 1024:>9.2f}GiB")
    print(f"{'ratio ours/bare':34}{statistics.median(ours) / statistics.median(bare):>11.2f}x"
          f"{max(ours) / max(bare):>11.2f}x{sum(ours) / sum(bare):>11.2f}x")
    print("goal: <= 1.1x the bare pair")
    fills = ", ".join(f"#{n}: {latencies[n - 1] * 1000:.0f} ms" for n in (1, 5, 10, 15, 20))
    print(f"cold create latency as the host fills: {fills}")
