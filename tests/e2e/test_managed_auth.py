"""Managed auth (auth connections) through the official SDK, with real browsers against a
real login website on loopback: login flows with form discovery, a site's error message,
success saved into the profile, health checks and re-authentication by itself, delete
during a flow, control-plane restarts, organizations and bad input."""

from __future__ import annotations

import re
import signal
import threading
import time
from datetime import datetime

import httpx
import kernel
import pytest
from kernel import Kernel

from harness import ControlPlane, control_plane_for_module, read_page, serving, session_processes, wait_until
from login_site import PASSWORD, USERNAME, LoginSite
from sdk import SEED_ERA, field, once, today_only


@pytest.fixture(scope="module")
def site():
    yield from serving(LoginSite())


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    yield from control_plane_for_module(tmp_path_factory, extra_args=["--min-health-check-interval", "2"])


class Follower:
    """Follows a connection's events in the background (as a user's app would)."""

    def __init__(self, client: Kernel, connection_id: str):
        self.events = []
        self.ended = threading.Event()

        def follow():
            try:
                for event in client.auth.connections.follow(connection_id):
                    self.events.append(event)
            finally:
                self.ended.set()

        threading.Thread(target=follow, daemon=True).start()

    def states(self):
        return [e for e in self.events if e.event == "managed_auth_state"]

    def wait_for(self, predicate, timeout=60):
        assert wait_until(lambda: any(predicate(e) for e in self.states()), timeout), self.states()


def wait_for_step(client: Kernel, connection_id: str, step: str, timeout: float = 60, **expected):
    found = {}

    def reached():
        found["c"] = client.auth.connections.retrieve(connection_id)
        return found["c"].flow_step == step and all(getattr(found["c"], k) == v for k, v in expected.items())

    assert wait_until(reached, timeout, interval=0.25), found.get("c")
    return found["c"]


def wait_for_success(client: Kernel, connection_id: str, timeout: float = 60):
    found = {}

    def done():
        found["c"] = client.auth.connections.retrieve(connection_id)
        return found["c"].flow_status in ("SUCCESS", "FAILED")

    assert wait_until(done, timeout, interval=0.25), found.get("c")
    assert found["c"].flow_status == "SUCCESS", found["c"]
    return found["c"]


def log_in(client: Kernel, connection_id: str):
    client.auth.connections.login(connection_id)
    wait_for_step(client, connection_id, "AWAITING_INPUT")
    client.auth.connections.submit(connection_id, fields={"username": USERNAME, "password": PASSWORD})
    return wait_for_success(client, connection_id)


def page_text(client: Kernel, profile_name: str, url: str) -> str:
    session = client.browsers.create(headless=True, profile={"name": profile_name})
    try:
        return read_page(session.cdp_ws_url, url, lambda page: page.inner_text("body"))
    finally:
        client.browsers.delete_by_id(session.session_id)


