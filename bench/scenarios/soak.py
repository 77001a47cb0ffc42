"""Soak and faults (issue 41), run only when named: `bench/run.sh soak`.

Two control-plane replicas on PostgreSQL behind the test load balancer, sized for 12
browsers, under a mixed load of API clients for SOAK_MINUTES (default 20) while a fault
schedule runs every SOAK_FAULT_EVERY seconds (default 60), in turn:
- kill -9 of a browser's agent, then of a browser's Chromium (the browser that takes it
  is the faulted one: it may be lost; no other may);
- a VM's disk filled, then its memory exhausted (the browser must stay reachable, or end
  cleanly: the host must not be hurt);
- kill -9 of one replica (restarted 10 s later: the other serves its browsers
  meanwhile), then a PostgreSQL restart: 5xx are allowed for FAILOVER seconds after each.

The load, SOAK_WORKERS threads (default 4) each picking in turn: a browser's life (create,
Playwright, a command, a file written and read back, delete); a recording with sound
(started, stopped, downloaded, checked with ffprobe); a pool lease (acquire, Playwright,
release).

Prints: requests by outcome (a 5xx in a failover window, or from a VM the schedule had
hurt, is marked so; any other is listed), p50/p99 per operation per minute, sessions
lost outside faulted VMs, recordings that do not play, and the surviving replica's RSS,
file descriptors, threads, database connections, the data directory's size and the VM
processes on the host: once started, at the start of the load (after one of each kind of
work and one of each fault, uncounted, have brought the process to its working size) and
90 s after it stopped (once the database connections the load opened have been idle long
enough to be closed).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

os.environ.setdefault("TEST_DATABASE_URL", "postgres://browser_test:browser_test@127.0.0.1:5432/browser_test")

from harness import processes_mentioning, session_processes  # noqa: E402
from replicas_kit import METRICS_TOKEN, Replicas  # noqa: E402

ON_REQUEST = True
MINUTES = float(os.environ.get("SOAK_MINUTES", "20"))
WORKERS = int(os.environ.get("SOAK_WORKERS", "4"))
FAULT_EVERY = float(os.environ.get("SOAK_FAULT_EVERY", "60"))
FAILOVER = 20.0
CAPACITY = 12
# Seconds between the end of the load and the last measurement: a pooled database
# connection idle for 60 s is closed, looked for every 15 s.
IDLE_AFTER_LOAD = 90


class Ledger:
    """What the clients saw: each request's operation, minute, status and latency."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # op, minute, status, ms, at, the browser it was about (None: no one browser)
        self.requests: list[tuple[str, int, int, float, float, str | None]] = []
        self.failover: list[tuple[float, float]] = []
        self.faulted: dict[str, float] = {}  # session id → when the fault schedule hurt it
        self.lost: list[tuple[str, str]] = []
        self.unplayable: list[str] = []
        self.started = time.monotonic()

    def note(self, op: str, status: int, ms: float, session_id: str | None) -> None:
        now = time.monotonic()
        with self.lock:
            self.requests.append((op, int((now - self.started) // 60), status, ms, now, session_id))

    def in_failover(self, at: float) -> bool:
        return any(start <= at <= end for start, end in self.failover)

    def hurt(self, session_id: str | None, at: float) -> bool:
        """Whether the answer came from a VM the fault schedule had hurt by then (its agent or
        Chromium killed, its disk or memory filled): a 5xx there is the fault's, not a defect."""
        return session_id is not None and self.faulted.get(session_id, float("inf")) <= at


class Client:
    def __init__(self, base: str, key: str, ledger: Ledger) -> None:
        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)
        self.ledger = ledger

    def call(self, op: str, method: str, path: str, **kwargs) -> httpx.Response:
        started = time.monotonic()
        try:
            answer = self.http.request(method, path, **kwargs)
            status = answer.status_code
        except httpx.HTTPError:
            answer, status = None, 599
        browser = re.match(r"/browsers/([^/]+)", path)
        session_id = browser[1] if browser else (kwargs.get("json") or {}).get("session_id")
        self.ledger.note(op, status, (time.monotonic() - started) * 1000, session_id)
        if answer is None:
            raise RuntimeError(f"{op}: no answer")
        return answer


def _lost_unless_faulted(ledger: Ledger, session_id: str, answer: httpx.Response, step: str) -> bool:
    """A browser that stopped answering (404, 5xx) outside a fault of its own is lost."""
    if answer.status_code < 400 or answer.status_code == 429:
        return False
    if session_id not in ledger.faulted and not ledger.in_failover(time.monotonic()):
        with ledger.lock:
            ledger.lost.append((session_id, f"{step}: {answer.status_code} {answer.text[:200]}"))
    return True


@contextlib.contextmanager
def a_browser(client: Client, live: dict, headless: bool):
    """A browser of this client's for the block (`None` if the create was refused),
    offered to the fault schedule while in use and deleted after."""
    made = client.call("create", "POST", "/browsers", json={"headless": headless, "timeout_seconds": 300})
    if made.status_code != 200:
        yield None
        return
    sid = made.json()["session_id"]
    live[sid] = threading.current_thread().name
    try:
        yield sid
    finally:
        live.pop(sid, None)
        client.call("delete", "DELETE", f"/browsers/{sid}")


def browser_life(client: Client, ledger: Ledger, live: dict) -> None:
    with a_browser(client, live, headless=True) as sid:
        if sid is None:
            return
        steps = [
            ("playwright", "POST", f"/browsers/{sid}/playwright/execute",
             {"json": {"code": "await page.setContent('<h1>soak</h1>'); return await page.locator('h1').innerText();"}}),
            ("exec", "POST", f"/browsers/{sid}/process/exec", {"json": {"command": "sh", "args": ["-c", "echo soak"]}}),
            ("fs_write", "PUT", f"/browsers/{sid}/fs/write_file", {"params": {"path": "/tmp/soak.bin"},
                                                                 "content": os.urandom(256 * 1024)}),
            ("fs_read", "GET", f"/browsers/{sid}/fs/read_file", {"params": {"path": "/tmp/soak.bin"}}),
        ]
        for op, method, path, kwargs in steps:
            answer = client.call(op, method, path, **kwargs)
            if _lost_unless_faulted(ledger, sid, answer, op):
                return
            time.sleep(random.uniform(0.2, 1.5))


def recording(client: Client, ledger: Ledger, live: dict, work: Path) -> None:
    with a_browser(client, live, headless=False) as sid:
        if sid is None:
            return
        started = client.call("replay_start", "POST", f"/browsers/{sid}/replays", json={"record_audio": True})
        if _lost_unless_faulted(ledger, sid, started, "replay_start"):
            return
        replay = started.json()["replay_id"]
        time.sleep(random.uniform(2, 5))
        stopped = client.call("replay_stop", "POST", f"/browsers/{sid}/replays/{replay}/stop")
        if _lost_unless_faulted(ledger, sid, stopped, "replay_stop"):
            return
        for _ in range(240):
            video = client.call("replay_download", "GET", f"/browsers/{sid}/replays/{replay}")
            if video.status_code != 409:
                break
            time.sleep(0.5)
        if _lost_unless_faulted(ledger, sid, video, "replay_download"):
            return
        path = work / f"{replay}.mp4"
        path.write_bytes(video.content)
        probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0",
                                str(path)], capture_output=True, text=True)
        if probe.returncode != 0 or not probe.stdout.strip() or float(probe.stdout) < 1:
            with ledger.lock:
                ledger.unplayable.append(f"{replay}: {probe.stderr.strip()[:200] or probe.stdout.strip()}")
        path.unlink(missing_ok=True)


