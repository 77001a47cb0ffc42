"""Each browser is a VM of its own: a page sees nothing of the host, the data directory
or other browsers (not by `file://`, not by downloading into its own root and reading
that back); every process of the VM is unprivileged, Chromium keeps its own sandbox, and
nothing of a VM outlives its session. `memory` ends only the VM that exceeds it, and
`chrome_policy` reaches Chromium."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest
from kernel import BadRequestError, NotFoundError
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from conftest import TEST_PAGE_TITLE
from harness import first_tab, is_alive, read_page, session_processes, vm_root, wait_until
from sdk import field, once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

FILE_NOT_FOUND = "ERR_FILE_NOT_FOUND"


def _status(pid: int) -> tuple[int, str] | None:
    """(real uid, state letter) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return None
    return int(fields["Uid"].split()[0]), fields["State"].split()[0]


def test_a_page_reads_nothing_of_the_host_the_data_directory_or_other_browsers(
        control_plane, client, tmp_path):
    other = client.browsers.create(headless=True)
    created = client.browsers.create(headless=True)
    try:
        client.browsers.fs.write_file(other.session_id, contents=b"other-tenant-secret", path="/secret.txt")
        data = control_plane.data_dir
        targets = ["/etc/shadow", f"{data}/credential.key", f"{data}/control-plane.db",
                   f"{data}/bootstrap-api-key", f"{data}/", f"{vm_root(control_plane, other.session_id)}/secret.txt"]
        landing = tmp_path / "landing"
        landing.mkdir(mode=0o777)
        os.chmod(landing, 0o777)
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(created.cdp_ws_url)
            page = first_tab(browser)
            for target in targets:
                with pytest.raises(PlaywrightError, match=FILE_NOT_FOUND):
                    page.goto(f"file://{target}")
            # A download aimed at a host directory lands inside the VM, if anywhere.
            # A page of its own: the last error page may still be committing in this one.
            page = browser.contexts[0].new_page()
            cdp = browser.new_browser_cdp_session()
            cdp.send("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(landing)})
            page.set_content('<a id="d" href="data:text/plain,planted" download="planted.txt">get</a>')
            page.click("#d")
            time.sleep(1.5)
            browser.close()
        assert list(landing.iterdir()) == []
        # The filesystem API's /etc/shadow is the VM's (there is none), not the host's.
        with pytest.raises(NotFoundError):
            client.browsers.fs.read_file(created.session_id, path="/etc/shadow")
    finally:
        client.browsers.delete_by_id(created.session_id)
        client.browsers.delete_by_id(other.session_id)


def test_every_process_of_a_vm_is_unprivileged_and_ends_with_it(control_plane, client, test_page_url):
    created = client.browsers.create()
    processes = session_processes(control_plane, created.session_id)
    assert processes["sandbox"] and processes["agent"] and processes["xvfb"] and processes["chromium"]
    everything = set().union(*processes.values())
    statuses = {pid: _status(pid) for pid in everything}
    # A short-lived helper (a Chromium child) may have ended since it was listed: gone,
    # it runs as nobody. The VM's lasting processes are all read.
    for role in ("sandbox", "agent", "xvfb"):
        assert all(statuses[pid] is not None for pid in processes[role]), (role, statuses)
    for pid, status in statuses.items():
        assert status is None or status[0] != 0, f"{pid} runs as the host's root"
    for pid in processes["chromium"]:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            assert b"--no-sandbox" not in cmdline.read().split(b"\0")
    # The VM's task limit, which its user namespace counts per uid for it alone: tenant
    # processes may take all but 256 of the VM's 4096 tasks, which the agent keeps.
    for pids, limit in ((processes["agent"], "4096"), (processes["chromium"], "3840")):
        for pid in pids:
            with open(f"/proc/{pid}/limits") as limits:
                (line,) = [line for line in limits if line.startswith("Max processes")]
            assert line.split()[2:4] == [limit, limit], line
    assert read_page(created.cdp_ws_url, test_page_url, lambda page: page.title()) == TEST_PAGE_TITLE

    client.browsers.delete_by_id(created.session_id)
    # Soon after the end nothing of the VM exists, not even as a zombie (the teardown
    # follows the answer; 10 s leaves room for a host busy with another module).
    assert wait_until(lambda: all(_status(pid) is None for pid in everything), 10, 0.05), [
        (pid, _status(pid)) for pid in everything if _status(pid) is not None]


def _end_reason(control_plane, session_id: str) -> str | None:
    with sqlite3.connect(control_plane.data_dir / "control-plane.db") as db:
        row = db.execute("SELECT end_reason FROM browser_sessions WHERE id = ?", (session_id,)).fetchone()
    return row[0] if row else None


def test_a_vm_over_its_memory_ends_alone_with_a_reason(control_plane, client, test_page_url):
    bystander = client.browsers.create(headless=True)
    hog = client.browsers.create(headless=True, extra_body={"memory": "1GiB"})
    try:
        assert field(hog, "memory") == "1GiB"
        hog_processes = set().union(*session_processes(control_plane, hog.session_id).values())
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(hog.cdp_ws_url)
            page = first_tab(browser)
            try:
                # 1.5 GiB of touched memory, 100 MiB at a time.
                page.evaluate("""async () => {
                    window.hog = [];
                    for (let i = 0; i < 15; i++) {
                        window.hog.push(new Uint8Array(100 * 1024 * 1024).fill(7));
                        await new Promise(r => setTimeout(r, 100));
                    }
                }""")
            except PlaywrightError:
                pass  # the VM ended under the page
        assert wait_until(lambda: _end_reason(control_plane, hog.session_id) is not None, 15)
        assert "memory" in _end_reason(control_plane, hog.session_id)
        assert wait_until(lambda: not any(is_alive(pid) for pid in hog_processes), 5)
        with pytest.raises(NotFoundError):
            client.browsers.retrieve(hog.session_id)
        # The other VM did not notice.
        title = read_page(bystander.cdp_ws_url, test_page_url, lambda page: page.title())
        assert title == TEST_PAGE_TITLE
    finally:
        client.browsers.delete_by_id(bystander.session_id)


def test_chrome_policy_reaches_chromium(client, test_page_url):
    base = test_page_url.rsplit("/", 1)[0]
    blocked = base.removeprefix("http://") + "/blocked"
    created = client.browsers.create(headless=True, extra_body={"chrome_policy": {"URLBlocklist": [blocked]}})
    try:
        assert field(created, "chrome_policy") == {"URLBlocklist": [blocked]}
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(created.cdp_ws_url)
            page = first_tab(browser)
            page.goto(test_page_url)
            assert page.title() == TEST_PAGE_TITLE
            with pytest.raises(PlaywrightError, match="ERR_BLOCKED_BY_ADMINISTRATOR"):
                page.goto(f"{base}/blocked/page.html")
            browser.close()
    finally:
        client.browsers.delete_by_id(created.session_id)


@pytest.mark.parametrize("body, mentions", [
    ({"memory": "3GiB"}, "memory of a headless browser must be one of 1GiB, 2GiB, 4GiB"),
    ({"memory": "8GiB"}, "memory of a headless browser must be one of"),
    ({"chrome_policy": {"ProxyMode": "direct"}}, "chrome_policy.ProxyMode"),
    ({"chrome_policy": {"not a name": 1}}, "not a policy name"),
    ({"chrome_policy": ["URLBlocklist"]}, "chrome_policy"),
])
def test_bad_vm_settings_are_400(client, body, mentions):
    with pytest.raises(BadRequestError) as refused:
        client.browsers.create(headless=True, extra_body=body)
    assert mentions in str(refused.value)