def test_login_flow_discovers_reports_the_site_error_and_logs_the_profile_in(client, control_plane, site):
    connection = client.auth.connections.create(
        domain=site.domain, profile_name="shop", login_url=site.login_url)
    assert connection.status == "NEEDS_AUTH" and connection.flow_status is None
    assert connection.save_credentials is True and connection.health_check_interval == 3600
    assert client.profiles.retrieve("shop").name == "shop"  # created with the connection
    follower = Follower(client, connection.id)

    started = client.auth.connections.login(connection.id)
    assert started.flow_type == "LOGIN" and started.id == connection.id
    assert started.hosted_url.startswith(control_plane.base_url)
    assert started.flow_expires_at.timestamp() > time.time() + 60

    awaiting = wait_for_step(client, connection.id, "AWAITING_INPUT")
    assert awaiting.flow_status == "IN_PROGRESS"
    fields = {f.name: f for f in awaiting.discovered_fields}
    assert set(fields) == {"username", "password"}
    assert (fields["username"].type, fields["username"].label, fields["username"].selector) == ("text", "Username", "#username")
    assert (fields["password"].type, fields["password"].label, fields["password"].selector) == ("password", "Password", "#password")
    # The hosted page shows the same form to a person.
    hosted = httpx.get(started.hosted_url)
    assert hosted.status_code == 200 and 'name="password"' in hosted.text

    assert client.auth.connections.submit(connection.id, fields={"username": USERNAME, "password": "wrong"}).accepted
    rejected = wait_for_step(client, connection.id, "AWAITING_INPUT", website_error="Invalid username or password.")
    assert rejected.flow_status == "IN_PROGRESS"
    assert {f.name for f in rejected.discovered_fields} == {"username", "password"}

    client.auth.connections.submit(connection.id, fields={"username": USERNAME, "password": PASSWORD})
    done = wait_for_success(client, connection.id)
    assert done.status == "AUTHENTICATED" and done.flow_step == "COMPLETED"
    assert done.post_login_url == f"{site.base}/" and done.last_auth_at is not None
    assert done.can_reauth is True
    assert field(done, "can_reauth_reason") == "has_credential" and field(done, "record_session") is False

    # The follower saw every step, in order, and its stream ended with the flow.
    assert follower.ended.wait(10)
    steps = [(e.flow_status, e.flow_step, e.website_error) for e in follower.states()]
    assert steps[0][:2] in (("IN_PROGRESS", "DISCOVERING"), ("IN_PROGRESS", "AWAITING_INPUT"))
    assert ("IN_PROGRESS", "SUBMITTING", None) in steps
    assert ("IN_PROGRESS", "AWAITING_INPUT", "Invalid username or password.") in steps
    assert steps[-1] == ("SUCCESS", "COMPLETED", None)
    awaiting_events = [e for e in follower.states() if e.flow_step == "AWAITING_INPUT"]
    assert {f.name for f in awaiting_events[0].discovered_fields} == {"username", "password"}

    # A new browser with the profile is logged in to the site.
    assert f"Welcome {USERNAME}" in page_text(client, "shop", site.base + "/")

    # The password is in no response, no log and not readable in the database.
    responses = [client.auth.connections.retrieve(connection.id).to_json(),
                 *(c.to_json() for c in client.auth.connections.list())]
    assert not any(PASSWORD in text for text in responses)
    assert PASSWORD.encode() not in (control_plane.data_dir / "control-plane.log").read_bytes()
    for path in control_plane.data_dir.glob("control-plane.db*"):
        assert PASSWORD.encode() not in path.read_bytes(), path
    for log in (control_plane.data_dir / "browsers").glob("*/agent.log"):
        assert PASSWORD.encode() not in log.read_bytes(), log


@once
def test_health_check_notices_an_expired_session_and_reauthenticates_by_itself(client, site):
    connection = client.auth.connections.create(
        domain=site.domain, profile_name="reauth", login_url=site.login_url, health_check_interval=3)
    first = log_in(client, connection.id)
    logins = site.successful_logins
    site.expire_sessions()

    def reauthenticated():
        current = client.auth.connections.retrieve(connection.id)
        return (current.flow_type == "REAUTH" and current.flow_status == "SUCCESS"
                and current.status == "AUTHENTICATED" and current.last_auth_at > first.last_auth_at)

    assert wait_until(reauthenticated, 60, interval=0.5), client.auth.connections.retrieve(connection.id)
    assert site.successful_logins == logins + 1
    assert f"Welcome {USERNAME}" in page_text(client, "reauth", site.base + "/")
    # Its frequent health checks must not disturb the other tests.
    client.auth.connections.delete(connection.id)


@once
def test_without_saved_credentials_a_health_check_sets_needs_auth(client, site):
    connection = client.auth.connections.create(
        domain=site.domain, profile_name="no-save", login_url=site.login_url,
        health_check_interval=2, save_credentials=False)
    assert log_in(client, connection.id).can_reauth is False
    site.expire_sessions()
    assert wait_until(lambda: client.auth.connections.retrieve(connection.id).status == "NEEDS_AUTH", 30)
    current = client.auth.connections.retrieve(connection.id)
    assert current.flow_type == "LOGIN"  # no REAUTH flow without saved values
    client.auth.connections.delete(connection.id)


