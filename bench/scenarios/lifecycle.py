"""The full lifecycle of the public remote-browser benchmark (BrowserArena's
"hello-browser", `nottelabs/browserarena`): the official TypeScript SDK creates a browser,
`playwright-core` connects over CDP (`connectOverCDP`), takes the first page (or makes
one) and goes to a URL until DOMContentLoaded, and the SDK releases the browser
(`browsers.deleteByID`). 10 warm-up sessions, then timed ones, sequential and 10 at a
time, headless and headful, against a control plane with default settings; p50 and p95
of each stage and of the total. The page is served on this host's loopback, which the
browsers may reach (`--egress-allow 127.0.0.1`).

References in the same run: the same loop against a bare Chromium the script launches
itself (launch until its DevTools URL is printed, connect, goto, kill until it has
exited); for batches, ten bare Chromiums launched and settled before each batch is
timed (a perfect standby: what is timed is connect, goto and the kill); and the hosted
service's published p50 (BrowserArena, 2026-08-22, us-east-1,
example.com over the internet): create 24 ms, connect 164 ms, goto 242 ms, release 29 ms,
473 ms in all.

The benchmark throttles the hosted service to 10 sessions a minute (one every 6 s). We
start one session every 1.5 s (a quarter of that), and a batch of 10 every 6 s (ten
times the benchmark's rate): the default standby on this host (10 headless browsers, 1
headful; frozen while idle) is refilled between batches, at idle priority so that
the browsers in use, the service and the client go first. Headful batches outrun the
one headful standby browser: 9 of each batch start cold. Then, headless, two batches at
the benchmark's own pace (a minute apart), which find the standby full and frozen."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from harness import CHROMIUM, ControlPlane, serve_html

NODE_CLIENTS = Path(__file__).resolve().parents[2] / "tests" / "e2e" / "node-clients"
LOOP = NODE_CLIENTS / "hello_browser.mjs"
WARMUP = 10
RUNS_SEQUENTIAL = 30
BATCHES_CONCURRENT = 3
CONCURRENCY = 10
STAGES = ("create", "connect", "goto", "release")
HOSTED_P50 = {"create": 24, "connect": 164, "goto": 242, "release": 29, "total": 473}
PAGE = b"<!doctype html><title>hello</title><h1>hello, browser</h1>"
INTERVAL_MS = 1500
BATCH_INTERVAL_MS = 6000
# The public benchmark's pace: 10 sessions a minute, so a batch of ten a minute.
BENCHMARK_BATCH_INTERVAL_MS = 60000
BATCHES_PACED = 2
# How long the bare Chromiums of a batch reference settle after their launch.
PRELAUNCH_SETTLE_MS = 5000


def _loop(**options) -> list[dict]:
    finished = subprocess.run(["node", str(LOOP), json.dumps(options)], capture_output=True, text=True,
                              timeout=1800, cwd=NODE_CLIENTS)
    if finished.returncode != 0:
        raise RuntimeError(f"the loop failed: {finished.stderr[-2000:]}")
    return [json.loads(line) for line in finished.stdout.splitlines() if line.strip()]


def _percentile(values: list[float], p: int) -> float:
    ordered = sorted(values)
    if p == 50:
        return statistics.median(ordered)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def _summary(label: str, records: list[dict], reference: dict[str, float] | None = None) -> dict[str, float]:
    good = [r for r in records if r["ok"]]
    failures = [r["error"] for r in records if not r["ok"]]
    p50 = {}
    line = f"{label:44}"
    for stage in (*STAGES, "total"):
        values = [sum(r[f"{s}_ms"] for s in STAGES) if stage == "total" else r[f"{stage}_ms"] for r in good]
        if not values:
            continue
        p50[stage] = _percentile(values, 50)
        line += f" {stage} {p50[stage]:6.0f}/{_percentile(values, 95):<6.0f}"
    print(f"{line} ms (p50/p95), {len(good)} ok, {len(failures)} failed")
    for failure in failures[:3]:
        print(f"    failure: {failure}")
    if reference:
        ratios = "  ".join(f"{stage} {p50[stage] / reference[stage]:.2f}x" for stage in p50 if reference.get(stage))
        print(f"{'':44} ratio of p50: {ratios}")
    return p50


def run(work_dir: Path, report) -> None:
    page_server = serve_html(lambda path: PAGE)
    # A browser released right after DOMContentLoaded may leave a request half-read.
    page_server.handle_error = lambda request, client_address: None
    url = f"http://127.0.0.1:{page_server.server_address[1]}/"
    # Default settings, the default standby included (the test harness turns it off).
    server = ControlPlane(work_dir / "data", default_standby=True).start()
    try:
        print(f"\n== lifecycle (hello-browser: create, connectOverCDP, goto domcontentloaded, release); "
              f"{WARMUP} warm-up sessions, then {RUNS_SEQUENTIAL} sequential and "
              f"{BATCHES_CONCURRENT}x{CONCURRENCY} concurrent")
        bare = _summary("bare Chromium, headless, sequential",
                        _loop(target="bare", chromium=CHROMIUM, headless=True, url=url, warmup=3,
                              runs=RUNS_SEQUENTIAL, concurrency=1, intervalMs=INTERVAL_MS))
        prelaunched = _summary(f"bare, launched beforehand, {CONCURRENCY} at a time", _loop(
            target="prelaunched", chromium=CHROMIUM, headless=True, url=url, warmup=0,
            runs=BATCHES_CONCURRENT, concurrency=CONCURRENCY, intervalMs=0, settleMs=PRELAUNCH_SETTLE_MS))
        print(f"{'hosted service, published p50':44} " + "  ".join(
            f"{stage} {value} ms" for stage, value in HOSTED_P50.items()))
        results = {}
        for headless in (True, False):
            kind = "headless" if headless else "headful"
            common = dict(target="ours", baseURL=server.base_url, apiKey=server.api_key, url=url,
                          headless=headless, intervalMs=INTERVAL_MS)
            results[(kind, 1)] = _summary(f"ours, {kind}, sequential", _loop(
                **common, warmup=WARMUP, runs=RUNS_SEQUENTIAL, concurrency=1), HOSTED_P50)
            results[(kind, CONCURRENCY)] = _summary(f"ours, {kind}, {CONCURRENCY} at a time", _loop(
                **{**common, "intervalMs": BATCH_INTERVAL_MS}, warmup=0, runs=BATCHES_CONCURRENT,
                concurrency=CONCURRENCY), HOSTED_P50)
        # At the public benchmark's own pace (a batch a minute), the standby is full and
        # frozen when each batch comes.
        results["paced"] = _summary(
            f"ours, headless, {CONCURRENCY} at a time, 1 batch/min",
            _loop(target="ours", baseURL=server.base_url, apiKey=server.api_key, url=url, headless=True,
                  intervalMs=BENCHMARK_BATCH_INTERVAL_MS, warmup=0, runs=BATCHES_PACED,
                  concurrency=CONCURRENCY), prelaunched)
        sequential = results[("headless", 1)]
        print(f"ours/bare Chromium (p50 total, headless, sequential): "
              f"{sequential['total'] / bare['total']:.2f}x; headful/headless: "
              f"{results[('headful', 1)]['total'] / sequential['total']:.2f}x; "
              f"{CONCURRENCY} at a time, ours/launched beforehand: "
              f"{results[('headless', CONCURRENCY)]['total'] / prelaunched['total']:.2f}x "
              f"(a batch a minute: {results['paced']['total'] / prelaunched['total']:.2f}x)")
        print("goal (issue 39): sequential headless p50 total <= 150 ms (create <= 10, connect <= 60, "
              "release <= 15); 10 at a time <= 400 ms without failures; headful within 1.2x of headless")
    finally:
        server.reap_everything()
        page_server.shutdown()
