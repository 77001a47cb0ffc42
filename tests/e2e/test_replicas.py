"""Two control-plane replicas on one PostgreSQL database behind a load balancer that
alternates requests: concurrent acquires spread over both, the live-browser limit and
/metrics across replicas, and kill -9 of one replica during an open CDP connection,
during pool filling and during a managed-auth flow (the survivor takes over within
10 s, nothing is lost, no health check runs twice)."""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import time
from datetime import datetime

import httpx
import pytest
from kernel import Kernel

from conftest import TEST_PAGE_TITLE
from harness import is_alive, read_page, session_processes, wait_until
from replicas_kit import METRICS_TOKEN, Replicas
from test_managed_auth import PASSWORD, USERNAME, site, wait_for_step, wait_for_success  # noqa: F401

TAKEOVER = 10


@pytest.fixture
def replicas(tmp_path):
    """Fresh for each test: the tests kill replicas."""
    deployment = Replicas(tmp_path / "data", extra_args=["--max-live-browsers", "3",
                                                         "--min-health-check-interval", "2"]).start()
    yield deployment
    deployment.reap_everything()


def sdk(replicas: Replicas, port: int | None = None) -> Kernel:
    base = f"http://127.0.0.1:{port}" if port else replicas.base_url
    return Kernel(api_key=replicas.api_key, base_url=base, max_retries=0)


def headers(replicas: Replicas) -> dict[str, str]:
    return {"Authorization": f"Bearer {replicas.api_key}"}


def stored_owner(replicas: Replicas, session_id: str) -> str:
    out = subprocess.run(["psql", replicas.database_url, "-At", "-c",
                          f"SELECT owner FROM browser_sessions WHERE id = '{session_id}'"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics",
                     headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10).text
    values = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if match:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")))
            values[(match.group(1), labels)] = float(match.group(3))
    return values


def gauge(values, name: str, **labels) -> float:
    wanted = set(labels.items())
    return sum(value for (metric, found), value in values.items()
               if metric == name and wanted <= set(found))


def test_concurrent_acquires_over_both_replicas_never_lease_a_browser_twice(replicas):
    client = sdk(replicas)
    pool = client.browser_pools.create(size=6, headless=True, fill_rate_per_minute=6000)
    assert wait_until(lambda: client.browser_pools.retrieve(pool.id).available_count == 6, 90, interval=0.5)
    ports = [member.port for member in replicas.members]

    def acquire(index: int):
        answer = httpx.post(f"http://127.0.0.1:{ports[index % 2]}/browser_pools/{pool.id}/acquire",
                            headers=headers(replicas), json={"acquire_timeout_seconds": 2}, timeout=60)
        assert answer.status_code in (200, 204), answer.text
        return answer.json()["session_id"] if answer.status_code == 200 else None

    with concurrent.futures.ThreadPoolExecutor(max_workers=100) as workers:
        leased = [session for session in workers.map(acquire, range(100)) if session]
    assert len(leased) == 6 and len(set(leased)) == 6, leased
    current = client.browser_pools.retrieve(pool.id)
    assert (current.acquired_count, current.available_count) == (6, 0)
    client.browser_pools.delete(pool.id, force=True)


def test_the_live_browser_limit_and_metrics_hold_across_replicas(replicas):
    ports = [member.port for member in replicas.members]

    def create(index: int):
        return httpx.post(f"http://127.0.0.1:{ports[index % 2]}/browsers", headers=headers(replicas),
                          json={"headless": True}, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as workers:
        answers = list(workers.map(create, range(8)))
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200] * 3 + [429] * 5, [(a.status_code, a.text) for a in answers]
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert refused.headers["retry-after"] and refused.json()["code"] == "limit_reached"

    client = sdk(replicas)
    pool = client.browser_pools.create(size=2, headless=True, fill_rate_per_minute=6000)
    assert wait_until(lambda: client.browser_pools.retrieve(pool.id).available_count == 2, 90, interval=0.5)
    client.browser_pools.acquire(pool.id)
    # The API lists every live browser, the pool's included.
    listed = httpx.get(f"{replicas.base_url}/browsers", headers=headers(replicas), timeout=30).json()
    outside_pools = [b for b in listed if not b.get("pool")]
    view = client.browser_pools.retrieve(pool.id)
    refusals = 0.0
    for port in ports:
        values = metrics(port)
        assert gauge(values, "browser_service_browser_sessions", state="running") == len(outside_pools) == 3
        assert gauge(values, "browser_service_browser_vms") == len(listed) == 5
        assert gauge(values, "browser_service_pool_browsers", pool=pool.id, state="idle") == view.available_count == 1
        assert gauge(values, "browser_service_pool_browsers", pool=pool.id, state="leased") == view.acquired_count == 1
        assert gauge(values, "browser_service_pool_target_size", pool=pool.id) == 2
        refusals += gauge(values, "browser_service_http_requests_total", route="/browsers", method="POST",
                          status="429")
    # Each replica counts the requests it answered.
    assert refusals == 5
    # Without the metrics token: 401, on every replica.
    for port in ports:
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", headers=headers(replicas)).status_code == 401
    client.browser_pools.delete(pool.id, force=True)


def test_a_project_cap_holds_across_replicas(replicas):
    """A project's `max_concurrent_sessions: 1`: of four creates at once through both
    replicas, one is admitted; `organization.limits` shows it."""
    client = sdk(replicas)
    project = client.projects.create(name="capped-across-replicas")
    client.projects.limits.update(project.id, max_concurrent_sessions=1)
    ports = [member.port for member in replicas.members]

    def create(index: int):
        return httpx.post(f"http://127.0.0.1:{ports[index % 2]}/browsers", timeout=120,
                          headers={**headers(replicas), "X-Kernel-Project-Id": project.id},
                          json={"headless": True})

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as workers:
        answers = list(workers.map(create, range(4)))
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200] + [429] * 3, [(a.status_code, a.text) for a in answers]
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert refused.headers["retry-after"] and refused.json()["code"] == "limit_reached"
    assert "max_concurrent_sessions is 1" in refused.json()["message"]
    assert client.organization.limits.retrieve().concurrent_sessions_used == 1
    admitted = next(answer for answer in answers if answer.status_code == 200).json()
    client.browsers.delete_by_id(admitted["session_id"])


