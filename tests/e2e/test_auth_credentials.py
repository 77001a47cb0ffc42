"""Managed auth with credentials, against real browsers and loopback sites: a site whose
login has a second step asking for a TOTP code, an SSO button leading to a second
"identity provider" site, and a 1Password item read through a fake Connect server. A
connection with a credential logs in by itself, through every step, and again after the
site expires its session."""

from __future__ import annotations

import http.server
import json
import secrets
import subprocess
import urllib.parse

import httpx
import pyotp
import pytest
from kernel import Kernel

from fake_onepassword import FakeConnect
from harness import control_plane_for_module, send_html, serve, wait_until

SEED = "KRUGKIDROVUWG2ZAMJZG653OEBTG66BAJZ2W24DT"
USERNAME, PASSWORD = "alice", "correct-horse-battery-staple-5521"
IDP_USERNAME, IDP_PASSWORD = "alice@idp.test", "idp-secret-8812"
CONNECT_TOKEN = "connect-token-auth-tests"


def _page(title: str, body: str) -> str:
    return f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>"


class Server:
    """A threaded loopback HTTP server whose handler is `respond(handler, method, form)`."""

    def __init__(self, respond):
        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self, method):
                form = {}
                if method == "POST":
                    length = int(self.headers.get("content-length", "0"))
                    form = {k: v[0] for k, v in urllib.parse.parse_qs(self.rfile.read(length).decode()).items()}
                send_html(self, *respond(self, method, form))

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def log_message(self, *args):
                pass

        self.server = serve(Handler)
        self.domain = f"127.0.0.1:{self.server.server_address[1]}"
        self.base = f"http://{self.domain}"


def _cookie(handler, name: str) -> str | None:
    for part in handler.headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


class IdentityProvider:
    """Signs a user in with its own form and sends them back to the site with a ticket."""

    def __init__(self):
        self.tickets: dict[str, str] = {}
        self.server = Server(self.respond)

    def respond(self, handler, method, form):
        path, _, query = handler.path.partition("?")
        back = urllib.parse.parse_qs(query).get("return", [""])[0] or form.get("return", "")
        if path == "/authorize" and method == "GET":
            return 200, _page("TestIdP", f"""<h1>TestIdP</h1><form method="post" action="/authorize">
                <input type="hidden" name="return" value="{back}">
                <label for="u">Email</label> <input id="u" name="login" type="email" required>
                <label for="p">Password</label> <input id="p" name="secret" type="password" required>
                <button type="submit">Continue</button></form>"""), []
        if path == "/authorize" and form.get("login") == IDP_USERNAME and form.get("secret") == IDP_PASSWORD:
            ticket = secrets.token_hex(8)
            self.tickets[ticket] = IDP_USERNAME
            return 303, "", [("location", f"{back}?ticket={ticket}")]
        return 401, _page("TestIdP", '<p role="alert">Wrong email or password.</p>'), []


