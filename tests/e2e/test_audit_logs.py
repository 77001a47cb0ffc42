"""The audit log with today's SDK (`audit_logs.list`, `export_chunk`, `download`): every
state-changing call and every refused call of an organization is recorded once, with the
key that made it, the route, the action it needs, the status and the outcome; reads are
not; no secret ever appears in it; pages and chunks return each record once; another
organization sees none of it.
"""

from __future__ import annotations

import datetime
import gzip
import io
import json
import time

import httpx
import pytest
from kernel import AuthenticationError, BadRequestError, Kernel, PermissionDeniedError

from harness import wait_until
from sdk import field, today_only

pytestmark = today_only

PASSWORD = "hunter2-never-logged"
TOTP_SEED = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def entries(client: Kernel, since: datetime.datetime, **filters) -> list:
    return list(client.audit_logs.list(start=since, end=now() + datetime.timedelta(minutes=1), **filters))


def recorded(client: Kernel, since: datetime.datetime, request_id: str):
    """The record of the call answered with `request_id` (records are written just after
    the answer)."""
    def matching() -> list:
        return [e for e in entries(client, since) if field(e, "request_id") == request_id]

    assert wait_until(lambda: bool(matching()), 10), f"no audit record of request {request_id}"
    found = matching()
    assert len(found) == 1, found
    return found[0]


def test_changes_and_refusals_are_recorded_once_reads_are_not(client, control_plane):
    since = now() - datetime.timedelta(seconds=1)
    raw = client.browsers.with_raw_response.create(headless=True)
    session = raw.parse()
    created = recorded(client, since, raw.headers["x-request-id"])
    assert created.method == "POST" and created.path == "/browsers" and created.route == "/browsers"
    assert created.status == 200 and field(created, "outcome") == "allowed"
    assert field(created, "action") == "browsers:use"
    assert field(created, "api_key_id") == client.auth.context.retrieve().principal.id
    assert created.auth_strategy == "api_key" and created.client_ip == "127.0.0.1"
    assert created.user_agent.startswith("Kernel/Python")

    read = client.browsers.with_raw_response.retrieve(session.session_id)
    deleted = client.browsers.with_raw_response.delete_by_id(session.session_id)
    gone = recorded(client, since, deleted.headers["x-request-id"])
    assert gone.method == "DELETE" and gone.route == "/browsers/{id}"
    assert field(gone, "resource").endswith(f"/browsers/{session.session_id}")
    time.sleep(0.5)
    assert read.headers["x-request-id"] not in [field(e, "request_id") for e in entries(client, since)]

    # A refusal by policy is recorded as denied, with the action it lacked.
    scoped_key = client.api_keys.create(
        name="read only", policy={"statements": [{"action": "browsers:read", "resource": "*"}]})
    scoped = Kernel(api_key=scoped_key.key, base_url=control_plane.base_url, max_retries=0)
    with pytest.raises(PermissionDeniedError) as denied:
        scoped.profiles.create(name="audit-denied")
    denial = recorded(client, since, denied.value.response.headers["x-request-id"])
    assert denial.status == 403 and field(denial, "outcome") == "denied"
    assert field(denial, "action") == "profiles:write" and field(denial, "api_key_id") == scoped_key.id
    # So is an expired key; an unknown key belongs to no organization and is not.
    soon = now() + datetime.timedelta(seconds=2)
    short = client.api_keys.create(name="short", expires_at=soon)
    time.sleep(max(0.0, (soon - now()).total_seconds()) + 0.5)
    with pytest.raises(AuthenticationError) as expired:
        Kernel(api_key=short.key, base_url=control_plane.base_url, max_retries=0).browsers.create()
    late = recorded(client, since, expired.value.response.headers["x-request-id"])
    assert late.status == 401 and field(late, "api_key_id") == short.id
    with pytest.raises(AuthenticationError) as unknown:
        Kernel(api_key="sk_nobody_nothing", base_url=control_plane.base_url, max_retries=0).browsers.create()
    time.sleep(0.5)
    assert unknown.value.response.headers["x-request-id"] not in [field(e, "request_id") for e in entries(client, since)]

    denied_only = entries(client, since, search="403")
    assert [field(e, "request_id") for e in denied_only] == [field(denial, "request_id")]
    posts = entries(client, since, method="POST")
    assert posts and all(e.method == "POST" for e in posts)
    assert all(e.method != "POST" for e in entries(client, since, exclude_method=["POST"]))


