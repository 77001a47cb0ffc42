"""Names, tags, start_url and location of browser sessions (today's SDK fields), with
both SDK generations: the effect in the page, lookups by name, filters, PATCH, pools,
organizations and bad input."""

from __future__ import annotations

import json

import httpx
import kernel
import pytest
from kernel import Kernel
from playwright.sync_api import sync_playwright

from conftest import TEST_PAGE_TITLE
from harness import first_tab
from sdk import field, fields, tag_filter, update_browser

LOCATION_PROBE = """() => [Intl.DateTimeFormat().resolvedOptions().timeZone, navigator.language,
  Intl.DateTimeFormat().resolvedOptions().locale, new Intl.NumberFormat().format(1234.5)]"""


def test_a_named_tagged_browser_opens_its_start_url_in_its_location(client, test_page_url):
    created = client.browsers.create(headless=True, **fields(
        name="checkout-bot", tags={"team": "payments", "env": "staging"}, start_url=test_page_url,
        location={"timezone": "America/New_York", "locale": "de-de"}))
    try:
        assert field(created, "name") == "checkout-bot"
        assert field(created, "tags") == {"team": "payments", "env": "staging"}
        assert field(created, "start_url") == test_page_url
        assert field(created, "location") == {"timezone": "America/New_York", "timezone_source": "override",
                                              "locale": "de-DE", "locale_source": "override"}
        assert field(created, "region") == "us-east"
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(created.cdp_ws_url)
            page = first_tab(browser)
            # Opened before the answer: no waiting for it here.
            assert page.url == test_page_url and page.title() == TEST_PAGE_TITLE
            timezone, language, intl_locale, number = page.evaluate(LOCATION_PROBE)
            browser.close()
        assert timezone == "America/New_York"
        assert language == "de-DE"
        assert intl_locale.startswith("de") and number == "1.234,5"

        # The name addresses the session wherever the id does.
        assert client.browsers.retrieve("checkout-bot").session_id == created.session_id
        client.browsers.fs.write_file("checkout-bot", b"by name", path="/by-name.txt")
        assert client.browsers.fs.read_file(created.session_id, path="/by-name.txt").read() == b"by name"
        with pytest.raises(kernel.ConflictError) as taken:
            client.browsers.create(headless=True, **fields(name="checkout-bot"))
        assert "checkout-bot" in taken.value.body["message"]
    finally:
        client.browsers.delete_by_id("checkout-bot")
    # Ended: the name is free again and finds nothing.
    with pytest.raises(kernel.NotFoundError):
        client.browsers.retrieve("checkout-bot")
    again = client.browsers.create(headless=True, **fields(name="checkout-bot"))
    client.browsers.delete_by_id(again.session_id)


def test_the_default_location_is_reported_as_such(client):
    created = client.browsers.create(headless=True)
    try:
        assert field(created, "location") == {"timezone": "UTC", "timezone_source": "default",
                                              "locale": "en-US", "locale_source": "default"}
        assert field(created, "name") is None and field(created, "tags") is None
    finally:
        client.browsers.delete_by_id(created.session_id)


def test_lists_filter_by_tags_and_query(client):
    first = client.browsers.create(headless=True, **fields(name="lister-one", tags={"team": "a", "tier": "1"}))
    second = client.browsers.create(headless=True, **fields(name="lister-two", tags={"team": "a", "tier": "2"}))
    third = client.browsers.create(headless=True, **fields(tags={"team": "b"}))
    try:
        def listed(**kwargs):
            return {b.session_id for b in client.browsers.list(limit=100, **kwargs)}

        assert listed(**tag_filter({"team": "a"})) == {first.session_id, second.session_id}
        assert listed(**tag_filter({"team": "a", "tier": "2"})) == {second.session_id}
        assert listed(**tag_filter({"team": "A"})) == set()
        assert listed(query="LISTER-") == {first.session_id, second.session_id}
        assert listed(query=third.session_id[-8:]) == {third.session_id}
        # Paging over a filtered list keeps every match exactly once.
        paged = [b.session_id for b in client.browsers.list(limit=1, **tag_filter({"team": "a"}))]
        assert sorted(paged) == sorted([first.session_id, second.session_id])
    finally:
        for session in (first, second, third):
            client.browsers.delete_by_id(session.session_id)