class TwoStepSite:
    """A password form, then a TOTP code page; or "Sign in with TestIdP". Server-side
    sessions the test can expire."""

    def __init__(self, idp: IdentityProvider):
        self.idp = idp
        self.sessions: dict[str, str] = {}
        self.pending: set[str] = set()
        self.codes_accepted = 0
        self.sso_logins = 0
        self.server = Server(self.respond)
        self.domain, self.base = self.server.domain, self.server.base
        self.login_url = f"{self.base}/login"

    def _signed_in(self, user: str):
        sid = secrets.token_hex(16)
        self.sessions[sid] = user
        return 303, "", [("location", "/"), ("set-cookie", f"sid={sid}; Max-Age=86400; Path=/; HttpOnly")]

    def respond(self, handler, method, form):
        path, _, query = handler.path.partition("?")
        if path == "/login" and method == "GET":
            sso = f"{self.idp.server.base}/authorize?return={urllib.parse.quote(self.base + '/sso')}"
            return 200, _page("Sign in", f"""<h1>Sign in</h1><form method="post" action="/login">
                <label for="username">Username</label> <input id="username" name="username" autocomplete="username" required>
                <label for="password">Password</label> <input id="password" name="password" type="password" required>
                <button type="submit">Sign in</button></form>
                <p><a href="{sso}">Sign in with TestIdP</a></p>"""), []
        if path == "/login" and form.get("username") == USERNAME and form.get("password") == PASSWORD:
            token = secrets.token_hex(8)
            self.pending.add(token)
            return 303, "", [("location", "/mfa"), ("set-cookie", f"pending={token}; Path=/")]
        if path == "/login":
            return 401, _page("Sign in", '<p role="alert">Invalid username or password.</p>'), []
        if path == "/mfa" and method == "GET" and _cookie(handler, "pending") in self.pending:
            return 200, _page("Verify", """<h1>Two-step verification</h1><form method="post" action="/mfa">
                <label for="code">Code from your authenticator app</label>
                <input id="code" name="code" autocomplete="one-time-code" inputmode="numeric" required>
                <button type="submit">Verify</button></form>"""), []
        if path == "/mfa" and method == "POST" and _cookie(handler, "pending") in self.pending:
            if pyotp.TOTP(SEED).verify(form.get("code", ""), valid_window=1):
                self.pending.discard(_cookie(handler, "pending"))
                self.codes_accepted += 1
                return self._signed_in(USERNAME)
            return 401, _page("Verify", '<p role="alert">That code is not right.</p>'), []
        if path == "/sso":
            ticket = urllib.parse.parse_qs(query).get("ticket", [""])[0]
            if ticket in self.idp.tickets:
                self.sso_logins += 1
                return self._signed_in(self.idp.tickets.pop(ticket))
            return 403, _page("Denied", "<p>bad ticket</p>"), []
        if path == "/admin/expire":
            self.sessions.clear()
            return 204, "", []
        user = self.sessions.get(_cookie(handler, "sid") or "")
        if user is not None:
            return 200, _page("Home", f'<h1 id="welcome">Welcome {user}</h1>'), []
        return 303, "", [("location", "/login")]

    def expire_sessions(self):
        httpx.post(f"{self.base}/admin/expire")


@pytest.fixture(scope="module")
def idp():
    provider = IdentityProvider()
    yield provider
    provider.server.server.shutdown()


@pytest.fixture(scope="module")
def site(idp):
    site = TwoStepSite(idp)
    yield site
    site.server.server.shutdown()


@pytest.fixture(scope="module")
def connect(site):
    vaults = {"Work": {"Example": {"username": USERNAME, "password": PASSWORD,
                                   "otp": f"otpauth://totp/Example:alice?secret={SEED}",
                                   "urls": [site.login_url]}}}
    with FakeConnect(CONNECT_TOKEN, vaults) as server:
        yield server


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory, connect):
    yield from control_plane_for_module(tmp_path_factory, extra_args=[
        "--min-health-check-interval", "2", f"--onepassword-connect-url={connect.url}"])


@pytest.fixture(scope="module")
def client(control_plane) -> Kernel:
    return Kernel(api_key=control_plane.api_key, base_url=control_plane.base_url, max_retries=0)


def create_connection(client: Kernel, **body) -> dict:
    """`auth.connections.create` with fields the seed-era SDK does not declare."""
    return client.post("/auth/connections", body=body, cast_to=object)


def wait_for_flow(client: Kernel, connection_id: str, timeout: float = 90):
    found = {}

    def done():
        found["c"] = client.auth.connections.retrieve(connection_id)
        return found["c"].flow_status in ("SUCCESS", "FAILED") or found["c"].flow_step == "AWAITING_INPUT"

    assert wait_until(done, timeout, interval=0.25), found.get("c")
    return found["c"]


def timeline(client: Kernel, connection_id: str, **query) -> list[dict]:
    return client.get(f"/auth/connections/{connection_id}/timeline", options={"params": query}, cast_to=object)


def duration(path) -> float:
    probed = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "json", str(path)],
                            check=True, capture_output=True, text=True)
    return float(json.loads(probed.stdout)["format"]["duration"])


