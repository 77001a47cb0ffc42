"""The web console at `/console`, driven in a real Chromium with Playwright: a key signs in
through the form, creates a browser, sees it listed with a live thumbnail, opens it,
watches its live view follow what the SDK does to the page, records and plays back a
replay, reads a console error in the inspector, and stops it. Another project's and
another organization's browsers are 404 pages; a viewer (signed in with OpenID Connect)
sees no button that changes anything and the API refuses when forced; the pages carry a
strict Content-Security-Policy, refuse cross-site posts, keep the session in an HttpOnly
SameSite=Strict cookie that signing out ends on the server; axe-core finds no serious or
critical accessibility violation on any page. Screenshots of each page go to
`tests/e2e/artifacts/console-*.png`."""

from __future__ import annotations

import io
import os
import secrets
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from kernel import Kernel
from PIL import Image
from playwright.sync_api import Page, expect

from fake_oidc import signing_in_fixtures
from harness import serving
from login_site import PASSWORD, USERNAME, LoginSite
from sdk import today_only

pytestmark = today_only  # (the console is the same whatever the SDK; the tests use today's)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("E2E_ARTIFACTS", REPO / "tests" / "e2e" / "artifacts"))
AXE = REPO / "tests" / "e2e" / "node-clients" / "node_modules" / "axe-core" / "axe.min.js"
ORG = "console-org"
CLIENT_ID = "console"
CLIENT_SECRET = "console-oidc-secret"
USERS = {"vic": {"email": "vic@example.test", "name": "Vic", "org": ORG, "role": "viewer"}}


provider, control_plane = signing_in_fixtures(CLIENT_ID, CLIENT_SECRET, USERS)


@pytest.fixture(scope="module")
def admin_key(control_plane) -> str:
    return control_plane.create_api_key(ORG)


@pytest.fixture(scope="module")
def client(control_plane, admin_key) -> Kernel:
    return Kernel(api_key=admin_key, base_url=control_plane.base_url, max_retries=0)


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), full_page=True)


def sign_in_with_key(local_chromium, control_plane, key: str, **context_options):
    context = local_chromium.new_context(**context_options)
    page = context.new_page()
    page.goto(f"{control_plane.base_url}/console")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.fill("#api-key", key)
    page.get_by_role("button", name="Sign in with the key").click()
    expect(page.get_by_role("heading", name="Browsers", exact=True)).to_be_visible()
    return context, page


def redness(png: bytes) -> float:
    """The share of clearly red pixels in a screenshot."""
    data = Image.open(io.BytesIO(png)).convert("RGB").resize((64, 36)).tobytes()
    pixels = list(zip(data[0::3], data[1::3], data[2::3]))
    return sum(1 for r, g, b in pixels if r > 180 and g < 80 and b < 80) / len(pixels)


