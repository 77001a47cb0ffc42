"""API keys over HTTP with today's SDK (`api_keys`, `auth.context`): keys made, listed,
renamed, rotated and deleted by other keys; policies that allow only some actions, checked
on every route, with a 403 naming what is missing; no key can make or reach a key with more
rights than its own; expiry, last use, soft deletion; another organization sees none of it.
"""

from __future__ import annotations

import base64
import datetime
import json
import subprocess
import time

import httpx
import pytest
from kernel import AuthenticationError, BadRequestError, ConflictError, Kernel, NotFoundError, PermissionDeniedError
from playwright.sync_api import sync_playwright

from harness import CONTROL_PLANE, first_tab, wait_until
from sdk import field, items, today_only

pytestmark = today_only

BROWSERS_ONLY = {"statements": [{"action": "browsers:use", "resource": "projects/*/browsers/*"}]}


def as_key(control_plane, key: str) -> Kernel:
    return Kernel(api_key=key, base_url=control_plane.base_url, max_retries=0)


def test_a_key_made_over_the_api_works_and_its_secret_is_shown_once(client, control_plane):
    made = client.api_keys.create(name="ci runner", days_to_expire=30)
    assert made.key.startswith(f"sk_{made.id}_")
    assert made.masked_key.endswith(made.key[-4:]) and made.key not in made.masked_key
    assert made.name == "ci runner" and made.policy is None and made.project_id is None
    assert made.expires_at is not None
    days_left = (made.expires_at - datetime.datetime.now(datetime.timezone.utc)).days
    assert days_left in (29, 30)
    assert made.created_by.id  # the key that made it

    kept = client.api_keys.retrieve(made.id)
    assert kept.masked_key == made.masked_key
    assert not hasattr(kept, "key") or getattr(kept, "key", None) is None
    assert field(kept, "last_used_at") is None
    assert made.id in [key.id for key in items(client.api_keys.list())]

    new = as_key(control_plane, made.key)
    assert items(new.browsers.list()) is not None
    context = new.auth.context.retrieve()
    assert context.principal.id == made.id and context.principal.type == "api_key"
    assert context.authentication.credential_id == made.id
    assert context.authentication.method == "api_key"
    assert context.authorization.credential_scope.project_id is None
    # `last_used_at` is written in the background, right after the first use.
    assert wait_until(lambda: field(client.api_keys.retrieve(made.id), "last_used_at") is not None, 10)

    renamed = client.api_keys.update(made.id, name="ci runner (renamed)")
    assert renamed.name == "ci runner (renamed)"
    assert [key.id for key in items(client.api_keys.list(name="CI RUNNER (renamed)"))] == [made.id]
    assert made.id in [key.id for key in items(client.api_keys.list(query=made.id[:6]))]
    # No listing ever carries a secret.
    listed = httpx.get(f"{control_plane.base_url}/org/api_keys", params={"limit": 100},
                       headers={"Authorization": f"Bearer {control_plane.api_key}"}).text
    assert made.key not in listed and made.key.rsplit("_", 1)[1] not in listed


def test_a_policy_allows_only_its_actions_on_every_route(client, control_plane, test_page_url):
    made = client.api_keys.create(name="browsers only", policy=BROWSERS_ONLY)
    assert made.policy.statements[0].action == "browsers:use"
    scoped = as_key(control_plane, made.key)

    session = scoped.browsers.create(headless=True)
    try:
        # It drives its browser: the page really loads.
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(session.cdp_ws_url)
            page = first_tab(browser)
            page.goto(test_page_url)
            assert page.title() == "Kernel compatibility test page"
            browser.close()
        assert scoped.browsers.retrieve(session.session_id).session_id == session.session_id
        ran = scoped.browsers.process.exec(session.session_id, command="echo", args=["driven"])
        assert base64.b64decode(ran.stdout_b64 or "") == b"driven\n"

        with pytest.raises(PermissionDeniedError) as denied:
            scoped.browser_pools.list()
        assert "browser_pools:read" in str(denied.value)
        with pytest.raises(PermissionDeniedError) as denied:
            scoped.api_keys.create(name="more")
        assert "api_keys:write" in str(denied.value)
        with pytest.raises(PermissionDeniedError):
            scoped.profiles.create(name="not mine to make")
        # Who am I is open to any key.
        assert scoped.auth.context.retrieve().principal.id == made.id

        # A key that may only look gets no URL that would let it drive.
        reader = as_key(control_plane, client.api_keys.create(
            name="reader", policy={"statements": [{"action": "browsers:read", "resource": "*"}]}).key)
        seen = reader.browsers.retrieve(session.session_id)
        assert seen.cdp_ws_url == "" and seen.webdriver_ws_url == ""
        assert field(seen, "browser_live_view_url") is None
        with pytest.raises(PermissionDeniedError) as denied:
            reader.browsers.process.exec(session.session_id, command="true")
        assert "browsers:use" in str(denied.value)
        with pytest.raises(PermissionDeniedError):
            reader.browsers.delete_by_id(session.session_id)
        assert client.browsers.retrieve(session.session_id).cdp_ws_url.startswith("ws")
    finally:
        scoped.browsers.delete_by_id(session.session_id)


