"""What an API key's policy costs: `GET /browsers` throughput with a key that has a
policy (ten statements, the matching one last) against the same control plane and the
same browsers with an unrestricted key, taking turns batch by batch so both see the same
moments of the machine. Each sample is the time 8 concurrent clients take for 25
requests each.

Goal (issue 23): the policy check adds at most 5 % to `GET /browsers`."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from harness import ControlPlane
from scenarios import api_client

BATCHES = 40
WARMUP = 3
CLIENTS = 8
REQUESTS_PER_CLIENT = 25
BROWSERS = 2

# Statements a real scoped key might carry; only the last allows listing browsers.
POLICY = {"statements": [
    *({"action": f"{kind}:read", "resource": f"projects/*/{kind}/*"}
      for kind in ("profiles", "proxies", "extensions", "credentials", "browser_pools",
                   "deployments", "apps", "invocations", "auth_connections")),
    {"action": "browsers:use", "resource": "projects/*/browsers/*"},
]}


def _batch(clients: list[httpx.Client]) -> float:
    def hammer(client: httpx.Client) -> None:
        for _ in range(REQUESTS_PER_CLIENT):
            client.get("/browsers").raise_for_status()

    started = time.perf_counter()
    with ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(hammer, clients))
    return time.perf_counter() - started


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        admin = api_client(server)
        scoped_key = admin.post("/org/api_keys", json={"name": "bench", "policy": POLICY}).raise_for_status().json()["key"]
        sessions = [admin.post("/browsers", json={"headless": True}).raise_for_status().json()
                    for _ in range(BROWSERS)]

        def clients(key: str) -> list[httpx.Client]:
            return [httpx.Client(base_url=server.base_url, timeout=60,
                                 headers={"Authorization": f"Bearer {key}"}) for _ in range(CLIENTS)]

        keys = {"policy": clients(scoped_key), "none": clients(server.api_key)}
        for _ in range(WARMUP):
            for group in keys.values():
                _batch(group)
        samples = {"policy": [], "none": []}
        for index in range(BATCHES):
            order = ("policy", "none") if index % 2 == 0 else ("none", "policy")
            for name in order:
                samples[name].append(_batch(keys[name]))
        report(f"policy_overhead: {CLIENTS * REQUESTS_PER_CLIENT} x GET /browsers with a 10-statement policy",
               samples["policy"], {"the same with an unrestricted key": samples["none"]})
        per_second = CLIENTS * REQUESTS_PER_CLIENT / (sum(samples["policy"]) / len(samples["policy"]))
        print(f"policy_overhead: {per_second:.0f} requests/s with the policy")
        print("goal (issue 23): the policy check adds at most 5 % to GET /browsers")
        for session in sessions:
            admin.delete(f"/browsers/{session['session_id']}")
    finally:
        server.reap_everything()
