"""Proxies through the official SDK: a real forward proxy requiring basic auth, started
here on loopback, sees every request of a browser created with a custom proxy; soft
delete, checks, organizations and bad input."""

from __future__ import annotations

import base64
import http.client
import urllib.parse

import kernel
import pytest
from kernel import Kernel

from conftest import TEST_PAGE_TITLE
from harness import control_plane_for_module, quiet_handler, read_page, respond, serve
from sdk import field, rename, update_browser

USERNAME, PASSWORD = "proxy-user", "s3cret pass"


class ForwardProxy:
    """An HTTP forward proxy on loopback that demands basic auth and records what it
    forwarded (absolute-form GETs; enough for http:// pages)."""

    def __init__(self, username: str, password: str):
        expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        seen: list[str] = []
        refused: list[str] = []
        self.seen, self.refused = seen, refused

        def get(handler):
            if handler.headers.get("Proxy-Authorization") != expected:
                refused.append(handler.path)
                respond(handler, 407, b"", None, [("Proxy-Authenticate", 'Basic realm="test"')])
                return
            seen.append(handler.path)
            target = urllib.parse.urlsplit(handler.path)
            upstream = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=10)
            upstream.request("GET", target.path or "/", headers={"Host": target.netloc})
            answer = upstream.getresponse()
            respond(handler, answer.status, answer.read(), answer.getheader("Content-Type", "text/html"))

        self.server = serve(quiet_handler(GET=get))
        self.port = self.server.server_address[1]

    def close(self):
        self.server.shutdown()


@pytest.fixture(scope="module")
def forward_proxy():
    proxy = ForwardProxy(USERNAME, PASSWORD)
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory, test_page_url):
    # The test's forward proxy listens on loopback, which tenants may reach only when the
    # operator allows it.
    yield from control_plane_for_module(
        tmp_path_factory, extra_args=["--proxy-check-url", test_page_url, "--egress-allow", "127.0.0.1"])


def custom(client: Kernel, port: int, password: str = PASSWORD, **fields):
    return client.proxies.create(
        type="custom", name="loopback", config={"host": "127.0.0.1", "port": port,
                                                 "username": USERNAME, "password": password},
        **fields)


def page_title_through(session, url: str) -> str:
    return read_page(session.cdp_ws_url, url, lambda page: page.title())


def test_a_browser_on_a_custom_proxy_sends_its_traffic_through_it(client, forward_proxy, test_page_url):
    proxy = custom(client, forward_proxy.port)
    assert proxy.type == "custom"
    assert proxy.config.has_password is True
    assert "password" not in proxy.model_dump(exclude_none=True)["config"]
    session = client.browsers.create(proxy_id=proxy.id, headless=True)
    assert client.browsers.retrieve(session.session_id).proxy_id == proxy.id

    url = test_page_url.replace("page.html", "via-proxy.html")
    assert page_title_through(session, url) == TEST_PAGE_TITLE
    assert url in forward_proxy.seen
    assert not forward_proxy.refused

    # Deleting the proxy is soft: gone from get and list, but the session keeps its
    # reference and its route.
    client.proxies.delete(proxy.id)
    with pytest.raises(kernel.NotFoundError):
        client.proxies.retrieve(proxy.id)
    assert proxy.id not in [p.id for p in client.proxies.list()]
    with pytest.raises(kernel.NotFoundError):
        client.proxies.delete(proxy.id)
    assert client.browsers.retrieve(session.session_id).proxy_id == proxy.id
    after = test_page_url.replace("page.html", "after-delete.html")
    assert page_title_through(session, after) == TEST_PAGE_TITLE
    assert after in forward_proxy.seen
    # New sessions cannot use it: for them it does not exist.
    with pytest.raises(kernel.NotFoundError) as refused:
        client.browsers.create(proxy_id=proxy.id, headless=True)
    assert "proxy_id" in refused.value.body["message"]
    client.browsers.delete_by_id(session.session_id)


def test_a_running_browser_switches_its_proxy_live(client, forward_proxy, test_page_url):
    proxy = custom(client, forward_proxy.port)
    session = client.browsers.create(headless=True)
    direct = test_page_url.replace("page.html", "switch-direct.html")
    assert page_title_through(session, direct) == TEST_PAGE_TITLE
    assert direct not in forward_proxy.seen

    switched = update_browser(client, session.session_id, proxy_id=proxy.id)
    assert field(switched, "proxy_id") == proxy.id
    assert client.browsers.retrieve(session.session_id).proxy_id == proxy.id
    proxied = test_page_url.replace("page.html", "switch-proxied.html")
    assert page_title_through(session, proxied) == TEST_PAGE_TITLE
    assert proxied in forward_proxy.seen

    # Today's form: `proxy.mode` direct goes direct again.
    back = update_browser(client, session.session_id, proxy={"mode": "direct"})
    assert field(back, "proxy_id") is None
    again = test_page_url.replace("page.html", "switch-direct-again.html")
    assert page_title_through(session, again) == TEST_PAGE_TITLE
    assert again not in forward_proxy.seen

    # Bad input changes nothing.
    with pytest.raises(kernel.NotFoundError):
        update_browser(client, session.session_id, proxy_id="prx_nobody")
    for body, mentions in [({"proxy_id": proxy.id, "proxy": {"mode": "direct"}}, "combined"),
                           ({"proxy": {"mode": "sideways"}}, "proxy.mode"),
                           ({"proxy": {"id": proxy.id, "name": "loopback"}}, "exactly one")]:
        with pytest.raises(kernel.BadRequestError) as refused:
            update_browser(client, session.session_id, **body)
        assert mentions in refused.value.body["message"], refused.value.body
    assert client.browsers.retrieve(session.session_id).proxy_id is None
    client.browsers.delete_by_id(session.session_id)


