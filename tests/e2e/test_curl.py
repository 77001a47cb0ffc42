"""HTTP requests made by the browser itself (`/browsers/{id}/curl`, `/curl/raw` and the
SDK's `browsers.request`/`browsers.stream` through `base_url`): they carry the browser's
cookies and user agent, leave through its proxy and network policy, and the cookies they
get back stay in the browser."""

from __future__ import annotations

import base64
import http.server
import json
import threading

import httpx
import kernel
import pytest
from kernel import Kernel

from harness import serving
from sdk import SEED_ERA
from test_proxies import PASSWORD, USERNAME, ForwardProxy


class EchoServer:
    """Answers every request with what it received; `/set-cookie` sets one, `/moved`
    redirects, `/binary` sends bytes that are not text."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                received = self.rfile.read(length) if length else b""
                if self.path.startswith("/moved"):
                    self.send_response(302)
                    self.send_header("Location", "/elsewhere")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path.startswith("/binary"):
                    body, kind = bytes(range(256)), "application/octet-stream"
                else:
                    body = json.dumps({"method": self.command, "path": self.path,
                                       "headers": {k.lower(): v for k, v in self.headers.items()},
                                       "body": received.decode(errors="replace")}).encode()
                    kind = "application/json"
                self.send_response(201 if self.command == "POST" else 200)
                self.send_header("Content-Type", kind)
                self.send_header("X-Twice", "one")
                self.send_header("X-Twice", "two")
                if self.path.startswith("/set-cookie"):
                    self.send_header("Set-Cookie", "from_curl=baked; Path=/")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def echo():
    yield from serving(EchoServer())


@pytest.fixture(scope="module")
def browser(client):
    session = client.browsers.create(timeout_seconds=300, headless=True)
    yield session
    client.browsers.delete_by_id(session.session_id)


def curl(client: Kernel, session_id: str, **body) -> dict:
    if SEED_ERA:
        return client.post(f"/browsers/{session_id}/curl", body=body, cast_to=object)
    return client.browsers.curl(session_id, **body).to_dict(mode="json")


def in_page(client: Kernel, session_id: str, code: str):
    answer = client.post(f"/browsers/{session_id}/playwright/execute", body={"code": code}, cast_to=object)
    assert answer["success"], answer
    return answer.get("result")


def test_a_request_carries_the_browsers_cookie_and_user_agent(client, browser, echo):
    sid = browser.session_id
    in_page(client, sid, f"await page.goto('{echo.url}/'); await page.evaluate(() => "
                         "document.cookie = 'from_page=yes; path=/')")
    user_agent = in_page(client, sid, "return await page.evaluate(() => navigator.userAgent)")
    answer = curl(client, sid, url=f"{echo.url}/echo?x=1")
    assert answer["status"] == 200 and answer["duration_ms"] >= 0
    assert answer["headers"]["X-Twice"] == ["one", "two"]
    seen = json.loads(answer["body"])
    assert seen["path"] == "/echo?x=1" and seen["method"] == "GET"
    assert "from_page=yes" in seen["headers"]["cookie"]
    assert seen["headers"]["user-agent"] == user_agent


def test_method_headers_body_and_encodings(client, browser, echo):
    sid = browser.session_id
    posted = curl(client, sid, url=f"{echo.url}/submit", method="POST", body='{"a": 1}',
                  headers={"Content-Type": "application/json", "X-Custom": "given"})
    assert posted["status"] == 201
    seen = json.loads(posted["body"])
    assert seen["method"] == "POST" and seen["body"] == '{"a": 1}'
    assert seen["headers"]["x-custom"] == "given" and seen["headers"]["content-type"] == "application/json"
    binary = curl(client, sid, url=f"{echo.url}/binary", response_encoding="base64")
    assert base64.b64decode(binary["body"]) == bytes(range(256))
    # Redirects are answered, not followed.
    moved = curl(client, sid, url=f"{echo.url}/moved")
    assert moved["status"] == 302 and moved["headers"]["Location"] == ["/elsewhere"]
    assert curl(client, sid, url=f"{echo.url}/x", method="HEAD")["body"] == ""


def test_cookies_a_response_sets_stay_in_the_browser(client, browser, echo):
    sid = browser.session_id
    assert curl(client, sid, url=f"{echo.url}/set-cookie")["headers"]["Set-Cookie"] == ["from_curl=baked; Path=/"]
    cookies = in_page(client, sid, f"return (await context.cookies('{echo.url}')).map(c => c.name)")
    assert "from_curl" in cookies
    # Nothing was left open for it.
    assert in_page(client, sid, "return context.pages().length") == 1


def test_requests_leave_through_the_proxy_and_the_network_policy(client, echo):
    proxy_server = ForwardProxy(USERNAME, PASSWORD)
    proxy = client.proxies.create(type="custom", name="curl-proxy", config={
        "host": "127.0.0.1", "port": proxy_server.port, "username": USERNAME, "password": PASSWORD})
    proxied = client.browsers.create(headless=True, proxy_id=proxy.id)
    narrowed = client.browsers.create(headless=True, extra_body={"network": {"allowed_hosts": ["example.com"]}})
    try:
        answer = curl(client, proxied.session_id, url=f"{echo.url}/via-proxy")
        assert answer["status"] == 200 and f"{echo.url}/via-proxy" in proxy_server.seen
        denied = curl(client, narrowed.session_id, url=f"{echo.url}/denied")
        assert denied["status"] == 403
        assert denied["headers"]["X-Kernel-Proxy-Error"] == ["network_policy_denied"]
    finally:
        for session in (proxied, narrowed):
            client.browsers.delete_by_id(session.session_id)
        client.proxies.delete(proxy.id)
        proxy_server.close()


@pytest.mark.skipif(SEED_ERA, reason="browsers.request and base_url came after the seed-era SDK")
def test_the_sdks_request_and_stream_go_through_base_url(client, browser, echo, control_plane):
    sid = browser.session_id
    retrieved = client.browsers.retrieve(sid)
    assert retrieved.base_url == f"{control_plane.base_url}/browsers/{sid}"
    response = client.browsers.request(sid, "POST", f"{echo.url}/raw", params={"q": "1"},
                                       json={"hello": "vm"}, headers={"X-Custom": "raw"})
    assert response.status_code == 201 and response.headers["content-type"] == "application/json"
    seen = response.json()
    assert seen["path"] == "/raw?q=1" and json.loads(seen["body"]) == {"hello": "vm"}
    assert seen["headers"]["x-custom"] == "raw"
    assert "authorization" not in seen["headers"] and not any(h.startswith("x-stainless") for h in seen["headers"])
    # Served from this server's origin: sandboxed, and without what would act on it.
    assert response.headers["content-security-policy"] == "sandbox"
    assert response.headers["x-content-type-options"] == "nosniff"
    cookie_setter = client.browsers.request(sid, "GET", f"{echo.url}/set-cookie")
    assert cookie_setter.status_code == 200 and "set-cookie" not in cookie_setter.headers
    assert cookie_setter.headers.get_list("x-twice") == ["one", "two"]
    with client.browsers.stream(sid, "GET", f"{echo.url}/binary") as streamed:
        assert b"".join(streamed.iter_bytes()) == bytes(range(256))
    # The route takes the session's token instead of an API key, for this session only.
    token = retrieved.cdp_ws_url.split("jwt=", 1)[1]
    raw = httpx.get(f"{retrieved.base_url}/curl/raw", params={"url": f"{echo.url}/t", "jwt": token}, timeout=30)
    assert raw.status_code == 200 and raw.json()["path"] == "/t"
    other = client.browsers.create(headless=True)
    try:
        foreign = httpx.get(f"{control_plane.base_url}/browsers/{other.session_id}/curl/raw",
                            params={"url": f"{echo.url}/t", "jwt": token}, timeout=30)
        assert foreign.status_code == 401
        assert httpx.get(f"{control_plane.base_url}/browsers/{sid}", params={"jwt": token}).status_code == 401
    finally:
        client.browsers.delete_by_id(other.session_id)


def test_bad_input_is_a_400_and_another_organization_gets_404(client, browser, control_plane):
    sid = browser.session_id
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    for body, needle in [({}, "url"),
                         ({"url": "file:///etc/passwd"}, "http or https"),
                         ({"url": "not a url"}, "url"),
                         ({"url": "http://x/", "method": "TRACE"}, "method"),
                         ({"url": "http://x/", "response_encoding": "hex"}, "response_encoding"),
                         ({"url": "http://x/", "timeout_ms": 0}, "timeout_ms"),
                         ({"url": "http://x/", "headers": {"bad name": "x"}}, "headers"),
                         ({"url": "http://x/", "headers": {"X-Ok": "line\nbreak"}}, "headers")]:
        answer = httpx.post(f"{control_plane.base_url}/browsers/{sid}/curl", json=body, headers=headers, timeout=10)
        assert answer.status_code == 400 and needle in json.dumps(answer.json()), (body, answer.text)
    raw = httpx.get(f"{control_plane.base_url}/browsers/{sid}/curl/raw", headers=headers, timeout=10)
    assert raw.status_code == 400 and "url" in raw.json()["message"]
    # Over http the way out answers for a host it cannot reach; over https the browser
    # gets no response at all, which is a 502 of ours.
    relayed = httpx.post(f"{control_plane.base_url}/browsers/{sid}/curl",
                         json={"url": "http://no-such-host.invalid/"}, headers=headers, timeout=30)
    assert relayed.status_code == 200 and relayed.json()["status"] == 502
    assert "does not resolve" in relayed.json()["body"]
    unreachable = httpx.post(f"{control_plane.base_url}/browsers/{sid}/curl",
                             json={"url": "https://no-such-host.invalid/"}, headers=headers, timeout=30)
    assert unreachable.status_code == 502 and "ERR_" in unreachable.json()["message"], unreachable.text
    other = Kernel(api_key=control_plane.create_api_key("org-curl-b"), base_url=control_plane.base_url,
                   max_retries=0)
    with pytest.raises(kernel.NotFoundError):
        curl(other, sid, url="http://example.com/")
    with pytest.raises(kernel.NotFoundError):
        other.get(f"/browsers/{sid}/curl/raw", options={"params": {"url": "http://example.com/"}}, cast_to=object)
