"""Projects with today's SDK (`projects`, `projects.limits`, `X-Kernel-Project-Id` /
`X-Kernel-Project`): every resource belongs to one; a project-bound key, or a header,
confines a call to it (another project's resource is 404, lists hold only its own); an
organization-wide key sees them all; project limits are enforced; an archived project
can be read, not changed; an empty project can be deleted, with the keys bound to it.
"""

from __future__ import annotations

import datetime

import httpx
import pytest
from kernel import (AuthenticationError, BadRequestError, ConflictError, Kernel, NotFoundError,
                    PermissionDeniedError, RateLimitError)

from harness import wait_until
from sdk import items, today_only

pytestmark = today_only


@pytest.fixture(scope="module")
def org(control_plane) -> Kernel:
    """An organization of its own: its projects and browsers are this module's only."""
    return Kernel(api_key=control_plane.create_api_key("projects-org"), base_url=control_plane.base_url,
                  max_retries=0)


def client_of(control_plane, key: str, **scope) -> Kernel:
    return Kernel(api_key=key, base_url=control_plane.base_url, max_retries=0, **scope)


def drive(client: Kernel, session_id: str, title: str) -> str:
    """Loads a page in the browser and returns its title, as the page has it."""
    result = client.browsers.playwright.execute(
        session_id, code=f"await page.goto('data:text/html,<title>{title}</title>'); return await page.title();")
    assert result.success, result
    return result.result


def test_a_project_bound_key_sees_and_makes_only_its_project(org, control_plane):
    alpha = org.projects.create(name="alpha")
    beta = org.projects.create(name="beta")
    assert alpha.status == "active" and alpha.id.startswith("proj_")
    names = [project.name for project in items(org.projects.list())]
    assert names == ["default", "alpha", "beta"]
    assert org.projects.retrieve("alpha").id == alpha.id

    made = org.api_keys.create(name="alpha agent", project_id=alpha.id, policy={
        "statements": [{"action": "browsers:use", "resource": f"projects/{alpha.id}/browsers/*"}]})
    assert made.project_id == alpha.id and made.project_name == "alpha"
    agent = client_of(control_plane, made.key)
    context = agent.auth.context.retrieve()
    assert context.authorization.credential_scope.project_id == alpha.id
    assert context.authorization.effective_scope.project_id == alpha.id

    mine = agent.browsers.create(headless=True)
    # The organization's key, confined to beta by name (`X-Kernel-Project`).
    in_beta = client_of(control_plane, org.api_key, project="beta")
    theirs = in_beta.browsers.create(headless=True)
    try:
        assert drive(agent, mine.session_id, "alpha page") == "alpha page"
        with pytest.raises(NotFoundError):
            agent.browsers.retrieve(theirs.session_id)
        with pytest.raises(NotFoundError):
            agent.browsers.playwright.execute(theirs.session_id, code="return 1;")
        assert [b.session_id for b in items(agent.browsers.list())] == [mine.session_id]
        assert [b.session_id for b in items(in_beta.browsers.list())] == [theirs.session_id]
        # The organization-wide key sees both; `X-Kernel-Project-Id` confines it too.
        everything = {b.session_id for b in items(org.browsers.list())}
        assert {mine.session_id, theirs.session_id} <= everything
        in_alpha = client_of(control_plane, org.api_key, project_id=alpha.id)
        assert [b.session_id for b in items(in_alpha.browsers.list())] == [mine.session_id]
        with pytest.raises(NotFoundError):
            in_alpha.browsers.retrieve(theirs.session_id)

        # Its policy allows browsers only: keys and pools are 403, naming the action.
        with pytest.raises(PermissionDeniedError) as denied:
            agent.api_keys.create(name="more")
        assert "api_keys:write" in str(denied.value)
        with pytest.raises(PermissionDeniedError):
            agent.browser_pools.list()
        with pytest.raises(PermissionDeniedError):
            agent.browser_pools.create(size=1)
        # A bound key cannot step into another project with a header.
        with pytest.raises(PermissionDeniedError):
            client_of(control_plane, made.key, project_id=beta.id).browsers.list()
        # That refusal is in the audit log, as denied, by that key (records are written
        # just after the answer, so the test waits for it).
        now = datetime.datetime.now(datetime.timezone.utc)

        def refusal_recorded() -> bool:
            entries = org.audit_logs.list(start=now - datetime.timedelta(minutes=5),
                                          end=now + datetime.timedelta(minutes=1))
            return any(e.path == "/browsers" and e.status == 403 and e.api_key_id == made.id
                       and getattr(e, "outcome", None) == "denied" for e in entries)

        assert wait_until(refusal_recorded, 10)
    finally:
        org.browsers.delete_by_id(mine.session_id)
        org.browsers.delete_by_id(theirs.session_id)