def test_check_reports_whether_the_proxy_works(client, forward_proxy, test_page_url):
    good = custom(client, forward_proxy.port)
    checked = client.proxies.check(good.id)
    assert checked.status == "available", checked
    assert checked.last_checked is not None
    assert test_page_url in forward_proxy.seen
    assert client.proxies.retrieve(good.id).status == "available"

    wrong_password = custom(client, forward_proxy.port, password="nope")
    checked = client.proxies.check(wrong_password.id)
    assert checked.status == "unavailable"
    assert "407" in checked.model_extra["check_error"]

    nobody_listens = client.proxies.create(type="custom", config={"host": "127.0.0.1", "port": 9})
    checked = client.proxies.check(nobody_listens.id)
    assert checked.status == "unavailable"
    assert "connecting to the proxy" in checked.model_extra["check_error"]


def test_proxies_are_private_to_their_organization(client, control_plane, forward_proxy):
    proxy = custom(client, forward_proxy.port)
    other = Kernel(api_key=control_plane.create_api_key("proxies-org-b"),
                   base_url=control_plane.base_url, max_retries=0)
    assert proxy.id not in [p.id for p in other.proxies.list()]
    with pytest.raises(kernel.NotFoundError):
        other.proxies.retrieve(proxy.id)
    with pytest.raises(kernel.NotFoundError):
        other.proxies.check(proxy.id)
    with pytest.raises(kernel.NotFoundError):
        other.proxies.delete(proxy.id)
    with pytest.raises(kernel.NotFoundError):
        other.browsers.create(proxy_id=proxy.id, headless=True)
    assert client.proxies.retrieve(proxy.id).id == proxy.id


def test_proxies_are_renamed_and_found_by_a_name_only_one_has(client, control_plane, forward_proxy):
    proxy = custom(client, forward_proxy.port)
    renamed = rename(client, "proxies", proxy.id, "egress-west")
    assert renamed["id"] == proxy.id and renamed["name"] == "egress-west"
    assert client.proxies.retrieve("egress-west").id == proxy.id
    # A browser selects it by name, as today's SDK's `proxy: {name}` does.
    browser = client.browsers.create(headless=True, extra_body={"proxy": {"name": "egress-west"}})
    assert browser.proxy_id == proxy.id
    client.browsers.delete_by_id(browser.session_id)
    twin = custom(client, forward_proxy.port)
    rename(client, "proxies", twin.id, "egress-west")
    with pytest.raises(kernel.ConflictError) as ambiguous:
        client.proxies.retrieve("egress-west")
    assert "use the id" in ambiguous.value.body["message"]
    client.proxies.delete(twin.id)
    assert client.proxies.retrieve("egress-west").id == proxy.id
    with pytest.raises(kernel.BadRequestError):
        rename(client, "proxies", proxy.id, "")
    other = Kernel(api_key=control_plane.create_api_key("proxies-rename-b"), base_url=control_plane.base_url,
                   max_retries=0)
    with pytest.raises(kernel.NotFoundError):
        rename(other, "proxies", proxy.id, "stolen")


@pytest.mark.parametrize("fields, mentions", [
    ({"type": "carrier-pigeon"}, "type"),
    ({"type": "datacenter", "config": {"country": "US"}}, "not configured"),
    ({"type": "custom"}, "config.host"),
    ({"type": "custom", "config": {"host": "h.test", "port": 70000}}, "config.port"),
    ({"type": "custom", "config": {"host": "h.test", "port": 8080, "password": 5}}, "config.password"),
    ({"type": "custom", "config": {"host": "h.test", "port": 8080}, "protocol": "https"}, "protocol"),
    ({"type": "custom", "config": {"host": "h.test", "port": 8080}, "bypass_hosts": ["a;b"]}, "bypass_hosts"),
    ({"type": "custom", "config": {"host": "h.test", "port": 8080}, "colour": "red"}, "colour"),
])
def test_bad_proxy_input_is_an_error_shape(client, fields, mentions):
    with pytest.raises(kernel.BadRequestError) as refused:
        client.post("/proxies", body=fields, cast_to=object)
    body = refused.value.body
    assert body["code"] == "bad_request", body
    assert mentions in body["message"] or any(mentions in d["message"] for d in body.get("details", [])), body