def test_a_key_runs_a_browser_from_the_console(playwright, local_chromium, control_plane, admin_key, client):
    context, page = sign_in_with_key(local_chromium, control_plane, admin_key)
    try:
        cookie = next(c for c in context.cookies() if c["name"] == "kernel_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert admin_key not in cookie["value"]
        shot(page, "sessions-empty")

        # Create a headful browser that captures telemetry.
        page.get_by_text("New browser").click()
        page.get_by_label("Name (optional)").fill("console-e2e")
        page.get_by_role("button", name="Create").click()
        page.wait_for_url("**/console/sessions/*", timeout=60_000)
        session_id = page.url.rsplit("/", 1)[1]
        assert client.browsers.retrieve(session_id).name == "console-e2e"
        expect(page.locator("#live-view")).to_be_visible()

        # Listed, with a thumbnail of its screen within 5 seconds.
        page.get_by_role("link", name="Browsers", exact=True).first.click()
        row = page.locator(f'tr[data-session="{session_id}"]')
        expect(row).to_contain_text("console-e2e")
        expect(row).to_contain_text("running")
        page.wait_for_function(
            f"""() => {{ const img = document.querySelector('img[data-thumb="{session_id}"]');
                        return img && img.complete && img.naturalWidth > 0; }}""", timeout=5_000)
        shot(page, "sessions")

        # Its page: the live view follows what the SDK does to the page.
        row.get_by_role("link", name="console-e2e").click()
        expect(page.get_by_role("heading", level=1)).to_contain_text("console-e2e")
        live = page.locator("#live-view")
        page.frame_locator("#live-view").locator("canvas").first.wait_for(timeout=15_000)
        cdp = playwright.chromium.connect_over_cdp(client.browsers.retrieve(session_id).cdp_ws_url)
        target = cdp.contexts[0].pages[0] if cdp.contexts[0].pages else cdp.contexts[0].new_page()
        before = redness(live.screenshot())
        target.goto("data:text/html,<body style='margin:0;background:rgb(230,0,0)'>"
                    "<script>console.error('console-e2e-marker')</script>")
        deadline = time.monotonic() + 15
        while redness(live.screenshot()) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.3)
        after = redness(live.screenshot())
        assert before < 0.3 <= after, (before, after)
        cdp.close()
        shot(page, "session-live")

        # The VM's service logs, followed live, and a command run in the VM.
        expect(page.locator("#log-tail")).not_to_be_empty(timeout=15_000)
        page.get_by_label("Command line (runs in sh -c)").fill("echo console-$((6*7))")
        page.get_by_role("button", name="Run").click()
        expect(page.locator("#command-output")).to_contain_text("exit 0")
        expect(page.locator("#command-output")).to_contain_text("console-42")

        # Record, stop, play back: the video element advances.
        page.get_by_role("button", name="Start recording").click()
        stop = page.get_by_role("button", name="Stop recording")
        expect(stop).to_be_visible()
        time.sleep(3)
        stop.click()
        video = page.locator("video").first
        expect(video).to_be_visible(timeout=30_000)
        video.evaluate("v => { v.muted = true; return v.play(); }")
        page.wait_for_function("() => document.querySelector('video').currentTime > 0.5", timeout=15_000)

        # The inspector shows the page's console error.
        inspector = page.frame_locator("#inspector")
        expect(inspector.get_by_text("console-e2e-marker").first).to_be_visible(timeout=20_000)
        shot(page, "session-replay-inspector")

        # Rename and tag it (PATCH): the page and the API show it.
        page.get_by_text("Edit name, tags and viewport").click()
        page.get_by_label("Name", exact=True).fill("console-e2e-renamed")
        page.get_by_label("Tags (key=value, comma separated)").fill("team=qa")
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_role("heading", level=1)).to_contain_text("console-e2e-renamed")
        renamed = client.browsers.retrieve(session_id)
        assert renamed.name == "console-e2e-renamed" and renamed.tags == {"team": "qa"}

        # Stop it: the page says so, and the API agrees.
        page.get_by_role("button", name="Stop the browser").click()
        expect(page.get_by_role("heading", level=1)).to_contain_text("ended", timeout=30_000)
        assert session_id not in [b.session_id for b in client.browsers.list()]
    finally:
        context.close()


def test_team_page_shows_a_new_keys_secret_once(local_chromium, control_plane, admin_key):
    context, page = sign_in_with_key(local_chromium, control_plane, admin_key)
    try:
        page.get_by_role("link", name="Team").click()
        # A project, and a key bound to it.
        page.get_by_label("Project name").fill("console-team")
        page.get_by_role("button", name="Create project").click()
        expect(page.get_by_role("cell", name="console-team", exact=True)).to_be_visible()
        page.get_by_label("Name", exact=True).fill("made-in-console")
        page.get_by_label("Project", exact=True).select_option(label="console-team")
        page.get_by_role("button", name="Create key").click()
        secret = page.locator("#new-secret").inner_text()
        assert secret.startswith("sk_") or len(secret) > 20
        made = httpx.get(f"{control_plane.base_url}/browsers", headers={"Authorization": f"Bearer {secret}"})
        assert made.status_code == 200
        context_of_key = httpx.get(f"{control_plane.base_url}/auth/context",
                                   headers={"Authorization": f"Bearer {secret}"}).json()
        project_id = context_of_key["authorization"]["credential_scope"]["project_id"]
        assert project_id
        expect(page.get_by_role("row").filter(has_text=project_id)).to_contain_text("console-team")
        shot(page, "team")
        page.reload()
        expect(page.locator("#new-secret")).to_have_count(0)
        expect(page.get_by_role("cell", name="made-in-console")).to_be_visible()
    finally:
        context.close()