def update_connection(client: Kernel, connection_id: str, **given) -> dict:
    """`auth.connections.update` today; the seed-era SDK has no such method, so it sends
    `PATCH /auth/connections/{id}` through the client's generic `patch`."""
    if SEED_ERA:
        return client.patch(f"/auth/connections/{connection_id}", body=given, cast_to=object)
    return client.auth.connections.update(connection_id, **given).to_dict(mode="json")


def test_patch_changes_settings_and_the_workflow_follows_them(client, control_plane, site):
    connection = client.auth.connections.create(
        domain=site.domain, profile_name="patched-auth", login_url=site.login_url)
    assert field(connection, "auto_reauth") is True and field(connection, "health_checks") is True
    assert field(connection, "browser")["stealth"] is True
    log_in(client, connection.id)
    try:
        updated = update_connection(client, connection.id, auto_reauth=False, health_check_interval=2,
                                    allowed_domains=["*.example.org"], browser={"stealth": False})
        assert updated["auto_reauth"] is False and updated["health_check_interval"] == 2
        assert updated["allowed_domains"] == ["*.example.org"] and updated["browser"]["stealth"] is False
        # The next check moved to one new interval from now, not an hour away.
        next_check = field(client.auth.connections.retrieve(connection.id), "next_health_check_at")
        next_check = datetime.fromisoformat(re.sub(r"\.\d+", "", next_check).replace("Z", "+00:00"))
        assert time.time() - 1 < next_check.timestamp() < time.time() + 5

        # Without auto_reauth, an expired session only turns NEEDS_AUTH.
        logins = site.successful_logins
        site.expire_sessions()
        assert wait_until(lambda: client.auth.connections.retrieve(connection.id).status == "NEEDS_AUTH", 30)
        time.sleep(3)
        current = client.auth.connections.retrieve(connection.id)
        assert current.flow_type == "LOGIN" and site.successful_logins == logins

        # With it again, the next check logs in again by itself.
        update_connection(client, connection.id, auto_reauth=True)
        assert wait_until(lambda: client.auth.connections.retrieve(connection.id).flow_type == "REAUTH", 30)
        wait_for_success(client, connection.id)
        assert site.successful_logins == logins + 1

        # Without health checks nothing is checked any more.
        stopped = update_connection(client, connection.id, health_checks=False, login_url="")
        assert stopped["health_checks"] is False and stopped["next_health_check_at"] is None
        assert stopped.get("login_url") is None
        site.expire_sessions()
        time.sleep(4)
        assert client.auth.connections.retrieve(connection.id).status == "AUTHENTICATED"

        for body, needle in [({"credential": {"name": "vault-item", "auto": True}}, "credential"),
                             ({"browser": {"region": "eu-west"}}, "browser.region"),
                             ({"browser": {"telemetry": {"enabled": False, "browser": {"page": {"enabled": True}}}}},
                              "enabled=false cannot be combined"),
                             ({"health_check_interval": 1}, "health_check_interval"),
                             ({"login_url": "ftp://example.com/"}, "login_url"),
                             ({"allowed_domains": ["bad domain"]}, "allowed_domains[0]"),
                             ({"browser": {"proxy": {"mode": "direct"}}, "proxy": {"id": "x"}}, "cannot be combined"),
                             ({"unknown": True}, "unknown")]:
            with pytest.raises(kernel.BadRequestError) as bad:
                client.patch(f"/auth/connections/{connection.id}", body=body, cast_to=object)
            text = bad.value.body["message"] + " ".join(d["message"] for d in bad.value.body.get("details") or [])
            assert needle in text, (body, bad.value.body)
        with pytest.raises(kernel.NotFoundError):
            update_connection(client, connection.id, browser={"proxy": {"name": "no-such-proxy"}})
        with pytest.raises(kernel.NotFoundError):
            update_connection(client, connection.id, credential={"name": "no-such-credential"})
        other = Kernel(api_key=control_plane.create_api_key("org-auth-patch"), base_url=control_plane.base_url,
                       max_retries=0)
        with pytest.raises(kernel.NotFoundError):
            update_connection(other, connection.id, auto_reauth=False)
        # Nothing of the refused changes stuck.
        current = client.auth.connections.retrieve(connection.id)
        assert field(current, "auto_reauth") is True and current.health_check_interval == 2
    finally:
        client.auth.connections.delete(connection.id)