def pool_lease(client: Client, ledger: Ledger, live: dict, pool_id: str) -> None:
    leased = client.call("acquire", "POST", f"/browser_pools/{pool_id}/acquire", json={"acquire_timeout_seconds": 20})
    if leased.status_code != 200:
        return
    sid = leased.json()["session_id"]
    live[sid] = threading.current_thread().name
    try:
        answer = client.call("playwright", "POST", f"/browsers/{sid}/playwright/execute",
                             json={"code": "return 1 + 1;"})
        _lost_unless_faulted(ledger, sid, answer, "pool playwright")
    finally:
        live.pop(sid, None)
        client.call("release", "POST", f"/browser_pools/{pool_id}/release", json={"session_id": sid, "reuse": True})


def faults(deployment: Replicas, ledger: Ledger, live: dict, client: Client, deadline: float, log: list) -> None:
    kinds = itertools.cycle(["agent", "chromium", "disk", "memory", "replica", "postgres"])
    while time.monotonic() + FAULT_EVERY < deadline:
        time.sleep(FAULT_EVERY)
        kind = next(kinds)
        try:
            fault(kind, deployment, ledger, live, client, log)
        except Exception as error:  # noqa: BLE001 (the schedule goes on)
            log.append(f"{time.monotonic() - ledger.started:6.0f}s {kind}: the fault failed: {error!r}")