def test_patch_renames_retags_and_navigates(client, test_page_url):
    created = client.browsers.create(headless=True, **fields(name="patch-me", tags={"a": "1"}))
    try:
        updated = update_browser(client, "patch-me", name="patched", tags={"b": "2"})
        assert field(updated, "name") == "patched" and field(updated, "tags") == {"b": "2"}
        with pytest.raises(kernel.NotFoundError):
            client.browsers.retrieve("patch-me")
        assert client.browsers.retrieve("patched").session_id == created.session_id
        assert {b.session_id for b in client.browsers.list(**tag_filter({"b": "2"}))} == {created.session_id}

        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(created.cdp_ws_url)
            page = first_tab(browser)
            assert page.url == "about:blank"
            navigated = update_browser(client, created.session_id, start_url=test_page_url)
            assert field(navigated, "start_url") == test_page_url
            page.wait_for_url(test_page_url, timeout=5000)
            assert page.title() == TEST_PAGE_TITLE
            browser.close()

        # null removes the name; {} removes every tag.
        cleared = update_browser(client, "patched", name=None, tags={})
        assert field(cleared, "name") is None and field(cleared, "tags") is None
        with pytest.raises(kernel.NotFoundError):
            client.browsers.retrieve("patched")
    finally:
        client.browsers.delete_by_id(created.session_id)


def test_names_are_per_organization(client, control_plane):
    mine = client.browsers.create(headless=True, **fields(name="shared-name"))
    other = Kernel(api_key=control_plane.create_api_key("org-names-b"), base_url=control_plane.base_url,
                   max_retries=0)
    try:
        for attempt in (lambda: other.browsers.retrieve("shared-name"),
                        lambda: update_browser(other, "shared-name", name="stolen"),
                        lambda: other.browsers.delete_by_id("shared-name")):
            with pytest.raises(kernel.NotFoundError):
                attempt()
        theirs = other.browsers.create(headless=True, **fields(name="shared-name"))
        assert theirs.session_id != mine.session_id
        assert other.browsers.retrieve("shared-name").session_id == theirs.session_id
        assert client.browsers.retrieve("shared-name").session_id == mine.session_id
        other.browsers.delete_by_id("shared-name")
        assert field(client.browsers.retrieve("shared-name"), "name") == "shared-name"
    finally:
        client.browsers.delete_by_id(mine.session_id)


def test_a_leased_pool_browser_carries_the_lessee_labels_until_release(client, test_page_url):
    pool = client.browser_pools.create(size=1, fill_rate_per_minute=6000, headless=True)
    try:
        leased = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=60, **fields(
            name="lessee", tags={"job": "42"}, start_url=test_page_url))
        assert field(leased, "name") == "lessee" and field(leased, "tags") == {"job": "42"}
        assert field(leased, "pool") == {"id": pool.id, "name": None}
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(leased.cdp_ws_url)
            assert first_tab(browser).url == test_page_url
            browser.close()
        assert client.browsers.retrieve("lessee").session_id == leased.session_id
        client.browser_pools.release(pool.id, session_id=leased.session_id)
        with pytest.raises(kernel.NotFoundError):
            client.browsers.retrieve("lessee")
        # Not leased (being reset, then idle): not the caller's to change.
        with pytest.raises(kernel.ConflictError):
            update_browser(client, leased.session_id, name="squatter")
        again = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=60)
        assert again.session_id == leased.session_id
        assert field(again, "name") is None and field(again, "tags") is None
        client.browser_pools.release(pool.id, session_id=again.session_id)
    finally:
        client.browser_pools.delete(pool.id, force=True)