def test_delete_during_a_flow_cancels_it_ends_its_browser_and_stops_the_workflow(client, control_plane, site):
    connection = client.auth.connections.create(
        domain=site.domain, profile_name="deleted", login_url=site.login_url, health_check_interval=2)
    before = {b.session_id for b in client.browsers.list()}
    client.auth.connections.login(connection.id)
    wait_for_step(client, connection.id, "AWAITING_INPUT")
    flow_browsers = {b.session_id for b in client.browsers.list()} - before
    assert len(flow_browsers) == 1
    flow_browser = flow_browsers.pop()
    processes = session_processes(control_plane, flow_browser)
    assert processes["chromium"]
    follower = Follower(client, connection.id)
    follower.wait_for(lambda e: e.flow_step == "AWAITING_INPUT")
    # A waiting follower hears heartbeats (every 5 s).
    assert wait_until(lambda: any(e.event == "sse_heartbeat" for e in follower.events), 8)

    client.auth.connections.delete(connection.id)
    follower.wait_for(lambda e: e.flow_status == "CANCELED", timeout=10)
    assert follower.ended.wait(10)
    gone = set().union(*processes.values())
    assert wait_until(lambda: not any(_alive(pid) for pid in gone), 10)
    assert client.browsers.retrieve(flow_browser, include_deleted=True).deleted_at is not None
    with pytest.raises(kernel.NotFoundError):
        client.auth.connections.retrieve(connection.id)
    with pytest.raises(kernel.NotFoundError):
        client.auth.connections.delete(connection.id)
    # No more health checks: no browser is started for it and the site hears nothing.
    sessions = len(client.browsers.list(status="all", limit=100).items)
    requests = site.requests
    time.sleep(5)
    assert len(client.browsers.list(status="all", limit=100).items) == sessions
    assert site.requests == requests


def _alive(pid: int) -> bool:
    from harness import is_alive
    return is_alive(pid)


@once
def test_a_restart_during_a_flow_and_between_health_checks_loses_nothing(tmp_path, site):
    server = ControlPlane(tmp_path / "data", extra_args=["--min-health-check-interval", "2"]).start()
    try:
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        connection = client.auth.connections.create(
            domain=site.domain, profile_name="durable", login_url=site.login_url, health_check_interval=4)
        client.auth.connections.login(connection.id)
        wait_for_step(client, connection.id, "AWAITING_INPUT")

        server.stop(signal.SIGKILL)
        server.start()
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        resumed = wait_for_step(client, connection.id, "AWAITING_INPUT")
        assert resumed.flow_status == "IN_PROGRESS" and resumed.flow_type == "LOGIN"
        client.auth.connections.submit(connection.id, fields={"username": USERNAME, "password": PASSWORD})
        first = wait_for_success(client, connection.id)
        logins = site.successful_logins

        # Between health checks: the schedule and the saved values survive the restart.
        server.stop(signal.SIGTERM)
        site.expire_sessions()
        server.start()
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)

        def reauthenticated():
            current = client.auth.connections.retrieve(connection.id)
            return current.flow_type == "REAUTH" and current.flow_status == "SUCCESS" \
                and current.last_auth_at > first.last_auth_at

        assert wait_until(reauthenticated, 60, interval=0.5), client.auth.connections.retrieve(connection.id)
        assert site.successful_logins == logins + 1
    finally:
        server.reap_everything()