def test_a_key_cannot_make_or_reach_a_key_with_more_rights(client, control_plane):
    admin_policy = {"statements": [{"action": "api_keys:write", "resource": "*"},
                                   {"action": "browsers:read", "resource": "*"}]}
    limited = client.api_keys.create(name="key admin", policy=admin_policy, days_to_expire=2)
    admin = as_key(control_plane, limited.key)

    with pytest.raises(PermissionDeniedError):
        admin.api_keys.create(name="broader", policy=BROWSERS_ONLY)
    with pytest.raises(PermissionDeniedError):
        admin.api_keys.create(name="longer", days_to_expire=30)
    narrower = admin.api_keys.create(
        name="narrower", policy={"statements": [{"action": "browsers:read", "resource": "projects/*/browsers/*"}]})
    assert narrower.policy.statements[0].action == "browsers:read"
    # Unsaid, the new key gets its maker's policy and end, never more.
    inherited = admin.api_keys.create(name="inherits")
    assert [s.action for s in inherited.policy.statements] == ["api_keys:write", "browsers:read"]
    assert inherited.expires_at == limited.expires_at
    assert inherited.created_by.id == limited.id

    unrestricted = client.api_keys.create(name="unrestricted")
    with pytest.raises(PermissionDeniedError):
        admin.api_keys.rotate(unrestricted.id)  # would hand it an unrestricted secret
    with pytest.raises(PermissionDeniedError):
        admin.api_keys.delete(unrestricted.id)
    admin.api_keys.delete(narrower.id)
    with pytest.raises(ConflictError):
        admin.api_keys.delete(limited.id)  # a key cannot delete itself


