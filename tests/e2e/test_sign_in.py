"""People sign in with OpenID Connect (`--oidc-issuer`): a real Chromium (the person's
own browser, started here) follows the authorization-code flow with PKCE through a fake
provider (`fake_oidc.py`) and back; the person gets the organization and role their
claims name; a viewer reads but cannot delete a browser, an admin can, and keys a person
makes record them as `created_by`; the audit log names them. Tokens signed with a key
the provider rotated out, from another issuer or expired are refused; a request that
changes anything with the session cookie must come from this server's own pages."""

from __future__ import annotations

import datetime
import json

import httpx
import pytest
from kernel import Kernel
from playwright.sync_api import sync_playwright

from fake_oidc import signing_in_fixtures
from sdk import items, today_only

pytestmark = today_only  # (the sign-in is the same whatever the SDK; the audit log is today's)

CLIENT_ID = "browser-service"
CLIENT_SECRET = "oidc-client-secret-never-shown"
ORG = "people-org"
USERS = {
    "alice": {"email": "alice@example.test", "name": "Alice", "org": ORG, "role": "admin"},
    "vic": {"email": "vic@example.test", "name": "Vic", "org": ORG, "role": ["staff", "viewer"]},
    "nobody": {"email": "nobody@example.test", "org": ORG, "role": "intern"},
}


provider, control_plane = signing_in_fixtures(CLIENT_ID, CLIENT_SECRET, USERS)


@pytest.fixture(scope="module")
def chromium():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def admin_key(control_plane) -> Kernel:
    return Kernel(api_key=control_plane.create_api_key(ORG), base_url=control_plane.base_url, max_retries=0)


def sign_in(chromium, control_plane, user: str):
    """A fresh browser context signed in as `user`; returns (context, page, what the
    page at the end of the flow shows)."""
    context = chromium.new_context()
    page = context.new_page()
    page.goto(f"{control_plane.base_url}/auth/oidc/login?return_to=/auth/context")
    assert "/authorize" in page.url, page.url
    page.fill("#username", user)
    page.click("#sign-in")
    page.wait_for_load_state("networkidle")
    if "/auth/context" in page.url:
        return context, page, json.loads(page.inner_text("body"))
    return context, page, page.inner_text("body")


def fetch(page, method: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
    """A same-origin request from the signed-in page, as the console would make it."""
    answer = page.evaluate("""async ([method, path, body]) => {
        const response = await fetch(path, {method, headers: body ? {'Content-Type': 'application/json'} : {},
                                            body: body ? JSON.stringify(body) : undefined});
        const text = await response.text();
        return [response.status, text];
    }""", [method, path, body])
    status, text = answer
    return status, (json.loads(text) if text else None)


def test_a_viewer_reads_but_cannot_delete_and_an_admin_can(chromium, control_plane, admin_key, provider):
    browser = admin_key.browsers.create(headless=True)
    try:
        context, page, shown = sign_in(chromium, control_plane, "vic")
        assert isinstance(shown, dict), (page.url, shown)
        assert shown["principal"] == {"id": "user-vic", "type": "user"}, shown
        assert shown["person"]["role"] == "viewer" and shown["person"]["email"] == "vic@example.test"
        assert shown["authentication"]["source"] == "oauth" and shown["authentication"]["credential_id"] is None
        assert shown["organization"]["id"]
        cookie = next(c for c in context.cookies() if c["name"] == "kernel_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

        status, listed = fetch(page, "GET", "/browsers")
        assert status == 200 and browser.session_id in [b["session_id"] for b in listed]
        status, refused = fetch(page, "DELETE", f"/browsers/{browser.session_id}")
        assert status == 403 and "browsers:use" in refused["message"], refused
        assert admin_key.browsers.retrieve(browser.session_id).session_id == browser.session_id
        context.close()

        context, page, shown = sign_in(chromium, control_plane, "alice")
        assert shown["person"]["role"] == "admin"
        # A key a person makes names them as its maker.
        status, made = fetch(page, "POST", "/org/api_keys", {"name": "alice's key"})
        assert status == 200 and made["created_by"]["email"] == "alice@example.test", made
        assert made["created_by"]["id"] == "user-alice"
        # The cookie does not work from elsewhere: no same-origin proof, no change.
        session = next(c for c in context.cookies() if c["name"] == "kernel_session")["value"]
        forged = httpx.delete(f"{control_plane.base_url}/browsers/{browser.session_id}",
                              headers={"Cookie": f"kernel_session={session}", "Origin": "https://evil.test"})
        assert forged.status_code == 403
        status, _ = fetch(page, "DELETE", f"/browsers/{browser.session_id}")
        assert status in (200, 204)
        assert browser.session_id not in [b.session_id for b in items(admin_key.browsers.list())]
        # The audit log names the person.
        now = datetime.datetime.now(datetime.timezone.utc)
        entries = list(admin_key.audit_logs.list(start=now - datetime.timedelta(minutes=10),
                                                 end=now + datetime.timedelta(minutes=1)))
        deleted = [e for e in entries if e.method == "DELETE" and browser.session_id in e.path]
        assert any(e.user_id == "user-alice" and e.email == "alice@example.test" and e.auth_strategy == "oidc"
                   for e in deleted), deleted
        # Signing out ends the session.
        assert fetch(page, "POST", "/auth/oidc/logout")[0] == 204
        assert fetch(page, "GET", "/browsers")[0] == 401
        context.close()
    finally:
        try:
            admin_key.browsers.delete_by_id(browser.session_id)
        except Exception:  # noqa: BLE001 (already deleted by the test)
            pass


def test_a_person_without_a_role_of_ours_is_refused(chromium, control_plane):
    context, page, shown = sign_in(chromium, control_plane, "nobody")
    assert "no role" in shown and "/auth/oidc/callback" in page.url
    assert fetch(page, "GET", "/auth/context")[0] == 401
    context.close()


@pytest.mark.parametrize("misbehaviour", ["retired_key", "other_issuer", "expired"])
def test_tokens_the_provider_should_not_have_issued_are_refused(chromium, control_plane, provider, misbehaviour):
    provider.rotate()
    provider.misbehave = misbehaviour
    try:
        context, page, shown = sign_in(chromium, control_plane, "alice")
        assert "not acceptable" in shown, shown
        assert fetch(page, "GET", "/auth/context")[0] == 401
        context.close()
    finally:
        provider.misbehave = None
    # The rotated-in key works at once.
    context, _, shown = sign_in(chromium, control_plane, "alice")
    assert shown["person"]["role"] == "admin"
    context.close()


def test_a_forged_callback_is_refused(control_plane, provider):
    answer = httpx.get(f"{control_plane.base_url}/auth/oidc/callback", params={"code": "x", "state": "y"})
    assert answer.status_code == 400 and "start again" in answer.json()["message"]
    # The client secret never appears in what the server answers.
    login = httpx.get(f"{control_plane.base_url}/auth/oidc/login")
    assert login.status_code == 303 and CLIENT_SECRET not in login.headers["location"]
