"""Idle browsers are frozen: once nothing used one for the idle period (no CDP, live-view
or WebDriver client, no API call, no command or recording), every process of its VM but
the agent is stopped and takes no CPU; the next connection or call continues them before
it is served. The page's clocks pause meanwhile."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import sync_playwright

from harness import (control_plane_for_module, cpu_seconds, first_tab, process_state, session_processes,
                     wait_until)
from sdk import once

pytestmark = once

FREEZE_AFTER_SECONDS = 2


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    yield from control_plane_for_module(
        tmp_path_factory, extra_args=["--freeze-idle-after-seconds", str(FREEZE_AFTER_SECONDS)])


def stopped(pids: set[int]) -> bool:
    return bool(pids) and all(process_state(pid) == "T" for pid in pids)


def browser_side(control_plane, session_id: str) -> set[int]:
    """Chromium's processes and Xvfb: what a frozen VM stops."""
    kinds = session_processes(control_plane, session_id)
    return kinds["chromium"] | kinds["xvfb"]


def wait_frozen(control_plane, session_id: str) -> set[int]:
    assert wait_until(lambda: stopped(browser_side(control_plane, session_id)), timeout=20), \
        {pid: process_state(pid) for pid in browser_side(control_plane, session_id)}
    return browser_side(control_plane, session_id)


def test_an_idle_browser_stops_and_its_next_cdp_client_finds_it_running(client, control_plane,
                                                                          test_page_url):
    browser = client.browsers.create(headless=False)
    try:
        with sync_playwright() as playwright:
            cdp = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
            page = first_tab(cdp)
            page.goto(test_page_url)
            page.evaluate("window.ticks = 0; setInterval(() => window.ticks++, 50)")
            time.sleep(0.5)
            ticks_at_leave = page.evaluate("window.ticks")
            left_at = time.monotonic()
            cdp.close()

        frozen = wait_frozen(control_plane, browser.session_id)
        kinds = session_processes(control_plane, browser.session_id)
        # The agent answers for the VM and the sandbox's first process only waits: neither stops.
        assert not any(process_state(pid) == "T" for pid in kinds["agent"] | kinds["sandbox"])
        # Stopped processes use no CPU at all.
        before = cpu_seconds(frozen)
        time.sleep(2)
        assert cpu_seconds(frozen) - before < 0.02
        # Still frozen: the control plane's heartbeats do not wake it.
        assert stopped(browser_side(control_plane, browser.session_id))

        with sync_playwright() as playwright:
            cdp = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
            assert not any(process_state(pid) == "T" for pid in browser_side(control_plane, browser.session_id))
            page = first_tab(cdp)
            assert page.title() == "Kernel compatibility test page"
            ticks_now = page.evaluate("window.ticks")
            away = time.monotonic() - left_at
            # The timer ran only until the VM froze: far fewer ticks than the time away holds.
            assert ticks_now - ticks_at_leave < (away - 2) / 0.05, (ticks_now, ticks_at_leave, away)
            # And runs again.
            time.sleep(0.5)
            assert page.evaluate("window.ticks") > ticks_now
            cdp.close()
    finally:
        client.browsers.delete_by_id(browser.session_id)


@pytest.fixture
def headless_browser(client):
    browser = client.browsers.create(headless=True)
    yield browser
    client.browsers.delete_by_id(browser.session_id)


def test_an_api_call_continues_a_frozen_browser_before_it_is_served(client, control_plane, headless_browser):
    session_id = headless_browser.session_id
    wait_frozen(control_plane, session_id)
    # A command needs Chromium's VM running; it answers as usual.
    result = client.post(f"/browsers/{session_id}/process/exec",
                         body={"command": "echo", "args": ["awake"]}, cast_to=object)
    assert result["exit_code"] == 0
    assert not stopped(browser_side(control_plane, session_id))
    # And a CDP client needs Chromium itself.
    with sync_playwright() as playwright:
        wait_frozen(control_plane, session_id)
        cdp = playwright.chromium.connect_over_cdp(headless_browser.cdp_ws_url)
        assert first_tab(cdp).evaluate("1 + 1") == 2
        cdp.close()


def test_a_running_command_or_an_open_cdp_client_keeps_a_browser_awake(client, control_plane):
    browser = client.browsers.create(headless=True)
    try:
        spawned = client.post(f"/browsers/{browser.session_id}/process/spawn",
                              body={"command": "sleep", "args": ["60"]}, cast_to=object)
        time.sleep(FREEZE_AFTER_SECONDS + 2)
        assert not stopped(browser_side(control_plane, browser.session_id))
        client.post(f"/browsers/{browser.session_id}/process/{spawned['process_id']}/kill",
                    body={"signal": "KILL"}, cast_to=object)

        with sync_playwright() as playwright:
            cdp = playwright.chromium.connect_over_cdp(browser.cdp_ws_url)
            time.sleep(FREEZE_AFTER_SECONDS + 2)
            assert not stopped(browser_side(control_plane, browser.session_id))
            cdp.close()
        wait_frozen(control_plane, browser.session_id)
    finally:
        client.browsers.delete_by_id(browser.session_id)
    # A frozen browser is deleted like any other: nothing of it is left.
    assert wait_until(lambda: not any(session_processes(control_plane, browser.session_id).values()), timeout=15)