def test_rotation_expiry_and_deletion_end_a_secret(client, control_plane):
    old = client.api_keys.create(name="to rotate", policy=BROWSERS_ONLY)
    assert as_key(control_plane, old.key).auth.context.retrieve()
    new = client.api_keys.rotate(old.id, expire_in_days=0)
    assert new.id != old.id and new.name == old.name and new.key != old.key
    assert new.policy.statements[0].action == "browsers:use"
    with pytest.raises(AuthenticationError):
        as_key(control_plane, old.key).browsers.list()
    assert as_key(control_plane, new.key).auth.context.retrieve().principal.id == new.id

    # The default grace: the rotated key works for 7 more days.
    graced = client.api_keys.create(name="graceful")
    client.api_keys.rotate(graced.id)
    assert as_key(control_plane, graced.key).auth.context.retrieve()
    ends = client.api_keys.retrieve(graced.id).expires_at
    assert (ends - datetime.datetime.now(datetime.timezone.utc)).days in (6, 7)

    soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=3)
    short = client.api_keys.create(name="short-lived", expires_at=soon)
    assert as_key(control_plane, short.key).auth.context.retrieve()
    time.sleep(max(0.0, (soon - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) + 0.5)
    with pytest.raises(AuthenticationError) as expired:
        as_key(control_plane, short.key).browsers.list()
    assert "expired" in str(expired.value)

    client.api_keys.delete(new.id)
    with pytest.raises(AuthenticationError):
        as_key(control_plane, new.key).browsers.list()
    with pytest.raises(NotFoundError):
        client.api_keys.retrieve(new.id)
    deleted = client.api_keys.retrieve(new.id, include_deleted=True)
    assert deleted.deleted_at is not None
    assert new.id in [key.id for key in items(client.api_keys.list(status="deleted"))]
    assert new.id not in [key.id for key in items(client.api_keys.list())]


def test_bad_input_is_a_clear_400_and_another_organization_sees_nothing(client, control_plane):
    for bad in ({"name": ""}, {"name": "x", "days_to_expire": 0}, {"name": "x", "days_to_expire": 5000},
                {"name": "x", "days_to_expire": 1, "expires_at": "2099-01-01T00:00:00Z"},
                {"name": "x", "expires_at": "2001-01-01T00:00:00Z"},
                {"name": "x", "policy": {"statements": []}}):
        with pytest.raises(BadRequestError):
            client.api_keys.create(**bad)
    with pytest.raises(BadRequestError) as bad_action:
        client.api_keys.create(name="x", policy={"statements": [{"action": "browser:drive", "resource": "*"}]})
    assert "statements[0].action" in str(bad_action.value)
    with pytest.raises(NotFoundError):
        client.api_keys.create(name="x", project_id="proj_nope")
    with pytest.raises(BadRequestError):
        client.api_keys.list(sort_by="colour")

    mine = client.api_keys.create(name="mine")
    other = as_key(control_plane, control_plane.create_api_key("another-org-keys"))
    with pytest.raises(NotFoundError):
        other.api_keys.retrieve(mine.id)
    with pytest.raises(NotFoundError):
        other.api_keys.rotate(mine.id)
    with pytest.raises(NotFoundError):
        other.api_keys.delete(mine.id)
    assert mine.id not in [key.id for key in items(other.api_keys.list())]
    assert as_key(control_plane, mine.key).auth.context.retrieve()


def test_the_command_line_makes_a_restricted_key(control_plane):
    policy = json.dumps({"statements": [{"action": "browsers:read", "resource": "*"}]})
    key = subprocess.run(
        [str(CONTROL_PLANE), "api-keys", "create", "--org", "cli-policy", "--policy", policy,
         "--data-dir", str(control_plane.data_dir)],
        check=True, capture_output=True, text=True).stdout.strip()
    restricted = as_key(control_plane, key)
    assert items(restricted.browsers.list()) == []
    with pytest.raises(PermissionDeniedError):
        restricted.browsers.create(headless=True)
    bad = subprocess.run(
        [str(CONTROL_PLANE), "api-keys", "create", "--org", "cli-policy", "--policy", '{"statements": []}',
         "--data-dir", str(control_plane.data_dir)], capture_output=True, text=True)
    assert bad.returncode != 0 and "statements" in bad.stderr


def test_what_a_request_refers_to_is_checked_too(client, control_plane):
    client.profiles.create(name="guarded-profile")
    browsers_only = as_key(control_plane, client.api_keys.create(name="no profiles", policy=BROWSERS_ONLY).key)
    with pytest.raises(PermissionDeniedError) as denied:
        browsers_only.browsers.create(headless=True, profile={"name": "guarded-profile"})
    assert "profiles:use" in str(denied.value)

    with_profile = as_key(control_plane, client.api_keys.create(name="one profile", policy={"statements": [
        *BROWSERS_ONLY["statements"],
        {"action": "profiles:use", "resource": "projects/*/profiles/guarded-profile"}]}).key)
    with pytest.raises(PermissionDeniedError) as denied:
        with_profile.browsers.create(headless=True, profile={"name": "guarded-profile", "save_changes": True})
    assert "profiles:write" in str(denied.value)
    session = with_profile.browsers.create(headless=True, profile={"name": "guarded-profile"})
    try:
        assert session.profile.name == "guarded-profile"
    finally:
        with_profile.browsers.delete_by_id(session.session_id)

    connections_only = as_key(control_plane, client.api_keys.create(name="connections", policy={"statements": [
        {"action": "auth_connections:*", "resource": "*"}]}).key)
    with pytest.raises(PermissionDeniedError) as denied:
        connections_only.auth.connections.create(domain="example.com", profile_name="guarded-profile")
    assert "profiles:write" in str(denied.value)

    # A statement field this server does not know is refused, never ignored.
    with pytest.raises(BadRequestError):
        client.api_keys.create(name="x", policy={"statements": [
            {"action": "*", "resource": "*", "effect": "deny"}]})
