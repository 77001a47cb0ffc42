"""`POST /browsers/{id}/process/exec` of `true` (until the answer) next to what it
cannot avoid: a local fork/exec of `true` plus one REST round trip to the same browser's
agent (a click), measured back to back in the same run. Goal: at most 1.5x."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from harness import ControlPlane
from scenarios import alternate, api_client, kept_alive

RUNS = 300
WARMUP = 20


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        http = api_client(server)
        session = http.post("/browsers", json={"viewport": {"width": 1280, "height": 800}}).raise_for_status().json()
        sid = session["session_id"]
        # One kept-alive connection with the standard library's client, as in `click`.
        connection, headers = kept_alive(server)

        def call(path: str, body: dict) -> float:
            started = time.perf_counter()
            connection.request("POST", f"/browsers/{sid}{path}", json.dumps(body), headers)
            response = connection.getresponse()
            answer = response.read()
            assert response.status == 200, (response.status, answer)
            return time.perf_counter() - started

        def exec_true() -> float:
            return call("/process/exec", {"command": "true"})

        def reference() -> float:
            started = time.perf_counter()
            subprocess.run(["true"], check=True)
            fork_exec = time.perf_counter() - started
            return fork_exec + call("/computer/click_mouse", {"x": 640, "y": 400})

        ours, references = alternate(exec_true, reference, RUNS, WARMUP)
        connection.close()
        report("process_exec: exec of `true` through the API", ours,
               {"fork/exec + REST click": references}, percentiles=(50, 99))
        http.delete(f"/browsers/{sid}").raise_for_status()
    finally:
        server.reap_everything()