def test_foreign_browsers_are_not_found(local_chromium, control_plane, client):
    other_org = Kernel(api_key=control_plane.create_api_key("console-other-org"),
                       base_url=control_plane.base_url, max_retries=0)
    elsewhere = other_org.browsers.create(headless=True)
    other_project = Kernel(api_key=control_plane.create_api_key(ORG, project="console-side-project"),
                           base_url=control_plane.base_url, max_retries=0)
    side = other_project.browsers.create(headless=True)
    default_key = control_plane.create_api_key(ORG, project="default")
    context, page = sign_in_with_key(local_chromium, control_plane, default_key)
    try:
        listed = page.locator("tr[data-session]").evaluate_all("rows => rows.map(r => r.dataset.session)")
        assert elsewhere.session_id not in listed and side.session_id not in listed
        for foreign in (elsewhere.session_id, side.session_id):
            page.goto(f"{control_plane.base_url}/console/sessions/{foreign}")
            expect(page.get_by_role("heading", name="Not found")).to_be_visible()
            assert page.request.get(f"{control_plane.base_url}/console/thumbnails/{foreign}").status == 404
        shot(page, "not-found")
    finally:
        context.close()
        other_org.browsers.delete_by_id(elsewhere.session_id)
        other_project.browsers.delete_by_id(side.session_id)


def test_a_viewer_sees_but_cannot_change(local_chromium, control_plane, client):
    browser = client.browsers.create(headless=True, name="for-the-viewer")
    context = local_chromium.new_context()
    page = context.new_page()
    try:
        page.goto(f"{control_plane.base_url}/console")
        page.get_by_role("link", name="Sign in with your identity provider").click()
        page.fill("#username", "vic")
        page.click("#sign-in")
        expect(page.get_by_role("heading", name="Browsers", exact=True)).to_be_visible()
        expect(page.get_by_text("Vic (viewer)")).to_be_visible()
        expect(page.get_by_text("New browser")).to_have_count(0)
        page.get_by_role("link", name="for-the-viewer").click()
        expect(page.get_by_role("heading", level=1)).to_contain_text("for-the-viewer")
        for button in ("Stop the browser", "Start recording"):
            expect(page.get_by_role("button", name=button)).to_have_count(0)
        expect(page.get_by_text("Edit name, tags and viewport")).to_have_count(0)
        shot(page, "viewer")
        forced = page.evaluate("""async id => (await fetch('/browsers/' + id, {method: 'DELETE'})).status""",
                               browser.session_id)
        assert forced == 403
        assert client.browsers.retrieve(browser.session_id).session_id == browser.session_id
    finally:
        context.close()
        client.browsers.delete_by_id(browser.session_id)


