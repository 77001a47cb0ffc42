"""The two generations of the official Python SDK the suite runs with.

deploy/test.sh runs the whole suite once with the seed-era `kernel==0.40.0` and once with
today's `kernel==0.131.0`. Tests that exercise what only one generation can express are
marked; everything else must pass with both.
"""

from __future__ import annotations

import kernel
import pytest

VERSION = tuple(int(part) for part in kernel.__version__.split(".")[:3])
# Python 0.68 changed how the SDK reads paging headers, and later versions model many
# fields the seed-era SDK only passes through as extras.
SEED_ERA = VERSION < (0, 68, 0)

seed_era_only = pytest.mark.skipif(not SEED_ERA, reason="today's SDK no longer sends this")
today_only = pytest.mark.skipif(SEED_ERA, reason="the seed-era SDK cannot send this")
# A test of what the service does on its own, which no SDK call shapes (the sandbox's
# kernel limits, idle freezing, the inactivity reaper, a recording's timing, a restart in
# the middle of a workflow): run once, in today's SDK phase.
once = pytest.mark.skipif(SEED_ERA, reason="does not depend on the SDK: run in today's SDK phase")


def field(model, name: str):
    """A response field as JSON, whether this SDK generation declares it or keeps it as
    an extra (None when absent)."""
    if isinstance(model, dict):
        return model.get(name)
    return model.to_dict(mode="json").get(name)


def items(listing) -> list:
    """Every item of a list call's answer: today's SDK pages lists the seed-era SDK
    answered as one array."""
    return list(listing)


def on_browser(session_id: str) -> dict:
    """The keyword naming the browser of a sub-resource call (replays, say): `id` in the
    seed-era SDK, `id_or_name` today."""
    return {"id": session_id} if SEED_ERA else {"id_or_name": session_id}


def fields(**given) -> dict:
    """Keyword arguments for fields today's SDK declares: as they are today, through
    `extra_body` for the seed-era SDK, which does not know them."""
    return {"extra_body": given} if SEED_ERA else given


def update_browser(client, id_or_name: str, **given):
    """`PATCH /browsers/{id_or_name}`: `browsers.update` today; the seed-era SDK has no
    such method, so it sends the request through the client's generic `patch`."""
    if not SEED_ERA:
        return client.browsers.update(id_or_name, **given)
    return client.patch(f"/browsers/{id_or_name}", body=given, cast_to=object)


def tag_filter(tags: dict) -> dict:
    """Keyword arguments of a `browsers.list` filtered by tags."""
    if SEED_ERA:
        return {"extra_query": {f"tags[{key}]": value for key, value in tags.items()}}
    return {"tags": tags}


def rename(client, resource: str, id_or_name: str, name: str) -> dict:
    """`profiles.update` / `proxies.update` today (`PATCH /<resource>/{id_or_name}`); the
    seed-era SDK has no such method, so it goes through the client's generic `patch`."""
    if SEED_ERA:
        return client.patch(f"/{resource}/{id_or_name}", body={"name": name}, cast_to=object)
    return getattr(client, resource).update(id_or_name, name=name).to_dict(mode="json")
