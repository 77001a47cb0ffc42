"""`POST /browsers/{id}/extensions` with one extension (upload, unpack, Chromium restart,
DevTools ready) until the answer, next to a plain cold launch of the same Chromium on a
running Xvfb until DevTools answers. Goal: ≤ 1.5 s p50."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from harness import ControlPlane
from scenarios import api_client

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "e2e"))
from extensions_kit import make_extension  # noqa: E402
from scenarios.cold_create import _direct_launch, _start_xvfb  # noqa: E402

RUNS = 10


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    xvfb, display = _start_xvfb()
    try:
        http = api_client(server, timeout=120)
        sid = http.post("/browsers", json={"timeout_seconds": 600}).raise_for_status().json()["session_id"]
        archive = make_extension("bench")
        ours, reference = [], []
        for _ in range(RUNS):
            started = time.perf_counter()
            http.post(f"/browsers/{sid}/extensions", files=[
                ("extensions[][name]", (None, "bench")),
                ("extensions[][zip_file]", ("bench.zip", archive, "application/zip")),
            ]).raise_for_status()
            ours.append(time.perf_counter() - started)
            reference.append(_direct_launch(display))
        report("load_extensions until the answer", ours, {"Chromium cold launch": reference})
        http.delete(f"/browsers/{sid}").raise_for_status()
    finally:
        xvfb.kill()
        xvfb.wait()
        server.reap_everything()