def test_security_headers_forgery_and_signing_out(local_chromium, control_plane, admin_key, client):
    shell = httpx.get(f"{control_plane.base_url}/console")
    policy = shell.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
    assert "<script>" not in shell.text and "<script " not in shell.text.replace('<script type="module" src=', "")
    # Signing in from another site is refused (it could sign a visitor in as someone else).
    forged_sign_in = httpx.post(f"{control_plane.base_url}/console/sign-in", data={"api_key": admin_key},
                                headers={"Origin": "https://evil.test", "Sec-Fetch-Site": "cross-site"})
    assert forged_sign_in.status_code == 403 and "set-cookie" not in forged_sign_in.headers
    # A sign-in without a key is a 400 in the Error shape; a wrong key starts no session.
    ours = {"Origin": control_plane.base_url, "Sec-Fetch-Site": "same-origin"}
    for body in ({}, {"api_key": "  "}):
        empty = httpx.post(f"{control_plane.base_url}/console/sign-in", data=body, headers=ours)
        assert empty.status_code == 400 and "api_key" in empty.json()["message"], empty.text
    wrong = httpx.post(f"{control_plane.base_url}/console/sign-in", data={"api_key": "sk_nope_nope"}, headers=ours)
    assert wrong.status_code == 303 and "sign_in=invalid" in wrong.headers["location"]
    assert "set-cookie" not in wrong.headers

    context, page = sign_in_with_key(local_chromium, control_plane, admin_key)
    try:
        secret = next(c for c in context.cookies() if c["name"] == "kernel_session")["value"]
        cookie = {"Cookie": f"kernel_session={secret}"}
        # A cross-site form post with the cookie changes nothing.
        forged = httpx.post(f"{control_plane.base_url}/browsers", content="headless=true",
                            headers={**cookie, "Content-Type": "application/x-www-form-urlencoded",
                                     "Origin": "https://evil.test", "Sec-Fetch-Site": "cross-site"})
        assert forged.status_code == 403, forged.text
        assert httpx.get(f"{control_plane.base_url}/console/me", headers=cookie).status_code == 200
        # Signing out ends the session on the server: the old cookie is worth nothing.
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        assert httpx.get(f"{control_plane.base_url}/console/me", headers=cookie).status_code == 401
        assert httpx.get(f"{control_plane.base_url}/browsers", headers=cookie).status_code == 401
    finally:
        context.close()


def test_pages_have_no_serious_accessibility_violations(local_chromium, control_plane, admin_key, client):
    browser = client.browsers.create(headless=True, name="for-axe")
    # Injecting axe-core needs the page's own policy set aside (in the test only).
    context, page = sign_in_with_key(local_chromium, control_plane, admin_key, bypass_csp=True)
    try:
        pages = {"sessions": "/console/sessions", "session": f"/console/sessions/{browser.session_id}",
                 "team": "/console/team", "audit": "/console/team/audit", "pools": "/console/pools",
                 "profiles": "/console/profiles", "deployments": "/console/deployments",
                 "invocations": "/console/invocations", "credentials": "/console/credentials",
                 "proxies": "/console/proxies", "auth-connections": "/console/auth-connections"}
        found = {}
        for name, path in pages.items():
            page.goto(f"{control_plane.base_url}{path}")
            page.wait_for_load_state("networkidle")
            page.evaluate("() => document.querySelectorAll('details').forEach(d => { d.open = true; })")  # the forms too
            page.add_script_tag(path=str(AXE))
            violations = page.evaluate("""async () => (await axe.run(document, {iframes: false})).violations
                .filter(v => v.impact === 'serious' || v.impact === 'critical')
                .map(v => v.id + ': ' + v.nodes.map(n => n.target.join(' ')).slice(0, 3).join(', '))""")
            if violations:
                found[name] = violations
        context.clear_cookies()
        page.goto(f"{control_plane.base_url}/console")
        page.add_script_tag(path=str(AXE))
        sign_in_violations = page.evaluate("""async () => (await axe.run()).violations
            .filter(v => v.impact === 'serious' || v.impact === 'critical').map(v => v.id)""")
        if sign_in_violations:
            found["sign-in"] = sign_in_violations
        assert found == {}, found
    finally:
        context.close()
        client.browsers.delete_by_id(browser.session_id)


