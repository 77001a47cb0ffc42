"""API throughput (`GET /browsers`) and create throughput (`POST /browsers`, headless)
with one control-plane replica and with two on the same PostgreSQL database, in the same
run; prints both and the ratio two/one. Clients spread their requests over the replicas
themselves (keep-alive connections to each), as a load balancer would.

Needs PostgreSQL: TEST_DATABASE_URL (deploy/test.sh's database) or its default.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

os.environ.setdefault("TEST_DATABASE_URL", "postgres://browser_test:browser_test@127.0.0.1:5432/browser_test")

from replicas_kit import Replicas  # noqa: E402

CLIENTS = 16
SECONDS = 6
CREATES = 8
CREATE_CONCURRENCY = 4


def _list_throughput(deployment: Replicas) -> float:
    bases = [f"http://127.0.0.1:{member.port}" for member in deployment.members]
    headers = {"Authorization": f"Bearer {deployment.api_key}"}
    done = [0] * CLIENTS
    deadline = time.monotonic() + SECONDS

    def client(index: int) -> None:
        sessions = [httpx.Client(base_url=base, headers=headers, timeout=30) for base in bases]
        turn = index
        while time.monotonic() < deadline:
            answer = sessions[turn % len(sessions)].get("/browsers")
            answer.raise_for_status()
            done[index] += 1
            turn += 1
        for session in sessions:
            session.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def _create_throughput(deployment: Replicas) -> float:
    bases = [f"http://127.0.0.1:{member.port}" for member in deployment.members]
    headers = {"Authorization": f"Bearer {deployment.api_key}"}

    def create(index: int) -> str:
        answer = httpx.post(f"{bases[index % len(bases)]}/browsers", headers=headers,
                            json={"headless": True}, timeout=120)
        answer.raise_for_status()
        return answer.json()["session_id"]

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=CREATE_CONCURRENCY) as workers:
        created = list(workers.map(create, range(CREATES)))
    elapsed = time.monotonic() - started
    for session_id in created:
        httpx.delete(f"{bases[0]}/browsers/{session_id}", headers=headers, timeout=60)
    return CREATES / elapsed


def run(work_dir: Path, report) -> None:
    results = {}
    for count in (1, 2):
        deployment = Replicas(work_dir / f"replicas-{count}" / "data", count=count,
                              extra_args=["--max-live-browsers", str(CREATES)]).start()
        try:
            # A few browsers make the list answer non-trivial.
            _create_throughput(deployment)
            results[count] = (_list_throughput(deployment), _create_throughput(deployment))
        finally:
            deployment.reap_everything()
    print(f"\n== replicas (GET /browsers by {CLIENTS} clients for {SECONDS} s; "
          f"{CREATES} headless creates, {CREATE_CONCURRENCY} at a time)")
    print(f"{'':34}{'GET /browsers':>16}{'POST /browsers':>16}")
    for count, (listed, created) in results.items():
        print(f"{f'{count} replica(s)':34}{listed:>12.0f}/s{created:>14.2f}/s")
    (one_list, one_create), (two_list, two_create) = results[1], results[2]
    print(f"{'ratio two/one':34}{two_list / one_list:>15.2f}x{two_create / one_create:>15.2f}x")
    print("(one 2-core host runs the replicas, PostgreSQL, the browsers and the clients)")