@today_only
def test_a_connections_browsers_carry_its_telemetry(client, site):
    with pytest.raises(kernel.BadRequestError):
        client.auth.connections.create(domain=site.domain, profile_name="telemetry-bad",
                                       browser={"telemetry": {"enabled": False, "browser": {"page": {"enabled": True}}}})
    with pytest.raises(kernel.NotFoundError):
        client.auth.connections.create(domain=site.domain, profile_name="telemetry-bad",
                                       browser={"telemetry": {"enabled": True, "export": {"otlp": {"destination": {"name": "nope"}}}}})
    connection = client.auth.connections.create(
        domain=site.domain, profile_name="telemetry", login_url=site.login_url,
        browser={"telemetry": {"browser": {"page": {"enabled": True}}}})
    try:
        shown = connection.to_dict(mode="json")["browser"]["telemetry"]["browser"]
        assert shown["page"]["enabled"] and shown["control"]["enabled"] and not shown["console"]["enabled"]
        client.auth.connections.login(connection.id)
        wait_for_step(client, connection.id, "AWAITING_INPUT")
        flow_browsers = [b for b in client.browsers.list() if b.telemetry is not None]
        assert len(flow_browsers) == 1 and flow_browsers[0].telemetry.browser.page.enabled
        navigations = [e.event.to_dict(mode="json") for e in client.browsers.telemetry.events(
            flow_browsers[0].session_id, category=["page"], since="1h", limit=100)]
        assert any(e["type"] == "page_navigation" and e["data"]["url"].startswith(site.login_url)
                   for e in navigations), navigations
        updated = update_connection(client, connection.id, browser_telemetry={})
        assert updated["browser"].get("telemetry") is None
    finally:
        client.auth.connections.delete(connection.id)


def test_another_organization_cannot_see_or_touch_a_connection(client, control_plane, site):
    mine = client.auth.connections.create(domain=site.domain, profile_name="private-auth", login_url=site.login_url)
    other = Kernel(api_key=control_plane.create_api_key("org-auth-b"), base_url=control_plane.base_url, max_retries=0)
    assert list(other.auth.connections.list()) == []
    for call in (lambda: other.auth.connections.retrieve(mine.id),
                 lambda: other.auth.connections.login(mine.id),
                 lambda: other.auth.connections.submit(mine.id, fields={"username": "x"}),
                 lambda: list(other.auth.connections.follow(mine.id)),
                 lambda: other.auth.connections.delete(mine.id)):
        with pytest.raises(kernel.NotFoundError):
            call()
    with pytest.raises(kernel.NotFoundError):
        other.browsers.create(headless=True, profile={"name": "private-auth"})
    assert client.auth.connections.retrieve(mine.id).id == mine.id


def test_lists_filter_and_page(client, site):
    created = [client.auth.connections.create(domain=f"filter{i}.example", profile_name="listed-auth")
               for i in range(3)]
    assert [c.id for c in client.auth.connections.list(profile_name="listed-auth")] == [c.id for c in created]
    assert [c.id for c in client.auth.connections.list(domain="filter1.example")] == [created[1].id]
    page = client.auth.connections.list(profile_name="listed-auth", limit=2)
    assert len(page.items) == 2 and page.has_next_page()
    # The profile of a connection cannot be deleted under it.
    with pytest.raises(kernel.ConflictError):
        client.profiles.delete("listed-auth")


