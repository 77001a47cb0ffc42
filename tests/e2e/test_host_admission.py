"""Host admission: a deployment never runs more browser VMs than `--capacity-browsers`,
whichever organizations ask, through creates, pools or standby browsers, on one replica
or two. A create beyond it waits for room (an idle standby browser makes room), then gets
429 with `Retry-After`, which the SDKs retry; pools fill below it, fairly between
organizations, and fill again when room frees up."""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time

import httpx
import pytest
from kernel import Kernel

from harness import ControlPlane, descendants, idle_pool_browsers, processes_mentioning, wait_until
from replicas_kit import Replicas
from sdk import once

CAPACITY = 3
METRICS_TOKEN = "metrics"
# How long a create waits for room on the small host.
WAIT = 6


# The kernel's flag of a process on its way out (killed, freeing its memory).
PF_EXITING = 0x4


def runs_code(pid: int) -> bool:
    """Whether a process can still run code: not stopped (a VM being taken apart is
    stopped first, and killed while stopped), not exiting and not a zombie."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] not in ("T", "t", "Z", "X") and not int(fields[6]) & PF_EXITING


def running_vms(data_dir) -> set[str]:
    """Sessions whose VM runs code on this host: a process below its sandbox (the
    bubblewrap processes, whose command lines name the browser's directory) that is not
    bubblewrap itself (continued to reap the VM as it dies) and runs."""
    root = f"{data_dir}/browsers/"
    sandboxes: dict[str, list[int]] = {}
    for pid in processes_mentioning(root):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        match = re.search(re.escape(root) + r"([^/ ]+)/", cmdline)
        if match:
            sandboxes.setdefault(match.group(1), []).append(pid)
    return {
        session for session, pids in sandboxes.items()
        if any(runs_code(below) and _command(below) not in ("bwrap", None) for below in descendants(*pids))
    }


def _command(pid: int) -> str | None:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return None


class VmSampler:
    """Counts the running VMs of a data directory every 50 ms; `most` is the highest."""

    def __init__(self, data_dir) -> None:
        self.data_dir = data_dir
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, len(running_vms(self.data_dir)))
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


def create(server, key: str, headless: bool = True) -> httpx.Response:
    return httpx.post(f"{server.base_url}/browsers", headers={"Authorization": f"Bearer {key}"},
                      json={"headless": headless}, timeout=120)


def readiness(server) -> dict:
    return httpx.get(f"{server.base_url}/readyz", timeout=10).json()["admission"]


@pytest.fixture
def small_host(tmp_path):
    server = ControlPlane(tmp_path / "data", extra_args=[
        "--capacity-browsers", str(CAPACITY), "--admission-wait-seconds", str(WAIT),
        "--metrics-token", METRICS_TOKEN]).start()
    yield server
    server.reap_everything()


def test_creates_past_capacity_wait_for_room_then_get_429_and_the_sdk_retries(small_host):
    server = small_host
    sampler = VmSampler(server.data_dir)
    mine, theirs = server.api_key, server.create_api_key("org-admission-b")
    live = [create(server, key) for key in (mine, mine, theirs)]
    assert [answer.status_code for answer in live] == [200] * 3, [a.text for a in live]
    assert readiness(server) == {"capacity_browsers": CAPACITY, "queued_creates": 0}

    # Full: a create waits for room, then is refused in the Error shape.
    started = time.monotonic()
    refused = create(server, theirs)
    waited = time.monotonic() - started
    assert refused.status_code == 429 and refused.json()["code"] == "limit_reached", refused.text
    assert "room" in refused.json()["message"] and int(refused.headers["retry-after"]) >= 1
    assert WAIT - 0.5 <= waited < WAIT + 10, waited

    # A create that waits is admitted as soon as a browser ends; meanwhile the queue shows.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as worker:
        waiting = worker.submit(create, server, theirs)
        assert wait_until(lambda: readiness(server)["queued_creates"] == 1, 2, interval=0.05)
        metrics = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
        assert re.search(r"^browser_service_admission_queue 1$", metrics, re.M), metrics
        client = Kernel(api_key=mine, base_url=server.base_url, max_retries=0)
        client.browsers.delete_by_id(live[0].json()["session_id"])
        admitted = waiting.result()
        assert admitted.status_code == 200, admitted.text
    live[0] = admitted
    assert readiness(server)["queued_creates"] == 0
    assert re.search(r"^browser_service_admission_refusals_total 1$",
                     httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text,
                     re.M)

    # The SDK's own retries (it honours Retry-After) get a browser once one ends later
    # than the wait.
    patient = Kernel(api_key=theirs, base_url=server.base_url, max_retries=2)
    timer = threading.Timer(WAIT + 1, lambda: Kernel(api_key=mine, base_url=server.base_url).browsers
                            .delete_by_id(live[1].json()["session_id"]))
    timer.start()
    try:
        retried = patient.browsers.create(headless=True)
    finally:
        timer.join()
    assert retried.session_id

    assert sampler.stop() <= CAPACITY
    assert len(running_vms(server.data_dir)) == CAPACITY


@once
def test_pools_fill_below_capacity_fairly_and_again_when_room_frees(small_host):
    server = small_host
    sampler = VmSampler(server.data_dir)
    third = server.create_api_key("org-admission-c")
    held = [create(server, third).json()["session_id"] for _ in range(CAPACITY)]
    pools = {}
    for org in ("org-admission-pool-a", "org-admission-pool-b"):
        client = Kernel(api_key=server.create_api_key(org), base_url=server.base_url, max_retries=0)
        pools[org] = (client, client.browser_pools.create(size=2, headless=True, fill_rate_per_minute=6000))
    available = lambda: {org: client.browser_pools.retrieve(pool.id).available_count  # noqa: E731
                         for org, (client, pool) in pools.items()}
    # No room: nothing fills.
    time.sleep(3)
    assert available() == {"org-admission-pool-a": 0, "org-admission-pool-b": 0}

    # Room for three: each organization gets one before either gets a second.
    third_client = Kernel(api_key=third, base_url=server.base_url, max_retries=0)
    for session_id in held:
        third_client.browsers.delete_by_id(session_id)
    assert wait_until(lambda: sum(available().values()) == CAPACITY, 60, interval=0.25), available()
    assert sorted(available().values()) == [1, 2]

    # A create of the third organization now waits and is refused; the pools keep theirs.
    assert create(server, third).status_code == 429
    # Room again (the full pool goes): the one still short fills up.
    full = next(org for org, count in available().items() if count == 2)
    short = next(org for org in pools if org != full)
    client, pool = pools.pop(full)
    client.browser_pools.delete(pool.id, force=True)
    assert wait_until(lambda: available()[short] == 2, 60, interval=0.25), available()
    client, pool = pools[short]
    client.browser_pools.delete(pool.id, force=True)
    assert wait_until(lambda: not running_vms(server.data_dir), 30)
    assert sampler.stop() <= CAPACITY


@once
def test_two_replicas_never_admit_more_than_the_capacity_together(tmp_path):
    deployment = Replicas(tmp_path / "data", extra_args=[
        "--capacity-browsers", str(CAPACITY), "--admission-wait-seconds", "0"]).start()
    try:
        keys = [deployment.api_key, deployment.create_api_key("org-admission-replicas")]
        ports = [member.port for member in deployment.members]

        def attempt(index: int) -> httpx.Response:
            return httpx.post(f"http://127.0.0.1:{ports[index % 2]}/browsers",
                              headers={"Authorization": f"Bearer {keys[index // 2 % 2]}"},
                              json={"headless": True}, timeout=120)

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as workers:
            answers = list(workers.map(attempt, range(8)))
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [200] * CAPACITY + [429] * (8 - CAPACITY), [(a.status_code, a.text) for a in answers]
        assert len(running_vms(deployment.data_dir)) == CAPACITY
    finally:
        deployment.reap_everything()


@once
def test_an_idle_standby_browser_makes_room_for_a_create(tmp_path):
    server = ControlPlane(tmp_path / "data", extra_args=[
        "--capacity-browsers", "2", "--admission-wait-seconds", "30",
        "--standby-browsers", "0", "--standby-headless-browsers", "1", "--metrics-token", METRICS_TOKEN]).start()
    try:
        # Started and ready (a launch that fails is taken apart and made again).
        assert wait_until(lambda: idle_pool_browsers(server, METRICS_TOKEN) == 1, 60, interval=0.25)
        [standby] = running_vms(server.data_dir)
        # Headful creates cannot take the headless standby browser's place: the first
        # starts a VM beside it, the second ends it to make room, without waiting.
        first = create(server, server.api_key, headless=False)
        assert first.status_code == 200, first.text
        started = time.monotonic()
        second = create(server, server.api_key, headless=False)
        assert second.status_code == 200, second.text
        assert time.monotonic() - started < 15
        ours = {first.json()["session_id"], second.json()["session_id"]}
        assert wait_until(lambda: running_vms(server.data_dir) == ours, 10), running_vms(server.data_dir)
        # Not refilled while the host is full; refilled once room frees up.
        time.sleep(2)
        assert running_vms(server.data_dir) == ours
        Kernel(api_key=server.api_key, base_url=server.base_url).browsers.delete_by_id(first.json()["session_id"])
        assert wait_until(lambda: len(running_vms(server.data_dir) - ours) == 1, 60, interval=0.25)
        assert standby not in running_vms(server.data_dir)
    finally:
        server.reap_everything()
