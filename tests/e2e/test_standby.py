"""Standby browsers (`--standby-browsers`, `--standby-headless-browsers`): `POST /browsers`
is handed a browser started before the request, given the caller's viewport, location,
labels and start page, with a fresh profile, never handed over twice; the standby refills;
what needs another launch starts a browser as before."""

from __future__ import annotations

from pathlib import Path
import subprocess

import pytest
from kernel import Kernel
from playwright.sync_api import sync_playwright

from harness import (ControlPlane, control_plane_for_module, first_tab, idle_pool_browsers, session_processes,
                     wait_until)
from sdk import field, fields, once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

METRICS_TOKEN = "standby-metrics-token"
HEADFUL, HEADLESS = 2, 1


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    yield from control_plane_for_module(tmp_path_factory, extra_args=[
        "--standby-browsers", str(HEADFUL), "--standby-headless-browsers", str(HEADLESS),
        "--metrics-token", METRICS_TOKEN])


def idle_standby(control_plane) -> int:
    return idle_pool_browsers(control_plane, METRICS_TOKEN)


def standby_vms(control_plane, handed_out: set[str]) -> set[str]:
    """Browser VMs on this host that no session of the tests' organizations holds."""
    return {path.name for path in (control_plane.data_dir / "browsers").iterdir()} - handed_out


def vm_groups(control_plane, session_id: str) -> list[Path]:
    """The VM's control groups, as noted in its directory (one in cgroup v2; memory, pids
    and cpu in v1); none where VMs have no groups."""
    note = control_plane.data_dir / "browsers" / session_id / "cgroups"
    return [Path(line) for line in note.read_text().splitlines()] if note.exists() else []


def runs_as_in_use(control_plane, session_id: str) -> bool | None:
    """Whether the VM's processes get its CPU weight like a browser in use (a VM started
    ahead of demand runs at idle priority until then): with cgroup v1, every thread of
    it in the VM's own CPU group (none left in the idle `browser-vms-starting`) with the
    default 1024 shares; with v2, its group not idle, weight 100. `None` where VMs have
    no groups."""
    groups = vm_groups(control_plane, session_id)
    if not groups:
        return None
    if len(groups) == 1:
        idle = groups[0] / "cpu.idle"
        return ((not idle.exists() or idle.read_text().strip() == "0")
                and int((groups[0] / "cpu.weight").read_text()) == 100)
    memory, _pids, cpu = groups
    threads = lambda group: set((group / "tasks").read_text().split())  # noqa: E731
    return (bool(threads(memory)) and threads(memory) <= threads(cpu)
            and int((cpu / "cpu.shares").read_text()) == 1024)


def wait_full(control_plane):
    assert wait_until(lambda: idle_standby(control_plane) == HEADFUL + HEADLESS, 90, interval=0.25), \
        idle_standby(control_plane)


LOCATION_PROBE = "() => [Intl.DateTimeFormat().resolvedOptions().timeZone, navigator.language]"
SIZE_PROBE = "[screen.width, screen.height, innerWidth]"


def test_a_create_is_handed_a_standby_browser_with_what_it_asked_for(client, control_plane, test_page_url):
    wait_full(control_plane)
    before = standby_vms(control_plane, set())
    created = client.browsers.create(timeout_seconds=120, viewport={"width": 1280, "height": 720}, **fields(
        name="instant", tags={"team": "speed"}, start_url=test_page_url,
        location={"timezone": "Asia/Tokyo", "locale": "fr-FR"}))
    sid = created.session_id
    try:
        assert sid in before, "a browser started before the request was handed over"
        assert (field(created, "name"), field(created, "tags")) == ("instant", {"team": "speed"})
        assert created.timeout_seconds == 120 and created.headless is False
        assert field(created, "viewport")["width"] == 1280
        assert field(created, "location")["timezone"] == "Asia/Tokyo"
        listed = [s.session_id for s in client.browsers.list()]
        assert listed == [sid]
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(created.cdp_ws_url)
            page = first_tab(browser)
            assert page.url == test_page_url, "the start URL is open before the answer"
            assert page.evaluate(LOCATION_PROBE) == ["Asia/Tokyo", "fr-FR"]
            assert page.evaluate(SIZE_PROBE) == [1280, 720, 1280]
            browser.close()

        # The standby is filled again with new browsers; the handed-over one is not among them.
        wait_full(control_plane)
        refilled = standby_vms(control_plane, {sid})
        assert len(refilled) == HEADFUL + HEADLESS and sid not in refilled
    finally:
        client.browsers.delete_by_id(sid)
    # Ended like any browser: its processes and directory are gone, not returned to the standby.
    assert wait_until(lambda: not any(session_processes(control_plane, sid).values()), 20)
    assert wait_until(lambda: not (control_plane.data_dir / "browsers" / sid).exists(), 5)


