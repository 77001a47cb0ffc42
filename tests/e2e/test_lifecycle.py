"""What happens to sessions over time: inactivity timeouts, and control-plane crashes."""

from __future__ import annotations

import os
import signal
import time

from kernel import Kernel
from playwright.sync_api import sync_playwright

from conftest import TEST_PAGE_TITLE
from harness import ControlPlane, is_alive, read_page, session_processes, wait_until
from sdk import once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


def _listed(client: Kernel) -> set[str]:
    # Listing does not count as using a session, so it can watch timeouts without resetting them.
    return {b.session_id for b in client.browsers.list()}


def test_idle_session_times_out_but_one_with_open_cdp_does_not(control_plane, client):
    idle = client.browsers.create(timeout_seconds=10, headless=True)
    # Its timeout counts from here: the second create may take a moment.
    created_at = time.monotonic()
    watched = client.browsers.create(timeout_seconds=10, headless=True)
    idle_processes = session_processes(control_plane, idle.session_id)

    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(watched.cdp_ws_url)
        assert wait_until(lambda: idle.session_id not in _listed(client), timeout=20, interval=0.5)
        assert time.monotonic() - created_at < 20
        assert time.monotonic() - created_at >= 9, "the idle session ended before its timeout"
        assert wait_until(lambda: not any(is_alive(p) for ps in idle_processes.values() for p in ps), 5)
        # Well past its own timeout, the connected session lives and works.
        time.sleep(max(0.0, created_at + 15 - time.monotonic()))
        assert watched.session_id in _listed(client)
        page = browser.contexts[0].new_page()
        page.set_content(f"<title>{TEST_PAGE_TITLE}</title>")
        assert page.title() == TEST_PAGE_TITLE
        browser.close()

    # Once the connection is closed, the usual timeout applies again.
    assert wait_until(lambda: watched.session_id not in _listed(client), timeout=20, interval=0.5)


def test_sessions_survive_a_control_plane_crash(tmp_path, test_page_url):
    server = ControlPlane(tmp_path / "data").start()
    try:
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        sessions = [client.browsers.create(), client.browsers.create(headless=True)]
        before = {s.session_id: session_processes(server, s.session_id) for s in sessions}

        server.stop(signal.SIGKILL)
        for processes in before.values():
            assert all(is_alive(p) for ps in processes.values() for p in ps), "a browser died with the control plane"

        restarted = ControlPlane(server.data_dir, port=server.port).start()
        server = restarted
        assert {s.session_id for s in sessions} <= _listed(client)
        for session in sessions:
            current = client.browsers.retrieve(session.session_id)
            assert read_page(current.cdp_ws_url, test_page_url, lambda page: page.title()) == TEST_PAGE_TITLE
            # Same processes as before the crash: re-adopted, not replaced.
            assert session_processes(server, session.session_id)["agent"] == before[session.session_id]["agent"]
        for session in sessions:
            client.browsers.delete_by_id(session.session_id)
        for processes in before.values():
            assert wait_until(lambda: not any(is_alive(p) for ps in processes.values() for p in ps), 5)
    finally:
        server.reap_everything()


def test_restart_ends_sessions_whose_browser_died_and_reaps_strays(tmp_path):
    server = ControlPlane(tmp_path / "data").start()
    try:
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        doomed = client.browsers.create(headless=True)
        survivor = client.browsers.create(headless=True)
        doomed_processes = session_processes(server, doomed.session_id)
        server.stop(signal.SIGKILL)
        for pid in doomed_processes["agent"]:
            os.kill(pid, signal.SIGKILL)  # the agent's children die with it
        assert wait_until(lambda: not any(is_alive(p) for ps in doomed_processes.values() for p in ps), 5)

        server = ControlPlane(server.data_dir, port=server.port).start()
        listed = _listed(client)
        assert survivor.session_id in listed and doomed.session_id not in listed
        assert client.browsers.retrieve(doomed.session_id, include_deleted=True).deleted_at is not None
        assert wait_until(lambda: not (server.data_dir / "browsers" / doomed.session_id).exists(), 5)
        client.browsers.delete_by_id(survivor.session_id)
    finally:
        server.reap_everything()