def test_a_killed_replica_s_browser_keeps_working_through_the_other(replicas, test_page_url):
    first, second = replicas.members
    # Created through the first replica, which then serves it (its egress, its agent).
    created = sdk(replicas, first.port).browsers.create(headless=True)
    assert stored_owner(replicas, created.session_id) == "replica-0"
    agents = session_processes(first, created.session_id)["agent"]
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(created.cdp_ws_url)
        page = browser.contexts[0].pages[0] if browser.contexts[0].pages else browser.contexts[0].new_page()
        page.goto(test_page_url)
        assert page.title() == TEST_PAGE_TITLE
        killed = time.monotonic()
        replicas.kill(first)
        # The client reconnects (through the survivor) and the browser still works.
        assert wait_until(lambda: stored_owner(replicas, created.session_id) == "replica-1", TAKEOVER,
                          interval=0.2), "the survivor did not adopt the browser in time"
        adopted = time.monotonic() - killed
    title = read_page(created.cdp_ws_url, test_page_url, lambda page: page.title())
    assert title == TEST_PAGE_TITLE
    assert adopted < TAKEOVER
    # The same browser, not a replacement.
    assert session_processes(second, created.session_id)["agent"] == agents
    client = sdk(replicas)
    assert client.browsers.retrieve(created.session_id).session_id == created.session_id
    client.browsers.delete_by_id(created.session_id)
    assert wait_until(lambda: not any(is_alive(pid) for pid in agents), 10)


