"""A browser VM's only way out is its egress proxy outside the sandbox. By default public
destinations are reachable and this host's loopback (the control plane, other browsers'
DevTools, PostgreSQL), link-local (cloud metadata) and private addresses are not, also
through a name that resolves to them; the operator allows more with `--egress-allow`
(here: only the test page server). `network.allowed_hosts` narrows a browser further.

The "public internet" is a web server the test starts in a network namespace of its own
at 203.0.113.10 (TEST-NET-3), behind a veth pair: that needs root, as CI has."""

from __future__ import annotations

import os
import subprocess
import urllib.parse
import urllib.request
import uuid

import httpx
import pytest
from kernel import BadRequestError
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from conftest import TEST_PAGE_TITLE
from harness import control_plane_for_module, first_tab, vm_root, wait_until
from sdk import field, once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

PUBLIC_HOST = "203.0.113.10"
PUBLIC_TITLE = "a public test host"
DENIED = "network_policy_denied"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory, test_page_url):
    port = urllib.parse.urlsplit(test_page_url).port
    yield from control_plane_for_module(tmp_path_factory, egress_allow=(f"127.0.0.1:{port}",))


@pytest.fixture(scope="module")
def public_host(tmp_path_factory):
    """A web server at 203.0.113.10:80 in a network namespace reached over a veth pair."""
    if os.geteuid() != 0:
        pytest.skip("creating a network namespace needs root")
    tag = uuid.uuid4().hex[:6]
    namespace, outside, inside = f"kpub-{tag}", f"kp0{tag}", f"kp1{tag}"
    site = tmp_path_factory.mktemp("public-site")
    (site / "index.html").write_text(f"<title>{PUBLIC_TITLE}</title>")

    def run(*command: str) -> None:
        subprocess.run(command, check=True, capture_output=True)

    run("ip", "netns", "add", namespace)
    server = None
    try:
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        run("ip", "link", "set", inside, "netns", namespace)
        run("ip", "addr", "add", "203.0.113.1/24", "dev", outside)
        run("ip", "link", "set", outside, "up")
        run("ip", "netns", "exec", namespace, "ip", "addr", "add", f"{PUBLIC_HOST}/24", "dev", inside)
        run("ip", "netns", "exec", namespace, "ip", "link", "set", inside, "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, "python3", "-m", "http.server", "80",
             "--bind", PUBLIC_HOST, "--directory", str(site)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_until(lambda: _answers(f"http://{PUBLIC_HOST}/"), 10)
        yield f"http://{PUBLIC_HOST}/"
    finally:
        if server:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", outside], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def _visit(cdp_ws_url: str, urls: list[str]) -> list[tuple[int | None, str | None, str]]:
    """(status, X-Kernel-Proxy-Error, title or error) of each URL, in one browser tab."""
    results = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(cdp_ws_url)
        page = first_tab(browser)
        for url in urls:
            try:
                response = page.goto(url)
                results.append((response.status, response.headers.get("x-kernel-proxy-error"), page.title()))
            except PlaywrightError as error:
                results.append((None, None, str(error).splitlines()[0]))
        browser.close()
    return results


def test_a_page_reaches_nothing_inside_the_host(control_plane, client, test_page_url):
    other = client.browsers.create(headless=True)
    created = client.browsers.create(headless=True)
    try:
        devtools_file = vm_root(control_plane, other.session_id) / "user-data" / "DevToolsActivePort"
        assert wait_until(devtools_file.exists, 10)
        other_devtools = int(devtools_file.read_text().split()[0])
        page_port = urllib.parse.urlsplit(test_page_url).port
        refused = [
            f"http://127.0.0.1:{control_plane.port}/readyz",       # the control plane
            f"http://127.0.0.1:{other_devtools}/json/list",         # another browser's DevTools
            "http://127.0.0.1:5432/",                               # PostgreSQL's port
            "http://169.254.169.254/latest/meta-data/",             # the cloud metadata address
            "http://10.0.0.1/",                                     # a private network
            f"http://localhost:{page_port}/page.html",              # a name resolving to loopback
        ]
        results = _visit(created.cdp_ws_url, [test_page_url, *refused])
        assert results[0] == (200, None, TEST_PAGE_TITLE)
        for url, (status, error, _) in zip(refused, results[1:]):
            assert (status, error) == (403, DENIED), url
        # Tunnels (https, WebSockets) are judged the same way.
        (tunnel,) = _visit(created.cdp_ws_url, [f"https://127.0.0.1:{control_plane.port}/"])
        assert tunnel[0] is None and "ERR_TUNNEL_CONNECTION_FAILED" in tunnel[2]
    finally:
        client.browsers.delete_by_id(created.session_id)
        client.browsers.delete_by_id(other.session_id)


def test_allowed_hosts_narrow_what_a_browser_reaches(client, public_host):
    open_browser = client.browsers.create(headless=True)
    narrowed = client.browsers.create(headless=True, extra_body={"network": {"allowed_hosts": ["example.com"]}})
    by_address = client.browsers.create(headless=True, extra_body={"network": {"allowed_hosts": [PUBLIC_HOST]}})
    try:
        assert field(open_browser, "network") is None
        assert field(narrowed, "network") == {"allowed_hosts": ["example.com"]}
        assert _visit(open_browser.cdp_ws_url, [public_host]) == [(200, None, PUBLIC_TITLE)]
        ((status, error, _),) = _visit(narrowed.cdp_ws_url, [public_host])
        assert (status, error) == (403, DENIED)
        assert _visit(by_address.cdp_ws_url, [public_host]) == [(200, None, PUBLIC_TITLE)]
        listed = {b.session_id: b for b in client.browsers.list()}
        assert field(listed[narrowed.session_id], "network") == {"allowed_hosts": ["example.com"]}
    finally:
        for browser in (open_browser, narrowed, by_address):
            client.browsers.delete_by_id(browser.session_id)


def test_a_running_browser_gets_a_new_allowlist(control_plane, client, public_host):
    created = client.browsers.create(headless=True, extra_body={"network": {"allowed_hosts": [PUBLIC_HOST]}})
    url = f"{control_plane.base_url}/browsers/{created.session_id}"
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}

    def patch(network: dict) -> httpx.Response:
        return httpx.patch(url, headers=headers, json={"network": network}, timeout=30)

    try:
        assert _visit(created.cdp_ws_url, [public_host]) == [(200, None, PUBLIC_TITLE)]
        narrowed = patch({"allowed_hosts": ["example.com"]})
        assert narrowed.status_code == 200 and narrowed.json()["network"] == {"allowed_hosts": ["example.com"]}
        # A new URL each time: the page just loaded may still be fresh in Chromium's cache,
        # which answers without going out.
        ((status, error, _),) = _visit(created.cdp_ws_url, [public_host + "?after-narrowing"])
        assert (status, error) == (403, DENIED)
        assert field(client.browsers.retrieve(created.session_id), "network") == {"allowed_hosts": ["example.com"]}
        assert patch({"allowed_hosts": []}).status_code == 400
        removed = patch({"allowed_hosts": None})
        assert removed.status_code == 200 and "network" not in removed.json()
        assert _visit(created.cdp_ws_url, [public_host + "?after-removal"]) == [(200, None, PUBLIC_TITLE)]
        # Once removed, an allowlist cannot come back (as the SDK documents).
        again = patch({"allowed_hosts": [PUBLIC_HOST]})
        assert again.status_code == 400 and "cannot be given one" in again.json()["message"]
        assert patch({"allowed_hosts": None, "bogus": 1}).status_code == 400
        # Another organization's browser does not exist for this one.
        intruder = control_plane.create_api_key("org-egress-intruder")
        foreign = httpx.patch(url, headers={"Authorization": f"Bearer {intruder}"},
                              json={"network": {"allowed_hosts": None}}, timeout=30)
        assert foreign.status_code == 404 and foreign.json()["code"] == "not_found"
    finally:
        client.browsers.delete_by_id(created.session_id)


@pytest.mark.parametrize("network, mentions", [
    ({"allowed_hosts": []}, "may not be empty"),
    ({"allowed_hosts": ["127.0.0.1"]}, "private and reserved"),
    ({"allowed_hosts": ["example.com:443"]}, "ports"),
    ({"allowed_hosts": ["*.com"]}, "public suffix"),
    ({"private_hosts": ["db.internal"]}, "not supported by this server"),
    ({"proxy_routes": []}, "not supported by this server"),
    ({"bogus": 1}, "unknown field"),
])
def test_bad_network_settings_are_400(client, network, mentions):
    with pytest.raises(BadRequestError) as refused:
        client.browsers.create(headless=True, extra_body={"network": network})
    assert mentions in str(refused.value)