def test_no_secret_ever_appears_in_the_log(client, control_plane):
    since = now() - datetime.timedelta(seconds=1)
    credential = client.credentials.create(name="audited-login", domain="example.com",
                                           values={"username": "me", "password": PASSWORD},
                                           totp_secret=TOTP_SEED)
    key = client.api_keys.create(name="audited key")
    rotated = client.api_keys.rotate(key.id, expire_in_days=0)
    session = client.browsers.create(headless=True)
    token = session.cdp_ws_url.split("jwt=", 1)[1]
    # A session's own route with its token in the query, as today's SDK sends it.
    httpx.post(f"{session.base_url}/process/exec?jwt={token}", json={"command": "true"}, timeout=60)
    client.browsers.delete_by_id(session.session_id)
    client.credentials.delete(credential.id)
    assert wait_until(lambda: len(entries(client, since)) >= 7, 10)
    everything = httpx.get(f"{control_plane.base_url}/audit-logs/export/chunk",
                           params={"start": since.isoformat(), "end": (now() + datetime.timedelta(minutes=1)).isoformat(),
                                   "format": "jsonl"},
                           headers={"Authorization": f"Bearer {control_plane.api_key}"}).text
    for secret in (PASSWORD, TOTP_SEED, key.key, rotated.key, key.key.rsplit("_", 1)[1], token,
                   control_plane.api_key.rsplit("_", 1)[1]):
        assert secret not in everything
    session_call = [json.loads(line) for line in everything.splitlines() if "/process/exec" in line]
    assert session_call and session_call[0]["auth_strategy"] == "session_token"


def test_pages_and_chunks_return_each_record_once(client):
    since = now() - datetime.timedelta(seconds=1)
    made = [client.profiles.create(name=f"audit-profile-{i}") for i in range(7)]
    for profile in made:
        client.profiles.delete(profile.id)
    assert wait_until(lambda: len(entries(client, since)) >= 14, 10)
    paged = [field(e, "request_id") for e in client.audit_logs.list(start=since, end=now(), limit=3)]
    assert len(paged) == len(set(paged)) >= 14
    assert paged == [field(e, "request_id") for e in entries(client, since)][:len(paged)]

    archive = io.BytesIO()
    result = client.audit_logs.download(to=archive, start=since, end=now(), limit=4)
    lines = gzip.decompress(archive.getvalue()).decode().splitlines()
    assert result.rows == len(lines) == len(paged) and result.chunks >= 4
    assert [json.loads(line)["request_id"] for line in lines] == paged


def test_bad_queries_are_400_and_another_organization_sees_nothing(client, control_plane):
    start = now()
    with pytest.raises(BadRequestError):
        client.audit_logs.list(start=start, end=start - datetime.timedelta(hours=1))
    with pytest.raises(BadRequestError):
        client.audit_logs.list(start=start - datetime.timedelta(days=31), end=start)
    with pytest.raises(BadRequestError):
        client.audit_logs.list(start=start - datetime.timedelta(hours=1), end=start, page_token="forged")
    with pytest.raises(BadRequestError):
        client.audit_logs.list(start=start - datetime.timedelta(hours=1), end=start, limit=0)
    other = Kernel(api_key=control_plane.create_api_key("audit-other-org"), base_url=control_plane.base_url,
                   max_retries=0)
    assert entries(other, start - datetime.timedelta(hours=1)) == []
    assert entries(client, start - datetime.timedelta(hours=1))