def test_every_kind_of_resource_is_confined(org, control_plane):
    gamma = org.projects.create(name="gamma")
    delta = org.projects.create(name="delta")
    in_gamma = client_of(control_plane, org.api_key, project_id=gamma.id)
    in_delta = client_of(control_plane, org.api_key, project_id=delta.id)
    profile = in_gamma.profiles.create(name="gamma-profile")
    proxy = in_gamma.proxies.create(type="custom", name="gamma-proxy",
                                    config={"host": "127.0.0.1", "port": 9})
    credential = in_gamma.credentials.create(name="gamma-login", domain="example.test",
                                             values={"username": "u", "password": "p"})
    try:
        for lookup in (lambda c: c.profiles.retrieve("gamma-profile"),
                       lambda c: c.proxies.retrieve(proxy.id),
                       lambda c: c.credentials.retrieve("gamma-login")):
            lookup(in_gamma)
            with pytest.raises(NotFoundError):
                lookup(in_delta)
        assert items(in_delta.profiles.list()) == [] and items(in_delta.proxies.list()) == []
        assert items(in_delta.credentials.list()) == []
        # A browser in delta cannot use gamma's profile: it does not exist there.
        with pytest.raises(NotFoundError):
            in_delta.browsers.create(headless=True, profile={"name": "gamma-profile"})
        # Unconfined, the organization's key finds them.
        assert org.profiles.retrieve(profile.id).id == profile.id

        # A project that holds anything cannot be deleted; the default one never.
        with pytest.raises(ConflictError) as refused:
            org.projects.delete(gamma.id)
        assert "profiles" in str(refused.value)
        with pytest.raises(ConflictError):
            org.projects.delete("default")
    finally:
        in_gamma.profiles.delete(profile.id)
        in_gamma.proxies.delete(proxy.id)
        in_gamma.credentials.delete(credential.id)
    bound = org.api_keys.create(name="gamma key", project_id=gamma.id)
    org.projects.delete(gamma.id)
    with pytest.raises(NotFoundError):
        org.projects.retrieve(gamma.id)
    # Its keys went with it; its name is free again.
    with pytest.raises(AuthenticationError):
        client_of(control_plane, bound.key).browsers.list()
    assert org.projects.create(name="gamma").id != gamma.id


def test_project_limits_are_enforced(org, control_plane):
    capped = org.projects.create(name="capped")
    limits = org.projects.limits.retrieve(capped.id)
    assert limits.max_concurrent_sessions is None and limits.max_pooled_sessions is None
    limits = org.projects.limits.update(capped.id, max_concurrent_sessions=1, max_concurrent_invocations=2)
    assert limits.max_concurrent_sessions == 1 and limits.max_concurrent_invocations == 2
    in_capped = client_of(control_plane, org.api_key, project_id=capped.id)
    first = in_capped.browsers.create(headless=True)
    try:
        with pytest.raises(RateLimitError) as refused:
            in_capped.browsers.create(headless=True)
        assert refused.value.response.headers.get("retry-after")
        assert "max_concurrent_sessions is 1" in str(refused.value)
        # Pools reserve against the same cap.
        with pytest.raises(ConflictError):
            in_capped.browser_pools.create(size=1)
        # Other projects are not held to it.
        other = org.browsers.create(headless=True)
        org.browsers.delete_by_id(other.session_id)
        # `null` leaves it; 0 removes it.
        assert org.projects.limits.update(capped.id, max_concurrent_sessions=None).max_concurrent_sessions == 1
        assert org.projects.limits.update(capped.id, max_concurrent_sessions=0).max_concurrent_sessions is None
        second = in_capped.browsers.create(headless=True)
        in_capped.browsers.delete_by_id(second.session_id)
    finally:
        in_capped.browsers.delete_by_id(first.session_id)
    with pytest.raises(BadRequestError):
        org.projects.limits.update(capped.id, max_pooled_sessions=3)
    with pytest.raises(BadRequestError):
        org.projects.limits.update(capped.id, max_concurrent_sessions=-1)


def test_an_archived_project_keeps_its_resources_read_only(org, control_plane):
    archive = org.projects.create(name="to-archive")
    in_archive = client_of(control_plane, org.api_key, project_id=archive.id)
    profile = in_archive.profiles.create(name="archived-profile")
    archived = org.projects.update(archive.id, status="archived")
    assert archived.status == "archived"
    assert in_archive.profiles.retrieve(profile.id).id == profile.id
    with pytest.raises(ConflictError) as refused:
        in_archive.profiles.create(name="another")
    assert "archived" in str(refused.value)
    assert org.projects.update(archive.id, status="active", name="unarchived").name == "unarchived"
    in_archive.profiles.delete(profile.id)


def test_bad_project_input_is_4xx(org, control_plane):
    for bad in ("", "a/b", "50%", "x" * 256):
        with pytest.raises(BadRequestError):
            org.projects.create(name=bad)
    org.projects.create(name="unique")
    with pytest.raises(ConflictError):
        org.projects.create(name="unique")
    with pytest.raises(NotFoundError):
        client_of(control_plane, org.api_key, project_id="proj_nowhere").browsers.list()
    with pytest.raises(BadRequestError):
        client_of(control_plane, org.api_key, project_id=org.projects.retrieve("unique").id,
                  project="default").browsers.list()
    # Another organization sees none of this organization's projects.
    other = client_of(control_plane, control_plane.create_api_key("projects-other-org"))
    with pytest.raises(NotFoundError):
        other.projects.retrieve("unique")
    answer = httpx.get(f"{control_plane.base_url}/browsers",
                       headers={"Authorization": f"Bearer {other.api_key}", "X-Kernel-Project": "unique"})
    assert answer.status_code == 404 and answer.json()["code"] == "not_found"


def test_the_command_line_makes_project_bound_keys(org, control_plane):
    key = control_plane.create_api_key("projects-org", project="cli-project")
    bound = client_of(control_plane, key)
    context = bound.auth.context.retrieve()
    project = org.projects.retrieve("cli-project")
    assert context.authorization.credential_scope.project_id == project.id
    assert [p.id for p in items(bound.projects.list())] == [project.id]
    with pytest.raises(PermissionDeniedError):
        bound.projects.create(name="not allowed")
    # What spans every project is for organization-wide keys.
    now = datetime.datetime.now(datetime.timezone.utc)
    with pytest.raises(PermissionDeniedError) as refused:
        bound.audit_logs.list(start=now - datetime.timedelta(hours=1), end=now)
    assert "organization-wide" in str(refused.value)
    with pytest.raises(PermissionDeniedError):
        bound.organization.limits.update(default_project_max_concurrent_sessions=3)
    assert bound.organization.limits.retrieve().max_concurrent_sessions > 0