def test_resources_are_made_and_changed_in_forms_whose_secrets_stay_write_only(local_chromium, control_plane, admin_key, client):
    password = f"pw-{secrets.token_hex(8)}"
    totp_seed = "JBSWY3DPEHPK3PXP"
    base = control_plane.base_url
    context, page = sign_in_with_key(local_chromium, control_plane, admin_key)
    try:
        # A credential: its secrets go in, and never come back out.
        page.goto(f"{base}/console/credentials")
        page.get_by_text("New credential").click()
        new = page.get_by_role("form", name="New credential")
        new.get_by_label("Name", exact=True).fill("console-credential")
        new.get_by_label("Domain", exact=True).fill("example.test")
        new.get_by_label("Username", exact=True).fill("alice")
        new.get_by_label("Password (write-only)").fill(password)
        new.get_by_label("TOTP secret (write-only)").fill(totp_seed)
        new.get_by_role("button", name="Create").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("console-credential")
        made = client.credentials.retrieve("console-credential")
        assert made.domain == "example.test" and made.has_values and made.has_totp_secret
        page.get_by_text("Edit the credential").click()
        edit = page.get_by_role("form", name="Edit the credential")
        assert edit.get_by_label("New password", exact=False).input_value() == ""
        assert edit.get_by_label("New TOTP secret", exact=False).input_value() == ""
        assert password not in page.content() and totp_seed not in page.content()
        edit.get_by_label("Name", exact=True).fill("console-credential-2")
        edit.get_by_role("button", name="Save").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("console-credential-2")
        # Renamed; the secrets the empty inputs left alone still work.
        assert client.credentials.retrieve(made.id).name == "console-credential-2"
        assert client.credentials.totp_code(made.id).code.isdigit()
        shot(page, "credential")

        # A pool: made, changed and deleted through its forms.
        page.goto(f"{base}/console/pools")
        page.get_by_text("New pool").click()
        new = page.get_by_role("form", name="New pool")
        new.get_by_label("Name", exact=True).fill("console-pool")
        new.get_by_label("Size (browsers kept ready)").fill("1")
        new.get_by_label("Headless", exact=True).check()
        new.get_by_role("button", name="Create").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("console-pool")
        pool = client.browser_pools.retrieve("console-pool")
        assert pool.browser_pool_config.size == 1 and pool.browser_pool_config.headless
        page.get_by_text("Edit the pool").click()
        edit = page.get_by_role("form", name="Edit the pool")
        expect(edit.get_by_label("Headless", exact=True)).to_be_checked()
        edit.get_by_label("Fill rate (browsers per minute)").fill("7")
        edit.get_by_role("button", name="Save").click()
        expect(page.get_by_text('"fill_rate_per_minute":7')).to_be_visible()
        assert client.browser_pools.retrieve("console-pool").browser_pool_config.fill_rate_per_minute == 7
        shot(page, "pool")
        page.get_by_role("button", name="Delete").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Pools")
        assert all(p.name != "console-pool" for p in client.browser_pools.list())
    finally:
        context.close()
        for credential in client.credentials.list():
            if credential.name.startswith("console-credential"):
                client.credentials.delete(credential.id)


@pytest.fixture(scope="module")
def login_site():
    yield from serving(LoginSite())


def test_an_auth_connections_login_is_watched_live_and_kept_in_its_timeline(local_chromium, control_plane, admin_key,
                                                                             client, login_site):
    connection = client.auth.connections.create(domain=login_site.domain, profile_name="console-login",
                                                login_url=login_site.login_url)
    context, page = sign_in_with_key(local_chromium, control_plane, admin_key)
    try:
        page.goto(f"{control_plane.base_url}/console/auth-connections")
        page.get_by_role("link", name=login_site.domain).click()
        expect(page.get_by_text("No logins or health checks yet.")).to_be_visible()
        page.get_by_role("button", name="Log in now").click()
        # The flow's browser, live, while it waits for the person's input.
        expect(page.locator("#login-status")).to_contain_text("awaiting_input", timeout=60_000)
        page.frame_locator("#login-view").locator("canvas").first.wait_for(timeout=15_000)
        shot(page, "auth-connection-login")
        client.auth.connections.submit(connection.id, fields={"username": USERNAME, "password": PASSWORD})
        # The page follows the flow to its end, then shows it in the timeline.
        expect(page.locator("#login-status")).to_contain_text("AUTHENTICATED", timeout=60_000)
        timeline = page.get_by_role("region", name="Timeline")
        expect(timeline.get_by_role("row").filter(has_text="login")).to_contain_text("SUCCESS")
        expect(page.locator("#login-view")).to_have_count(0)
        assert login_site.successful_logins == 1
        shot(page, "auth-connection-timeline")
    finally:
        context.close()
        client.auth.connections.delete(connection.id)