def test_bad_input_answers_the_error_shape(client, site):
    bad_creates = [
        {"profile_name": "p"},
        {"domain": site.domain},
        {"domain": "https://example.com", "profile_name": "p"},
        {"domain": "example.com/login", "profile_name": "p"},
        {"domain": "example.com", "profile_name": ""},
        {"domain": "example.com", "profile_name": "p", "login_url": "ftp://example.com/"},
        {"domain": "example.com", "profile_name": "p", "health_check_interval": 1},
        {"domain": "example.com", "profile_name": "p", "health_check_interval": 86401},
        {"domain": "example.com", "profile_name": "p", "allowed_domains": ["bad domain"]},
        {"domain": "example.com", "profile_name": "p", "credential": {"path": "Vault/Item"}},
        {"domain": "example.com", "profile_name": "p", "unknown": True},
    ]
    for body in bad_creates:
        with pytest.raises(kernel.BadRequestError) as bad:
            client.post("/auth/connections", body=body, cast_to=object)
        assert bad.value.body["code"] == "bad_request", body
    # A proxy that does not exist is a 404, as the proxy's own routes answer.
    with pytest.raises(kernel.NotFoundError):
        client.post("/auth/connections", body={"domain": "example.com", "profile_name": "p",
                                               "proxy": {"id": "nope"}}, cast_to=object)
    connection = client.auth.connections.create(domain=site.domain, profile_name="bad-input", login_url=site.login_url)
    with pytest.raises(kernel.ConflictError):
        client.auth.connections.create(domain=site.domain, profile_name="bad-input")
    with pytest.raises(kernel.ConflictError):  # no flow to submit to
        client.auth.connections.submit(connection.id, fields={"username": "x"})
    client.auth.connections.login(connection.id)
    with pytest.raises(kernel.ConflictError):  # one flow at a time
        client.auth.connections.login(connection.id)
    wait_for_step(client, connection.id, "AWAITING_INPUT")
    for fields in ({}, {"nope": "x", "password": "y"}, {"username": "only"}, {"username": "a", "password": "\0"}):
        with pytest.raises(kernel.BadRequestError):
            client.auth.connections.submit(connection.id, fields=fields)
    with pytest.raises(kernel.BadRequestError):
        client.post(f"/auth/connections/{connection.id}/submit", body={"fields": {"username": 1}}, cast_to=object)
    with pytest.raises(kernel.NotFoundError):
        client.auth.connections.retrieve("auth_missing")
    denied = httpx.get(f"{str(client.base_url).rstrip('/')}/auth/connections/{connection.id}/hosted?jwt=forged")
    assert denied.status_code == 401
    client.auth.connections.delete(connection.id)


@once
def test_a_person_completes_the_login_through_the_flows_live_view(client, site):
    """Login flows run headful: their `live_view_url` shows the flow's browser, and what
    a person does there (here: the whole sign-in, by keyboard) completes the flow."""
    from playwright.sync_api import sync_playwright

    connection = client.auth.connections.create(domain=site.domain, profile_name="by-hand", login_url=site.login_url)
    started = client.auth.connections.login(connection.id)
    live_view_url = field(started, "live_view_url")
    assert live_view_url and f"/auth/connections/{connection.id}/live?jwt=" in live_view_url
    awaiting = wait_for_step(client, connection.id, "AWAITING_INPUT")
    assert field(awaiting, "live_view_url").split("?")[0] == live_view_url.split("?")[0]
    # The hosted page embeds it.
    assert f"/auth/connections/{connection.id}/live?jwt=" in httpx.get(started.hosted_url).text
    # Another connection's link does not open this one's browser, nor does the link to
    # the hosted form.
    forged = live_view_url.replace(connection.id, "nope")
    assert httpx.get(forged).status_code == 401
    assert httpx.get(started.hosted_url.replace("/hosted?", "/live?")).status_code == 401

    logins_before = site.successful_logins
    with sync_playwright() as playwright:
        viewer_browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            viewer = viewer_browser.new_page(viewport={"width": 1280, "height": 800})
            viewer.goto(live_view_url)
            viewer.wait_for_function("() => window.liveView.frames > 0", timeout=15_000)
            # Click into the page (below the browser's toolbar), then Tab to the first
            # field and type, as a person would.
            box = viewer.locator("#screen").bounding_box()
            viewer.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.8)
            viewer.keyboard.press("Tab")
            viewer.keyboard.type(USERNAME)
            viewer.keyboard.press("Tab")
            viewer.keyboard.type(PASSWORD)
            viewer.keyboard.press("Enter")
            done = wait_for_success(client, connection.id, timeout=30)
        finally:
            viewer_browser.close()
    assert done.status == "AUTHENTICATED"
    assert site.successful_logins == logins_before + 1
    assert f"Welcome {USERNAME}" in page_text(client, "by-hand", site.base + "/")
    # The flow is over: its live view is gone.
    assert httpx.get(live_view_url).status_code in (401, 404)
    client.auth.connections.delete(connection.id)