def test_a_replica_killed_while_filling_a_pool_leaves_it_filled_by_the_other(replicas):
    first, _ = replicas.members
    client = sdk(replicas)
    # The first replica started first: it holds the pool reconciler's duty.
    pool = client.browser_pools.create(size=3, headless=True, fill_rate_per_minute=6000)
    time.sleep(0.3)
    replicas.kill(first)
    assert wait_until(lambda: client.browser_pools.retrieve(pool.id).available_count == 3, 60, interval=0.5), \
        client.browser_pools.retrieve(pool.id)
    # Every browser the killed replica was starting ended, and its VM was reaped.
    browsers_dir = replicas.data_dir / "browsers"

    def only_live_vms_left():
        live = {member for member in _pool_members(replicas, pool.id)}
        return {entry.name for entry in browsers_dir.iterdir()} <= live

    assert wait_until(only_live_vms_left, 30, interval=0.5), \
        (sorted(entry.name for entry in browsers_dir.iterdir()), _pool_members(replicas, pool.id))
    client.browser_pools.delete(pool.id, force=True)


def _pool_members(replicas: Replicas, pool_id: str) -> list[str]:
    out = subprocess.run(["psql", replicas.database_url, "-At", "-c",
                          f"SELECT id FROM browser_sessions WHERE pool_id = '{pool_id}' AND status <> 'ended'"],
                         check=True, capture_output=True, text=True)
    return out.stdout.split()


def health_check_gaps(client: Kernel, connection_id: str, since: datetime) -> list[float]:
    checks = client.get(f"/auth/connections/{connection_id}/timeline", options={"params": {"type": "health_check"}},
                        cast_to=object)
    times = sorted(t for t in (datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
                               for event in checks) if t > since)
    assert len(times) >= 2, checks
    return [(later - earlier).total_seconds() for earlier, later in zip(times, times[1:])]


def log_in_by_hand(client: Kernel, connection_id: str):
    client.auth.connections.login(connection_id)
    wait_for_step(client, connection_id, "AWAITING_INPUT")
    client.auth.connections.submit(connection_id, fields={"username": USERNAME, "password": PASSWORD})
    return wait_for_success(client, connection_id)


def test_health_checks_run_on_one_replica_only(replicas, site):
    client = sdk(replicas)
    connection = client.auth.connections.create(
        domain=site.domain, profile_name="checked-once", login_url=site.login_url, health_check_interval=2)
    logged_in = log_in_by_hand(client, connection.id)
    # Every 2 s while both replicas live: never two together.
    time.sleep(7)
    assert min(health_check_gaps(client, connection.id, logged_in.last_auth_at)) > 1
    client.auth.connections.delete(connection.id)


def test_a_replica_killed_during_a_login_flow_loses_nothing(replicas, site):
    first, _ = replicas.members
    client = sdk(replicas)
    connection = client.auth.connections.create(
        domain=site.domain, profile_name="replicated", login_url=site.login_url, health_check_interval=2)
    client.auth.connections.login(connection.id)
    wait_for_step(client, connection.id, "AWAITING_INPUT")
    # The first replica runs the workflows: killed in the middle of the flow.
    killed = datetime.now().astimezone()
    replicas.kill(first)
    # The survivor takes the flow over: it accepts the values the person types.
    submitted = {}

    def submit():
        answer = httpx.post(f"{replicas.base_url}/auth/connections/{connection.id}/submit",
                            headers=headers(replicas), timeout=30,
                            json={"fields": {"username": USERNAME, "password": PASSWORD}})
        submitted["answer"] = answer
        # Taken (the answer to an earlier try may have been lost with the replica).
        current = httpx.get(f"{replicas.base_url}/auth/connections/{connection.id}", headers=headers(replicas),
                            timeout=30)
        return answer.status_code < 300 or (current.status_code == 200
                                            and current.json().get("flow_status") == "SUCCESS")

    # The workflows move once the killed replica's duty lease (10 s) has run out.
    assert wait_until(submit, TAKEOVER + 10, interval=0.5), submitted["answer"].text
    done = wait_for_success(client, connection.id)
    assert done.flow_type == "LOGIN"
    # Its health checks go on, from the survivor alone.
    time.sleep(7)
    assert min(health_check_gaps(client, connection.id, killed)) > 1
    client.auth.connections.delete(connection.id)
