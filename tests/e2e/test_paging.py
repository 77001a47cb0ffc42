"""Auto-paging of every list with each SDK generation: the Python SDK of this run
(seed-era 0.40.0 or today's 0.131.0) and today's TypeScript SDK (0.84.0) read
`X-Next-Offset` differently, and each sees every item exactly once. Lists the seed-era SDK
reads as one array (extensions, proxies, pools) answer it everything. Clients that do not
say which SDK they are get today's convention."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from extensions_kit import make_extension
from harness import control_plane_for_module
from sdk import SEED_ERA

PROFILES = 25
LIMIT = 4
# Each browser is started and ended in turn (about a second each): with the pools'
# browsers, still four pages.
BROWSERS = 10
# Each pool keeps a browser running: fewer of them, still several pages.
POOLS = 6


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    yield from control_plane_for_module(tmp_path_factory)


@pytest.fixture(scope="module")
def profile_ids(client):
    return {client.profiles.create(name=f"paged-{index:02}").id for index in range(PROFILES)}


@pytest.fixture(scope="module")
def listed(client, profile_ids):
    """Every paged list's items, made by the test: resource name -> set of ids."""
    browsers = set()
    for _ in range(BROWSERS):
        session = client.browsers.create(headless=True)
        client.browsers.delete_by_id(session.session_id)
        browsers.add(session.session_id)
    archive = make_extension("paged")
    pools = {client.browser_pools.create(name=f"paged-pool-{index:02}", size=1, headless=True).id
             for index in range(POOLS)}
    yield {
        "profiles": profile_ids,
        "browsers": browsers,
        "extensions": {client.extensions.upload(file=(f"e{index}.zip", archive), name=f"paged-ext-{index:02}").id
                       for index in range(PROFILES)},
        "proxies": {client.proxies.create(type="custom", name=f"paged-proxy-{index:02}",
                                          config={"host": "127.0.0.1", "port": 9}).id
                    for index in range(PROFILES)},
        "auth.connections": {client.auth.connections.create(domain=f"paged{index}.example",
                                                            profile_name="paged-00").id
                             for index in range(PROFILES)},
        "browser_pools": pools,
    }
    for pool_id in pools:
        client.browser_pools.delete(pool_id, force=True)


def _python_ids(client, resource: str, limit: int) -> list[str]:
    lists = {
        "profiles": lambda **q: client.profiles.list(**q),
        "browsers": lambda **q: client.browsers.list(status="all", **q),
        "auth.connections": lambda **q: client.auth.connections.list(**q),
        "extensions": lambda **q: client.extensions.list(**q),
        "proxies": lambda **q: client.proxies.list(**q),
        "browser_pools": lambda **q: client.browser_pools.list(**q),
    }
    seed_era_arrays = ("extensions", "proxies", "browser_pools")
    # The seed-era SDK has no paging for these lists: it reads one array of everything.
    items = lists[resource]() if SEED_ERA and resource in seed_era_arrays else lists[resource](limit=limit)
    return [getattr(item, "id", None) or item.session_id for item in items]


def _typescript_ids(control_plane, resource: str, limit: int) -> list[str]:
    script = Path(__file__).parent / "node-clients" / "page_all.mjs"
    out = subprocess.run(["node", str(script), control_plane.base_url, control_plane.api_key, resource, str(limit)],
                         check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)


RESOURCES = ["profiles", "browsers", "auth.connections", "extensions", "proxies", "browser_pools"]


def _each_once(seen: list[str], listed: dict, resource: str) -> None:
    assert len(seen) == len(set(seen)), seen
    if resource == "browsers":
        # The pools' browsers are listed too.
        assert listed[resource] <= set(seen) and len(seen) == len(listed[resource]) + POOLS, seen
    else:
        assert set(seen) == listed[resource], seen


@pytest.mark.parametrize("resource", RESOURCES)
def test_this_python_sdk_pages_through_every_list_once(client, listed, resource):
    _each_once(_python_ids(client, resource, LIMIT), listed, resource)


@pytest.mark.parametrize("resource", RESOURCES)
def test_todays_typescript_sdk_pages_through_every_list_once(control_plane, listed, resource):
    _each_once(_typescript_ids(control_plane, resource, LIMIT), listed, resource)


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
        ("/extensions", {"colour": "blue"}, "colour"),
        ("/proxies", {"tags[x]": "y"}, "tags[x]"),
        ("/browser_pools", {"limit": "101"}, "limit"),
    ]:
        refused = httpx.get(f"{control_plane.base_url}{path}", params=params, headers=headers, timeout=30)
        assert refused.status_code == 400 and refused.json()["code"] == "bad_request", (path, refused.text)
        assert named in str(refused.json()), (path, refused.text)


@pytest.mark.parametrize("path, prefix", [("/extensions", "paged-ext-"), ("/proxies", "paged-proxy-"),
                                          ("/browser_pools", "paged-pool-")])
def test_named_lists_filter_by_name_and_query(control_plane, listed, path, prefix):
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}

    def names(**params):
        answer = httpx.get(f"{control_plane.base_url}{path}", params={"limit": 100, **params}, headers=headers,
                           timeout=30)
        assert answer.status_code == 200, answer.text
        return sorted(item["name"] for item in answer.json())

    assert names(name=f"{prefix.upper()}03") == [f"{prefix}03"]
    assert names(query=f"{prefix.upper()}0") == [f"{prefix}0{i}" for i in range(10 if "pool" not in prefix else POOLS)]
    assert names(name="nothing-is-called-this") == []
