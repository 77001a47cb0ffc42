"""`POST /browsers/{id}/process/exec` of `true` (until the answer) next to what it
cannot avoid: a local fork/exec of `true` plus one REST round trip to the same browser's
agent (a click), measured back to back in the same run. Goal: at most 1.5x."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from scenarios import alternate, one_browser

RUNS = 300
WARMUP = 20


def run(work_dir: Path, report) -> None:
    # One kept-alive connection with the standard library's client, as in `click`.
    with one_browser(work_dir, {"viewport": {"width": 1280, "height": 800}}) as (session, connection, headers):
        sid = session["session_id"]

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
        report("process_exec: exec of `true` through the API", ours,
               {"fork/exec + REST click": references}, percentiles=(50, 99))