def fault(kind: str, deployment: Replicas, ledger: Ledger, live: dict, client: Client, log: list) -> None:
    """One fault of the schedule, on a browser some client is using (if there is one)."""
    at = time.monotonic() - ledger.started
    victims = list(live.copy())
    if kind in ("agent", "chromium", "disk", "memory"):
        if not victims:
            log.append(f"{at:6.0f}s {kind}: no live browser to fault")
            return
        sid = random.choice(victims)
        ledger.faulted[sid] = time.monotonic()
        if kind in ("agent", "chromium"):
            pids = session_processes(deployment, sid)[kind]
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            log.append(f"{at:6.0f}s kill -9 {kind} of {sid} ({len(pids)} processes)")
        elif kind == "disk":
            answer = client.call("fault", "POST", f"/browsers/{sid}/process/exec", json={
                "command": "sh", "args": ["-c", "dd if=/dev/zero of=/home/kernel/fill bs=1M 2>&1 | tail -1"],
                "timeout_sec": 60})
            log.append(f"{at:6.0f}s filled the disk of {sid}: {answer.status_code}")
        else:
            answer = client.call("fault", "POST", f"/browsers/{sid}/process/exec", json={
                "command": "sh", "args": ["-c", "head -c 64G /dev/zero | tail > /dev/null; echo $?"],
                "timeout_sec": 60})
            log.append(f"{at:6.0f}s exhausted the memory of {sid}: {answer.status_code}")
    elif kind == "replica":
        ledger.failover.append((time.monotonic(), time.monotonic() + FAILOVER + 10))
        deployment.kill(deployment.members[1])
        log.append(f"{at:6.0f}s kill -9 of replica-1")
        time.sleep(10)
        deployment.start()
    else:
        ledger.failover.append((time.monotonic(), time.monotonic() + FAILOVER))
        restarted = subprocess.run(["pg_ctlcluster", "15", "main", "restart"], capture_output=True, text=True)
        log.append(f"{at:6.0f}s PostgreSQL restarted ({restarted.returncode})")


def warm_up_faults(deployment: Replicas, warm_up: Client) -> None:
    """One of each fault of the schedule before the load, each VM fault on a browser of its
    own: recovering from them (salvaging a recording, adopting a replica's browsers,
    reconnecting to the database) runs code that reads its pages of the binary in, as
    the warm-up's work does."""
    for kind in ("agent", "chromium", "disk", "memory"):
        with a_browser(warm_up, live := {}, headless=True) as sid:
            if sid is not None:
                fault(kind, deployment, warm_up.ledger, live, warm_up, [])
    for kind in ("replica", "postgres"):
        fault(kind, deployment, warm_up.ledger, {}, warm_up, [])
        time.sleep(5)  # the database back before the next


def resources(deployment: Replicas) -> dict[str, float]:
    member = deployment.members[0]
    pid = member.process.pid
    status = Path(f"/proc/{pid}/status").read_text()
    field = lambda name: int(next(line.split()[1] for line in status.splitlines() if line.startswith(name)))  # noqa: E731
    connections = subprocess.run(["psql", deployment.database_url, "-At", "-c",
                                  "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"],
                                 capture_output=True, text=True).stdout.strip()
    size = subprocess.run(["du", "-sm", str(deployment.data_dir)], capture_output=True, text=True).stdout.split()
    return {
        "RSS MiB": field("VmRSS:") / 1024,
        # What the process holds (heap, stacks) apart from the pages of its binary and
        # libraries it has read, which grow as more of its code runs and which the
        # kernel may drop and read again.
        "  anonymous MiB": field("RssAnon:") / 1024,
        "  file MiB": field("RssFile:") / 1024,
        # The allocator's count: live data, apart from the free memory it keeps.
        "heap in use MiB": _metric(member, "heap_in_use_bytes") / 2**20,
        "heap held MiB": _metric(member, "heap_held_bytes") / 2**20,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": field("Threads:"),
        "db connections": int(connections or 0),
        "data dir MiB": int(size[0]) if size else 0,
        "VM processes": len(processes_mentioning(f"{deployment.data_dir}/")),
    }


