"""Auto-paging with each SDK generation: the seed-era Python SDK (0.40.0) and today's
TypeScript SDK (0.84.0) read `X-Next-Offset` differently, and each sees every item exactly
once. Clients that do not say which SDK they are get today's convention."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from harness import control_plane_for_module

PROFILES = 25
LIMIT = 4


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    yield from control_plane_for_module(tmp_path_factory)


@pytest.fixture(scope="module")
def profile_ids(client):
    return {client.profiles.create(name=f"paged-{index:02}").id for index in range(PROFILES)}


def _typescript_ids(control_plane, resource: str, limit: int) -> list[str]:
    script = Path(__file__).parent / "node-clients" / "page_all.mjs"
    out = subprocess.run(["node", str(script), control_plane.base_url, control_plane.api_key, resource, str(limit)],
                         check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)


def test_the_seed_era_sdk_pages_through_everything_once(client, profile_ids):
    seen = [profile.id for profile in client.profiles.list(limit=LIMIT)]
    assert len(seen) == PROFILES and set(seen) == profile_ids


def test_todays_typescript_sdk_pages_through_everything_once(control_plane, profile_ids):
    seen = _typescript_ids(control_plane, "profiles", LIMIT)
    assert len(seen) == PROFILES and set(seen) == profile_ids


def test_browsers_page_for_both_generations(control_plane, client):
    created = []
    for _ in range(5):
        session = client.browsers.create(headless=True)
        client.browsers.delete_by_id(session.session_id)
        created.append(session.session_id)
    seed_era = [b.session_id for b in client.browsers.list(limit=2, status="all")]
    todays = _typescript_ids(control_plane, "browsers", 2)
    for seen in (seed_era, todays):
        assert len(seen) == len(set(seen)) and set(created) <= set(seen), seen


def test_a_client_that_does_not_say_gets_absolute_offsets(control_plane, profile_ids):
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    offset, seen = 0, []
    for _ in range(20):
        page = httpx.get(f"{control_plane.base_url}/profiles", params={"limit": LIMIT, "offset": offset},
                         headers=headers, timeout=30)
        seen += [profile["id"] for profile in page.json()]
        if page.headers["x-has-more"] == "false":
            assert page.headers["x-next-offset"] == "0"
            break
        offset = int(page.headers["x-next-offset"])
        assert offset == len(seen)
    assert len(seen) == PROFILES and set(seen) == profile_ids
    # The seed-era convention for the Python SDK that expects it: the page just answered.
    legacy = httpx.get(f"{control_plane.base_url}/profiles", params={"limit": LIMIT, "offset": 8},
                       headers={**headers, "X-Stainless-Lang": "python", "X-Stainless-Package-Version": "0.40.0"},
                       timeout=30)
    assert legacy.headers["x-next-offset"] == "8"


def test_list_filters_apply_or_are_refused_by_name(control_plane, client, profile_ids):
    assert [p.name for p in client.profiles.list(extra_query={"name": "PAGED-07"})] == ["paged-07"]
    assert {p.name for p in client.profiles.list(query="Paged-1", limit=100)} == {f"paged-1{i}" for i in range(10)}
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    for path, params, named in [
        ("/profiles", {"colour": "blue"}, "colour"),
        ("/browsers", {"colour": "blue"}, "colour"),
        ("/browsers", {"limit": "0"}, "limit"),
        ("/auth/connections", {"colour": "blue"}, "colour"),
    ]:
        refused = httpx.get(f"{control_plane.base_url}{path}", params=params, headers=headers, timeout=30)
        assert refused.status_code == 400 and refused.json()["code"] == "bad_request", (path, refused.text)
        assert named in str(refused.json()), (path, refused.text)