def test_the_host_page_is_for_the_hosts_operators_only(local_chromium, control_plane, admin_key, client):
    browser = client.browsers.create(headless=True, name="seen-by-the-operator")
    # The server's first key is the operator organization's (`default`) and unrestricted.
    context, page = sign_in_with_key(local_chromium, control_plane, control_plane.api_key)
    try:
        page.get_by_role("link", name="Host", exact=True).click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Host")
        # Every organization's live VMs, this one's included; the replica and its duties.
        expect(page.get_by_role("region", name="Live VMs", exact=False)).to_contain_text(browser.session_id)
        replicas = page.get_by_role("region", name="Replicas and duties")
        expect(replicas).to_contain_text("(this one)")
        expect(replicas).to_contain_text("pool-reconciler")
        expect(page.get_by_role("region", name="Isolation")).to_contain_text("sandbox")
        shot(page, "host")
    finally:
        context.close()
    # A key of the operator organization bound to one project is no operator.
    bound = control_plane.create_api_key("default", project="ops-side")
    refused = httpx.get(f"{control_plane.base_url}/console/host-report", headers={"Authorization": f"Bearer {bound}"})
    assert refused.status_code == 403 and "default" not in refused.json()["message"], refused.text
    # Another organization's admin sees no host page, and the API refuses it.
    context, page = sign_in_with_key(local_chromium, control_plane, admin_key)
    try:
        expect(page.get_by_role("link", name="Team", exact=True)).to_be_visible()
        expect(page.get_by_role("link", name="Host", exact=True)).to_have_count(0)
        status = page.evaluate("async () => (await fetch('/console/host-report')).status")
        assert status == 403
        page.goto(f"{control_plane.base_url}/console/host")
        expect(page.get_by_role("heading", level=1)).to_have_text("Something went wrong")
    finally:
        context.close()
        client.browsers.delete_by_id(browser.session_id)


def statements(response: httpx.Response) -> int:
    """The statements the request sent to the store, from its `Server-Timing` header."""
    timing = response.headers["server-timing"]
    assert timing.startswith("store;desc=") and timing.endswith(' statements"'), timing
    return int(timing.split('"')[1].split()[0])


def test_a_page_of_browsers_costs_the_same_statements_whatever_its_length(control_plane, client):
    """No N+1: the browser list reads its page in one query, plus one per distinct
    profile (or pool) on it, however many browsers share them."""
    client.profiles.create(name="listed-profile")
    template = client.browsers.create(headless=True, profile={"name": "listed-profile"})
    client.browsers.delete_by_id(template.session_id)
    # 150 more ended browsers with the same profile: rows, as the list reads them.
    database = sqlite3.connect(control_plane.data_dir / "control-plane.db", timeout=30)
    database.row_factory = sqlite3.Row
    row = dict(database.execute("SELECT * FROM browser_sessions WHERE id = ?", (template.session_id,)).fetchone())
    with database:
        for n in range(150):
            copy = dict(row, id=f"listed{n:04d}{template.session_id[:8]}")
            database.execute(f"INSERT INTO browser_sessions ({', '.join(copy)}) VALUES ({', '.join('?' for _ in copy)})",
                             list(copy.values()))
    database.close()
    api = httpx.Client(base_url=control_plane.base_url, headers={"Authorization": f"Bearer {client.api_key}"})
    # Each asked twice in a row, the second counted: the key's lookup is cached for 2 s,
    # so the second finds it there whatever the time since the last call.
    one, many = [[api.get("/browsers", params={"status": "deleted", "limit": limit}).raise_for_status()
                  for _ in range(2)][-1] for limit in (1, 100)]
    assert len(one.json()) == 1 and len(many.json()) == 100
    assert all(b["profile"]["name"] == "listed-profile" for b in many.json())
    assert statements(one) == statements(many), (one.headers["server-timing"], many.headers["server-timing"])
    assert statements(many) <= 10, many.headers["server-timing"]