def test_a_credential_logs_in_through_the_totp_step_and_again_after_expiry(client, site, tmp_path):
    credential = client.credentials.create(name="site-login", domain=site.domain,
                                           values={"username": USERNAME, "password": PASSWORD},
                                           totp_secret=SEED)
    connection = create_connection(client, domain=site.domain, profile_name="with-credential",
                                   login_url=site.login_url, health_check_interval=2,
                                   credential={"name": "site-login"}, record_session=True)
    try:
        assert connection["credential"] == {"name": "site-login"} and connection["record_session"] is True
        assert connection["can_reauth"] is True and connection["can_reauth_reason"] == "has_credential"
        client.auth.connections.login(connection["id"])
        done = wait_for_flow(client, connection["id"])
        assert done.flow_status == "SUCCESS", done
        assert site.codes_accepted >= 1 and done.status == "AUTHENTICATED"
        # The credential's values were not copied into the connection.
        assert PASSWORD not in str(client.auth.connections.retrieve(connection["id"]).to_dict())

        # The credential is in use: it cannot be deleted.
        with pytest.raises(Exception) as in_use:
            client.credentials.delete(credential.id)
        assert getattr(in_use.value, "status_code", None) == 409

        # The site forgets the session; the next health check logs in again, code and all.
        accepted = site.codes_accepted
        site.expire_sessions()

        def reauthenticated():
            current = client.auth.connections.retrieve(connection["id"])
            return current.flow_type == "REAUTH" and current.flow_status == "SUCCESS"

        assert wait_until(reauthenticated, 90, interval=0.5), client.auth.connections.retrieve(connection["id"])
        assert site.codes_accepted == accepted + 1

        # The timeline, newest first: the REAUTH, the health check that saw the session
        # gone, earlier checks, and the first login, whose browser was recorded.
        update = {"health_checks": False}
        client.patch(f"/auth/connections/{connection['id']}", body=update, cast_to=object)
        events = timeline(client, connection["id"])
        kinds = [event["type"] for event in events]
        assert kinds[0] == "reauth" and kinds[-1] == "login", kinds
        expired_check = next(e for e in events if e["type"] == "health_check" and e["status"] == "NEEDS_AUTH")
        assert events.index(expired_check) == 1 and expired_check["previous_status"] == "AUTHENTICATED"
        login = events[-1]
        assert (login["status"], login["step"]) == ("SUCCESS", "COMPLETED") and login["completed_at"]
        checks = timeline(client, connection["id"], type="health_check")
        assert checks and all(event["type"] == "health_check" for event in checks)
        assert [e["id"] for e in timeline(client, connection["id"], limit=2)] == [e["id"] for e in events[:2]]
        video = httpx.get(f"{str(client.base_url).rstrip('/')}/browsers/{login['browser_session_id']}/replays/{login['replay_id']}",
                          headers={"Authorization": f"Bearer {client.api_key}"}, timeout=60)
        assert video.status_code == 200, video.text
        path = tmp_path / "login.mp4"
        path.write_bytes(video.content)
        assert duration(path) > 0.5
    finally:
        client.auth.connections.delete(connection["id"])
    client.credentials.delete(credential.id)


def test_an_sso_credential_signs_in_at_the_identity_provider(client, site, idp):
    client.credentials.create(name="idp-login", domain=site.domain, sso_provider="TestIdP",
                              values={"username": IDP_USERNAME, "password": IDP_PASSWORD})
    # The identity provider's page is filled only because it is an allowed domain.
    refused = create_connection(client, domain=site.domain, profile_name="sso-outside",
                                login_url=site.login_url, credential={"name": "idp-login"},
                                allowed_domains=["example.org"])
    allowed = create_connection(client, domain=site.domain, profile_name="sso",
                                login_url=site.login_url, credential={"name": "idp-login"},
                                allowed_domains=[idp.server.domain])
    try:
        client.auth.connections.login(refused["id"])
        failed = wait_for_flow(client, refused["id"])
        assert failed.flow_status == "FAILED" and failed.error_code == "left_allowed_domains", failed

        logins = site.sso_logins
        client.auth.connections.login(allowed["id"])
        done = wait_for_flow(client, allowed["id"])
        assert done.flow_status == "SUCCESS", done
        assert site.sso_logins == logins + 1
    finally:
        client.auth.connections.delete(refused["id"])
        client.auth.connections.delete(allowed["id"])
        client.credentials.delete("idp-login")


