"""Browser pools through the official SDK, with real browsers: filling, atomic leases
under concurrency, release with reset, flush, timeouts, restarts, organizations and bad
input."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import kernel
import pytest
from kernel import Kernel
from playwright.sync_api import sync_playwright

from harness import control_plane_for_module, first_tab, is_alive, session_processes, wait_until
from sdk import once


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    yield from control_plane_for_module(tmp_path_factory, extra_args=["--max-pooled-browsers", "8"])


def new_pool(client: Kernel, size: int, **fields):
    # A fast fill rate (percent of size per minute) so tests do not wait for minutes.
    return client.browser_pools.create(size=size, fill_rate_per_minute=6000, headless=True, **fields)


def wait_available(client: Kernel, pool_id: str, count: int, timeout: float = 60):
    found = {}

    def ready() -> bool:
        found["pool"] = client.browser_pools.retrieve(pool_id)
        return found["pool"].available_count == count

    assert wait_until(ready, timeout, interval=0.25), found
    return found["pool"]


def live(client: Kernel, session_id: str) -> bool:
    return client.browsers.retrieve(session_id, include_deleted=True).deleted_at is None


def test_concurrent_acquires_lease_each_browser_to_one_caller_at_a_time(client):
    pool = new_pool(client, 3, name="concurrent")
    wait_available(client, pool.id, 3)

    lock = threading.Lock()
    leases: list[tuple[str, float]] = []   # (session id, acquired at), in order
    released: dict[int, float] = {}        # index in leases -> released at
    errors: list[Exception] = []

    def acquirer():
        try:
            session = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=60)
            with lock:
                leases.append((session.session_id, time.monotonic()))
        except Exception as error:  # noqa: BLE001 - reported below
            with lock:
                errors.append(error)

    threads = [threading.Thread(target=acquirer) for _ in range(9)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    # Exactly three are served at once; the others wait.
    assert wait_until(lambda: len(leases) == 3, 10, interval=0.05)
    assert time.monotonic() - started < 5
    time.sleep(1)
    assert len(leases) == 3 and not errors
    assert len({sid for sid, _ in leases}) == 3

    # Serve the rest by releasing: with reuse (reset, then available again), without
    # (ended and replaced by a new browser).
    served = 3
    for round_number, reuse in ((0, True), (1, False)):
        batch = list(range(served - 3, served))
        for index in batch:
            with lock:
                released[index] = time.monotonic()
            client.browser_pools.release(pool.id, session_id=leases[index][0], reuse=reuse)
        served += 3
        assert wait_until(lambda: len(leases) >= served, 60, interval=0.1), (round_number, leases, errors)
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(leases) == 9

    # No browser was ever held by two callers at once: each lease of a session starts
    # after the previous lease of it was released.
    by_session: dict[str, list[int]] = {}
    for index, (sid, _) in enumerate(leases):
        by_session.setdefault(sid, []).append(index)
    for sid, indexes in by_session.items():
        for earlier, later in zip(indexes, indexes[1:]):
            assert earlier in released and released[earlier] <= leases[later][1], (sid, leases)
    # The browsers released without reuse were ended and replaced.
    for index in range(3, 6):
        assert not live(client, leases[index][0])
    for index in range(6, 9):
        client.browser_pools.release(pool.id, session_id=leases[index][0])
    wait_available(client, pool.id, 3)
    client.browser_pools.delete(pool.id)


def test_flush_ends_idle_browsers_only_and_the_pool_refills(client, control_plane, test_page_url):
    pool = new_pool(client, 3, name="flushing")
    wait_available(client, pool.id, 3)
    leased = client.browser_pools.acquire(pool.id)
    assert leased.pool.id == pool.id and leased.pool.name == "flushing"
    before = {s.session_id for s in client.browsers.list() if s.session_id != leased.session_id}
    idle_processes = {sid: session_processes(control_plane, sid) for sid in before}
    idle_ids = {sid for sid, procs in idle_processes.items() if procs["agent"]}
    assert len(idle_ids) >= 2

    client.browser_pools.flush(pool.id)
    for sid in idle_ids:
        assert not live(client, sid)
        pids = set().union(*idle_processes[sid].values())
        assert wait_until(lambda: not any(is_alive(p) for p in pids), 10), sid
    # The leased one is untouched and usable.
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(leased.cdp_ws_url)
        page = browser.contexts[0].new_page()
        page.goto(test_page_url)
        assert page.evaluate("1 + 1") == 2
        browser.close()
    refilled = wait_available(client, pool.id, 2)
    assert refilled.acquired_count == 1
    client.browser_pools.delete(pool.id, force=True)
    assert not live(client, leased.session_id)


def test_a_reused_browser_keeps_nothing_of_its_previous_lessee(client, test_page_url):
    pool = new_pool(client, 1, name="isolated")
    wait_available(client, pool.id, 1)
    first = client.browser_pools.acquire(pool.id)
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(first.cdp_ws_url)
        page = first_tab(browser)
        page.goto(test_page_url)
        page.evaluate("document.cookie = 'secret=lessee-one; max-age=3600'; localStorage.setItem('secret', 'one')")
        assert "secret=lessee-one" in page.evaluate("document.cookie")
        browser.contexts[0].new_page().goto(test_page_url)
        browser.close()
    client.browsers.fs.write_file(first.session_id, contents=b"one", path="/home/kernel/lessee-one.txt")
    client.browser_pools.release(pool.id, session_id=first.session_id, reuse=True)

    second = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=30)
    assert second.session_id == first.session_id  # the same browser, reset
    # The previous lessee's files are gone, and its DevTools URL no longer opens the browser.
    with pytest.raises(kernel.NotFoundError):
        client.browsers.fs.file_info(second.session_id, path="/home/kernel/lessee-one.txt")
    assert second.cdp_ws_url != first.cdp_ws_url
    with sync_playwright() as playwright:
        with pytest.raises(Exception, match="401"):
            playwright.chromium.connect_over_cdp(first.cdp_ws_url, timeout=15_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(second.cdp_ws_url)
        context = browser.contexts[0]
        assert len(context.pages) <= 1  # the previous lessee's tabs are gone
        assert context.cookies() == []
        page = first_tab(browser)
        page.goto(test_page_url)
        assert page.evaluate("document.cookie") == ""
        assert page.evaluate("localStorage.getItem('secret')") is None
        browser.close()
    client.browser_pools.release(pool.id, session_id=second.session_id, reuse=False)
    client.browser_pools.delete(pool.id)


@once
def test_an_unused_leased_browser_times_out_and_is_replaced(client):
    pool = new_pool(client, 1, name="timing-out", timeout_seconds=10)
    wait_available(client, pool.id, 1)
    leased = client.browser_pools.acquire(pool.id)
    assert leased.timeout_seconds == 10
    assert wait_until(lambda: not live(client, leased.session_id), 25)
    replacement = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=30)
    assert replacement.session_id != leased.session_id
    client.browser_pools.delete(pool.id, force=True)


@once
def test_pools_survive_a_control_plane_restart(client, control_plane):
    pool = new_pool(client, 2, name="durable")
    wait_available(client, pool.id, 2)
    leased = client.browser_pools.acquire(pool.id)
    control_plane.stop(signal.SIGKILL)
    control_plane.start()
    again = client.browser_pools.retrieve("durable")
    assert (again.id, again.acquired_count, again.available_count) == (pool.id, 1, 1)
    other = client.browser_pools.acquire("durable")
    assert other.session_id != leased.session_id
    # None became available in time: 204, which this SDK generation reads as "".
    assert not client.browser_pools.acquire("durable", acquire_timeout_seconds=1)
    exhausted = httpx.post(f"{control_plane.base_url}/browser_pools/durable/acquire",
                           headers={"Authorization": f"Bearer {control_plane.api_key}"},
                           json={"acquire_timeout_seconds": 0}, timeout=30)
    assert exhausted.status_code == 204 and exhausted.content == b""
    client.browser_pools.release("durable", session_id=leased.session_id)
    assert client.browser_pools.acquire("durable", acquire_timeout_seconds=30).session_id == leased.session_id
    client.browser_pools.delete("durable", force=True)


def test_pools_are_private_to_their_organization(client, control_plane):
    pool = new_pool(client, 1, name="private")
    other = Kernel(api_key=control_plane.create_api_key("pools-org-b"),
                   base_url=control_plane.base_url, max_retries=0)
    assert pool.id not in [p.id for p in other.browser_pools.list()]
    for call in (lambda: other.browser_pools.retrieve(pool.id),
                 lambda: other.browser_pools.retrieve("private"),
                 lambda: other.browser_pools.acquire(pool.id, acquire_timeout_seconds=1),
                 lambda: other.browser_pools.flush(pool.id),
                 lambda: other.browser_pools.update(pool.id, size=1),
                 lambda: other.browser_pools.release(pool.id, session_id="x"),
                 lambda: other.browser_pools.delete(pool.id)):
        with pytest.raises(kernel.NotFoundError):
            call()
    # Another organization may use the same name.
    theirs = other.browser_pools.create(size=1, name="private", headless=True)
    other.browser_pools.delete(theirs.id)
    assert client.browser_pools.retrieve("private").id == pool.id
    client.browser_pools.delete(pool.id, force=True)


def test_bad_pool_input_is_an_error_shape(client, control_plane):
    def refused(call, status=400):
        with pytest.raises(kernel.APIStatusError) as error:
            call()
        assert error.value.status_code == status, error.value.body
        assert set(error.value.body) >= {"code", "message"}
        return error.value.body

    refused(lambda: client.browser_pools.create(size=0))
    refused(lambda: client.browser_pools.create(size=101))
    refused(lambda: client.browser_pools.create(size=1, fill_rate_per_minute=0))
    refused(lambda: client.browser_pools.create(size=1, name="no spaces"))
    # References to nothing are 404s, as the resources' own routes answer.
    refused(lambda: client.browser_pools.create(size=1, proxy_id="proxy_missing"), status=404)
    refused(lambda: client.browser_pools.create(size=1, extensions=[{"name": "missing"}]), status=404)
    refused(lambda: client.browser_pools.create(size=1, viewport={"width": 5, "height": 5}))
    refused(lambda: client.post("/browser_pools", body={"size": 1, "colour": "red"}, cast_to=object))
    # The organization's limit (8 here) on the sum of pool sizes.
    body = refused(lambda: client.browser_pools.create(size=9))
    assert "8" in body["message"]

    pool = new_pool(client, 1, name="strict")
    refused(lambda: new_pool(client, 1, name="strict"), status=409)
    # Within the limit alone, but not with the other pools: a conflict with them.
    body = refused(lambda: client.browser_pools.create(size=8), status=409)
    assert "other pools" in body["message"]
    refused(lambda: client.browser_pools.update(pool.id, size=0))
    refused(lambda: client.browser_pools.acquire(pool.id, acquire_timeout_seconds=-1))
    refused(lambda: client.browser_pools.release(pool.id, session_id="nope"), status=404)
    plain = client.browsers.create(headless=True)
    refused(lambda: client.browser_pools.release(pool.id, session_id=plain.session_id))
    client.browsers.delete_by_id(plain.session_id)
    wait_available(client, pool.id, 1)
    leased = client.browser_pools.acquire(pool.id)
    refused(lambda: client.browser_pools.delete(pool.id), status=409)
    client.browser_pools.release(pool.id, session_id=leased.session_id, reuse=False)
    refused(lambda: client.browser_pools.release(pool.id, session_id=leased.session_id), status=404)

    # PATCH changes the configuration; discard_all_idle replaces idle browsers with it.
    wait_available(client, pool.id, 1)
    idle = [s.session_id for s in client.browsers.list() if s.pool and s.pool.id == pool.id]
    updated = client.browser_pools.update(pool.id, size=2, discard_all_idle=True, stealth=True)
    assert updated.browser_pool_config.size == 2 and updated.browser_pool_config.stealth is True
    assert all(not live(client, sid) for sid in idle)
    wait_available(client, pool.id, 2)
    assert all(client.browsers.retrieve(s.session_id).stealth
               for s in client.browsers.list() if s.pool and s.pool.id == pool.id)
    client.browser_pools.delete(pool.id)
    refused(lambda: client.browser_pools.retrieve(pool.id), status=404)
    raw = httpx.delete(f"{control_plane.base_url}/browser_pools/{pool.id}",
                       headers={"authorization": f"Bearer {control_plane.api_key}"})
    assert raw.status_code == 404 and raw.json()["code"] == "not_found"