def _metric(member, name: str) -> float:
    """A value of the replica's own /metrics (0 where it has none)."""
    text = httpx.get(f"http://127.0.0.1:{member.port}/metrics",
                     headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30).text
    found = re.search(rf"^browser_service_{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * len(ordered))))]


def run(work_dir: Path, report) -> None:
    deployment = Replicas(work_dir / "data", extra_args=[
        "--capacity-browsers", str(CAPACITY), "--max-live-browsers", "20", "--vm-disk-gib", "1"]).start()
    ledger, live, log = Ledger(), {}, []
    client = Client(deployment.base_url, deployment.api_key, ledger)
    try:
        pool = client.call("setup", "POST", "/browser_pools", json={"size": 2, "headless": True}).json()["id"]
        time.sleep(10)
        started_up = resources(deployment)
        media = Path(tempfile.mkdtemp(prefix="soak-media-", dir=work_dir))
        # One of each kind of work first (not counted): the first run of a code path reads
        # its pages of the binary in and fills lasting caches (TLS, statements, a worker
        # thread's stack). Growth is measured from there, apart from start-up's.
        warm_up = Client(deployment.base_url, deployment.api_key, Ledger())
        browser_life(warm_up, warm_up.ledger, {})
        recording(warm_up, warm_up.ledger, {}, media)
        pool_lease(warm_up, warm_up.ledger, {}, pool)
        warm_up_faults(deployment, warm_up)
        warm_up.http.close()
        time.sleep(10)
        before = resources(deployment)
        ledger.started = time.monotonic()
        deadline = ledger.started + MINUTES * 60

        def worker(index: int) -> None:
            mine = Client(deployment.base_url, deployment.api_key, ledger)
            for turn in itertools.count(index):
                if time.monotonic() >= deadline:
                    mine.http.close()
                    return
                try:
                    [lambda: browser_life(mine, ledger, live), lambda: recording(mine, ledger, live, media),
                     lambda: pool_lease(mine, ledger, live, pool)][turn % 3]()
                except Exception as error:  # noqa: BLE001 (a failed step is counted, the load goes on)
                    log.append(f"worker {index}: {error}")
                    time.sleep(1)

        threads = [threading.Thread(target=worker, args=(i,), name=f"worker-{i}") for i in range(WORKERS)]
        threads.append(threading.Thread(target=faults, args=(deployment, ledger, live, client, deadline, log)))
        print(f"\n== soak: {MINUTES:g} minutes, {WORKERS} clients, a fault every {FAULT_EVERY:g} s, "
              f"two replicas sized for {CAPACITY} browsers")
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        client.call("setup", "DELETE", f"/browser_pools/{pool}", params={"force": "true"})
        time.sleep(IDLE_AFTER_LOAD)
        after = resources(deployment)

        for line in log:
            print(f"  {line}")
        outcomes, unexplained = collections.Counter(), collections.Counter()
        for op, _, status, _, at, session_id in ledger.requests:
            if op == "fault":  # the fault schedule's own calls into a VM it is hurting
                continue
            kind = f"{status // 100}xx" if status != 599 else "no answer"
            if status >= 500 and ledger.in_failover(at):
                kind += " (failover)"
            elif status >= 500 and ledger.hurt(session_id, at):
                kind += " (faulted VM)"
            elif status >= 500:
                unexplained[(op, status)] += 1
            outcomes[kind] += 1
        print("requests by outcome: " + ", ".join(f"{kind} {count}" for kind, count in sorted(outcomes.items())))
        if unexplained:
            print("  5xx outside failover: " + ", ".join(f"{op} {status} x{count}"
                                                     for (op, status), count in unexplained.items()))
        by_op = collections.defaultdict(list)
        for op, minute, status, ms, _, _ in ledger.requests:
            if status < 400:
                by_op[(op, minute)].append(ms)
        print("p50/p99 ms per operation per minute:")
        for op in sorted({op for op, _ in by_op}):
            cells = [f"{minute}: {_percentile(v, 50):.0f}/{_percentile(v, 99):.0f}"
                     for (name, minute), v in sorted(by_op.items()) if name == op]
            print(f"  {op:16} " + "  ".join(cells))
        print(f"sessions lost outside faulted VMs: {len(ledger.lost)}")
        for session_id, why in ledger.lost[:5]:
            print(f"    {session_id}: {why}")
        print(f"recordings that do not play: {len(ledger.unplayable)}")
        for why in ledger.unplayable[:5]:
            print(f"    {why}")
        print(f"replica-0 once started, after one of each kind of work and of fault (the start of the load), "
              f"and {IDLE_AFTER_LOAD} s after the load stopped; growth from the start of the load:")
        for name in before:
            grown = (after[name] - before[name]) / before[name] * 100 if before[name] else 0.0
            print(f"  {name:16} {started_up[name]:10.1f} {before[name]:10.1f} {after[name]:10.1f}   {grown:+.0f} %")
        print("goals (issue 41): 0 sessions lost outside faulted VMs, 0 unplayable recordings, "
              "0 5xx outside failover, RSS/fds/threads within 10 % of the start")
    finally:
        deployment.reap_everything()