def test_a_onepassword_item_logs_in_by_path_and_by_domain(client, site, connect):
    provider = client.credential_providers.create(name="team-vault", token=CONNECT_TOKEN,
                                                  provider_type="onepassword")
    by_path = create_connection(client, domain=site.domain, profile_name="from-1password",
                                login_url=site.login_url,
                                credential={"provider": "team-vault", "path": "Work/Example"})
    by_domain = create_connection(client, domain=site.domain, profile_name="from-1password-auto",
                                  login_url=site.login_url,
                                  credential={"provider": "team-vault", "auto": True})
    try:
        assert by_path["can_reauth_reason"] == "external_credential"
        assert by_path["credential"] == {"provider": "team-vault", "path": "Work/Example"}
        for connection, record in ((by_path, True), (by_domain, None)):
            accepted = site.codes_accepted
            # A login may ask for its browser to be recorded, whatever the connection says.
            body = {} if record is None else {"record_session": record}
            client.post(f"/auth/connections/{connection['id']}/login", body=body, cast_to=object)
            done = wait_for_flow(client, connection["id"])
            assert done.flow_status == "SUCCESS", done
            assert site.codes_accepted == accepted + 1
            (login,) = timeline(client, connection["id"], type="login")
            assert (login.get("replay_id") is not None) == bool(record), login
        assert connect.calls["item"] >= 2
        # A provider in use cannot be deleted.
        with pytest.raises(Exception) as in_use:
            client.credential_providers.delete(provider.id)
        assert getattr(in_use.value, "status_code", None) == 409
    finally:
        client.auth.connections.delete(by_path["id"])
        client.auth.connections.delete(by_domain["id"])
        client.credential_providers.delete(provider.id)


def test_references_are_checked_and_scoped_to_the_organization(client, control_plane, site):
    client.credentials.create(name="only-mine", domain=site.domain, values={"password": "x"})
    other = Kernel(api_key=control_plane.create_api_key("org-auth-credentials-b"),
                   base_url=control_plane.base_url, max_retries=0)
    try:
        # Another organization's credential, or one that does not exist, is a 404;
        # a reference of no known shape a 400.
        for body, status in [({"name": "only-mine"}, 404), ({"name": "no-such"}, 404),
                             ({"provider": "no-such", "path": "a/b"}, 404),
                             ({"name": "only-mine", "provider": "x"}, 400), ({"provider": "x"}, 400),
                             ({"bogus": 1}, 400)]:
            answer = httpx.post(f"{control_plane.base_url}/auth/connections", timeout=30,
                                headers={"Authorization": f"Bearer {other.api_key}"},
                                json={"domain": site.domain, "profile_name": "p", "credential": body})
            assert answer.status_code == status, (body, answer.text)
            assert "credential" in answer.text
        # A path that is not Vault/Item.
        provider = client.credential_providers.create(name="checked", token="t", provider_type="onepassword")
        answer = httpx.post(f"{control_plane.base_url}/auth/connections", timeout=30,
                            headers={"Authorization": f"Bearer {control_plane.api_key}"},
                            json={"domain": site.domain, "profile_name": "p",
                                  "credential": {"provider": "checked", "path": "no-slash"}})
        assert answer.status_code == 400 and "Vault/Item" in answer.text
        client.credential_providers.delete(provider.id)
        # A stored credential is for its domain only.
        client.credentials.create(name="elsewhere", domain="bank.example", values={"password": "y"})
        answer = httpx.post(f"{control_plane.base_url}/auth/connections", timeout=30,
                            headers={"Authorization": f"Bearer {control_plane.api_key}"},
                            json={"domain": site.domain, "profile_name": "p", "credential": {"name": "elsewhere"}})
        assert answer.status_code == 409 and "bank.example" in answer.text, answer.text
        client.credentials.delete("elsewhere")
        # PATCH takes a credential too, and the view shows it; null removes it, and then
        # the credential can be deleted.
        connection = create_connection(client, domain=site.domain, profile_name="patched-credential",
                                       login_url=site.login_url)
        assert "credential" not in connection or connection["credential"] is None
        path = f"/auth/connections/{connection['id']}"
        patched = client.patch(path, body={"credential": {"name": "only-mine"}}, cast_to=object)
        assert patched["credential"] == {"name": "only-mine"}
        with pytest.raises(Exception) as in_use:
            client.credentials.delete("only-mine")
        assert getattr(in_use.value, "status_code", None) == 409
        removed = client.patch(path, body={"credential": None}, cast_to=object)
        assert removed.get("credential") is None
        # Another organization cannot read the connection's timeline.
        foreign = httpx.get(f"{control_plane.base_url}{path}/timeline", timeout=30,
                            headers={"Authorization": f"Bearer {other.api_key}"})
        assert foreign.status_code == 404 and foreign.json()["code"] == "not_found"
        bad_type = httpx.get(f"{control_plane.base_url}{path}/timeline?type=flows", timeout=30,
                             headers={"Authorization": f"Bearer {control_plane.api_key}"})
        assert bad_type.status_code == 400 and bad_type.json()["code"] == "bad_request"
        client.auth.connections.delete(connection["id"])
    finally:
        client.credentials.delete("only-mine")