def test_a_standby_browser_has_a_fresh_profile_and_serves_one_session_only(client, control_plane,
                                                                            test_page_url):
    other = Kernel(api_key=control_plane.create_api_key("standby-other"), base_url=control_plane.base_url)
    wait_full(control_plane)
    first = client.browsers.create()
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(first.cdp_ws_url)
        page = first_tab(browser)
        page.goto(test_page_url)
        page.evaluate("document.cookie = 'secret=first; max-age=3600'; localStorage.setItem('secret', 'one')")
        browser.close()
    client.browsers.delete_by_id(first.session_id)

    wait_full(control_plane)
    before = standby_vms(control_plane, set())
    second = other.browsers.create()
    try:
        assert second.session_id in before and second.session_id != first.session_id
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(second.cdp_ws_url)
            context = browser.contexts[0]
            assert context.cookies() == []
            page = first_tab(browser)
            assert page.url == "about:blank"
            page.goto(test_page_url)
            assert page.evaluate("document.cookie") == ""
            assert page.evaluate("localStorage.getItem('secret')") is None
            browser.close()
        # Each organization sees its own browser only.
        assert [s.session_id for s in other.browsers.list()] == [second.session_id]
        assert second.session_id not in [s.session_id for s in client.browsers.list()]
    finally:
        other.browsers.delete_by_id(second.session_id)


def test_headless_creates_take_the_headless_standby_and_other_launches_start_cold(client, control_plane):
    wait_full(control_plane)
    before = standby_vms(control_plane, set())
    headless = client.browsers.create(headless=True)
    # Kiosk mode and stealth are launch flags: no standby browser has them.
    kiosk = client.browsers.create(kiosk_mode=True)
    stealthy = client.browsers.create(headless=True, stealth=True)
    # A headless browser's window size is fixed at launch.
    small_headless = client.browsers.create(headless=True, viewport={"width": 800, "height": 600})
    try:
        assert headless.session_id in before and headless.headless is True
        assert kiosk.session_id not in before and stealthy.session_id not in before
        assert small_headless.session_id not in before
        assert kiosk.kiosk_mode is True and stealthy.stealth is True
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(small_headless.cdp_ws_url)
            assert first_tab(browser).evaluate("innerWidth") == 800
            browser.close()
        # Headless: a Chromium without a display.
        processes = session_processes(control_plane, headless.session_id)
        assert processes["chromium"] and not processes["xvfb"]
    finally:
        for session in (headless, kiosk, stealthy, small_headless):
            client.browsers.delete_by_id(session.session_id)


def test_standby_browsers_are_nobody_s(client, control_plane):
    """The organization that holds them cannot be given a key, and no one sees its pools."""
    wait_full(control_plane)
    assert not list(client.browser_pools.list())
    with pytest.raises(subprocess.CalledProcessError) as refused:
        control_plane.create_api_key("(standby browsers)")
    assert "reserved" in refused.value.stderr


def test_by_default_a_host_with_room_keeps_a_standby_browser_of_each_kind(tmp_path):
    """Without the flags, a host sized for 4 browsers or more keeps one headful browser
    ready and one headless per 2 of capacity (here 2): a new user's first create is
    handed one. Started ahead of demand, they launch at idle priority and run as
    browsers in use once settled."""
    server = ControlPlane(tmp_path / "data", default_standby=True,
                          extra_args=["--metrics-token", METRICS_TOKEN, "--capacity-browsers", "4"]).start()
    try:
        assert wait_until(lambda: idle_standby(server) == 3, 90, interval=0.25), idle_standby(server)
        ready = standby_vms(server, set())
        assert len(ready) == 3
        groups = vm_groups(server, next(iter(ready)))
        if len(groups) == 3:
            # cgroup v1: the idle group beside the VMs' group.
            idle = groups[2].parent.with_name("browser-vms-starting") / "cpu.idle"
            assert idle.read_text().strip() == "1"
        in_use = lambda: {runs_as_in_use(server, sid) for sid in ready}  # noqa: E731
        assert wait_until(lambda: in_use() in ({True}, {None}), 15), in_use()
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        for headless in (True, False):
            made = client.browsers.create(headless=headless)
            assert made.session_id in ready, (made.session_id, ready)
            client.browsers.delete_by_id(made.session_id)
    finally:
        server.reap_everything()