def test_bad_labels_and_unsupported_fields_are_named(client, control_plane):
    def refused(call, *needles, status=400):
        with pytest.raises(kernel.APIStatusError) as error:
            call()
        assert error.value.status_code == status
        body = error.value.body
        text = body["message"] + " ".join(d["message"] for d in body.get("details") or [])
        for needle in needles:
            assert needle in text, (needle, body)

    create = lambda **given: client.browsers.create(headless=True, extra_body=given)  # noqa: E731
    refused(lambda: create(name=""), "name must not be empty")
    refused(lambda: create(name="x" * 256), "at most 255")
    refused(lambda: create(tags={f"k{i}": "v" for i in range(51)}), "at most 50 pairs")
    refused(lambda: create(tags={"k": 1}), "tags")
    refused(lambda: create(start_url="file:///etc/passwd"), "start_url must be an http or https URL")
    refused(lambda: create(start_url="https://elsewhere.example/", network={"allowed_hosts": ["example.com"]}),
            "elsewhere.example is not in network.allowed_hosts")
    refused(lambda: create(location={"timezone": "../../etc/passwd"}), "not an IANA timezone")
    refused(lambda: create(location={"timezone": "Mars/Olympus_Mons", "locale": "klingon-tongue"}),
            "not an IANA timezone", "not a BCP 47 locale")
    refused(lambda: create(telemetry={"enabled": False, "browser": {"console": {"enabled": True}}}),
            "enabled=false cannot be combined with browser category settings")
    refused(lambda: create(region="eu-west"), "serves \"us-east\" only")
    refused(lambda: create(proxy={"mode": "sideways"}), "proxy.mode must be direct or default")
    created = client.browsers.create(headless=True, **fields(name="bad-input"))
    try:
        refused(lambda: update_browser(client, "bad-input", telemetry={"storage": {"enabled": False}}),
                "telemetry.storage cannot be changed after the browser is created")
        refused(lambda: update_browser(client, "bad-input", name="a\nb"), "control characters")
        refused(lambda: update_browser(client, "bad-input", start_url="javascript:alert(1)"), "start_url")
        other = client.browsers.create(headless=True, **fields(name="bad-input-2"))
        refused(lambda: update_browser(client, "bad-input-2", name="bad-input"), "bad-input", status=409)
        client.browsers.delete_by_id(other.session_id)
        # Nothing of the refused updates stuck.
        assert field(client.browsers.retrieve(created.session_id), "name") == "bad-input"
    finally:
        client.browsers.delete_by_id(created.session_id)
    # A raw client sees the Error shape.
    answer = httpx.post(f"{control_plane.base_url}/browsers", json={"name": 5},
                        headers={"authorization": f"Bearer {control_plane.api_key}"})
    assert answer.status_code == 400 and answer.json()["code"] == "bad_request"
    assert answer.json()["message"].startswith("name:")


def test_a_pool_start_url_is_open_in_every_lease(client, test_page_url):
    for refused, needle in [({"region": "eu-west"}, "serves"), ({"telemetry": {"bogus": True}}, "telemetry"),
                            ({"refresh_on_profile_update": True}, "refresh_on_profile_update"),
                            ({"start_url": "ftp://example.com/"}, "start_url")]:
        with pytest.raises(kernel.BadRequestError) as error:
            client.browser_pools.create(size=1, headless=True, extra_body=refused)
        assert needle in json.dumps(error.value.body), (refused, error.value.body)
    pool = client.browser_pools.create(size=1, fill_rate_per_minute=6000, headless=True,
                                       **fields(start_url=test_page_url))
    try:
        assert field(client.browser_pools.retrieve(pool.id), "browser_pool_config")["start_url"] == test_page_url
        for _ in range(2):  # a fresh lease, then one after a reset
            leased = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=60)
            with sync_playwright() as playwright:
                browser = playwright.chromium.connect_over_cdp(leased.cdp_ws_url)
                page = first_tab(browser)
                assert page.url == test_page_url and page.title() == TEST_PAGE_TITLE
                browser.close()
            client.browser_pools.release(pool.id, session_id=leased.session_id)
    finally:
        client.browser_pools.delete(pool.id, force=True)
