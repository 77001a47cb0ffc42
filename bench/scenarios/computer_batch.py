"""A `computer/batch` of 20 clicks through the REST API (until the answer), next to what
the same clicks cost without batching's help: one REST click (the API's own overhead,
paid once) plus 20 clicks by an in-process enigo on the same display (the agent's own
library, no API), measured one by one (the issue's reference; goal: at most 1.2x) and
back to back in one go (what the display itself makes 20 quick clicks cost)."""

from __future__ import annotations

import json
import subprocess
import time

from harness import REPO, ControlPlane
from scenarios import api_client, kept_alive, rotate_in_blocks
from scenarios.click import X, Y, _into_network_of, headful_browser

CLICKS = 20
RUNS = 200
WARMUP = 10
BLOCK = 10


def run(work_dir, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        http = api_client(server)
        sid, xvfb, display = headful_browser(server, http)
        connection, headers = kept_alive(server)
        click = {"type": "click_mouse", "click_mouse": {"x": X, "y": Y}}
        batch_body = json.dumps({"actions": [click] * CLICKS})
        click_body = json.dumps({"x": X, "y": Y})
        example = REPO / "target" / "release" / "examples" / "click_latency"
        enigo = subprocess.Popen([*_into_network_of(xvfb), str(example), display, str(X), str(Y)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

        def post(path: str, body: str) -> float:
            started = time.perf_counter()
            connection.request("POST", f"/browsers/{sid}/computer/{path}", body, headers)
            response = connection.getresponse()
            response.read()
            assert response.status == 200, (response.status, path)
            return time.perf_counter() - started

        def enigo_clicks(count: int) -> float:
            enigo.stdin.write(f"{count}\n")
            return int(enigo.stdout.readline()) / 1_000_000

        def batched() -> float:
            return post("batch", batch_body)

        def one_by_one() -> float:
            return post("click_mouse", click_body) + sum(enigo_clicks(1) for _ in range(CLICKS))

        def back_to_back() -> float:
            return post("click_mouse", click_body) + enigo_clicks(CLICKS)

        ours, separately, together = rotate_in_blocks([batched, one_by_one, back_to_back], RUNS, WARMUP, BLOCK)
        enigo.stdin.close()
        enigo.wait()
        connection.close()
        report(f"computer/batch of {CLICKS} clicks", ours,
               {f"1 REST click + {CLICKS} in-process clicks": separately,
                f"1 REST click + {CLICKS} back to back": together},
               percentiles=(50, 90))
        http.delete(f"/browsers/{sid}").raise_for_status()
    finally:
        server.reap_everything()
