"""PATCH `location` and `profile`: changes a running Chromium can only take by restarting.
The restart is clean (cookies and storage written first); after a location change the
same pages are open again, in the new timezone and locale; a loaded profile's state is
there for pages."""

from __future__ import annotations

import kernel
import pytest
from playwright.sync_api import sync_playwright

from harness import first_tab, read_page
from sdk import field, once, update_browser
from test_names_and_tags import LOCATION_PROBE
from test_profiles import READ_STATE, WRITE_STATE

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


def refused(call, status: int, *needles: str):
    with pytest.raises(kernel.APIStatusError) as error:
        call()
    assert error.value.status_code == status, error.value.body
    text = error.value.body["message"] + " ".join(d["message"] for d in error.value.body.get("details") or [])
    for needle in needles:
        assert needle in text, error.value.body


def open_tab_probe(cdp_ws_url: str) -> tuple[str, list, dict]:
    """The first tab's URL, its location probe and the state it can read."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(cdp_ws_url)
        page = first_tab(browser)
        result = page.url, page.evaluate(LOCATION_PROBE), page.evaluate(READ_STATE)
        browser.close()
        return result


def test_a_new_location_restarts_chromium_in_it_with_the_same_pages_and_cookies(client, test_page_url):
    session = client.browsers.create(headless=True, timeout_seconds=300,
                                     extra_body={"location": {"timezone": "America/New_York"}})
    sid = session.session_id
    try:
        read_page(session.cdp_ws_url, test_page_url, lambda page: page.evaluate(WRITE_STATE, "kept"))

        updated = update_browser(client, sid, location={"timezone": "Asia/Tokyo", "locale": "fr-FR"})
        assert field(updated, "location") == {"timezone": "Asia/Tokyo", "timezone_source": "override",
                                              "locale": "fr-FR", "locale_source": "override"}
        url, (timezone, language, _, number), state = open_tab_probe(session.cdp_ws_url)
        assert url == test_page_url, "the page it showed is open again"
        assert (timezone, language) == ("Asia/Tokyo", "fr-FR")
        assert number.replace("\u202f", " ") == "1 234,5"
        assert state == {"cookie": "kept", "local": "kept", "idb": "kept"}

        # null returns a field to the default; the other stays.
        updated = update_browser(client, sid, location={"timezone": None})
        assert field(updated, "location") == {"timezone": "UTC", "timezone_source": "default",
                                              "locale": "fr-FR", "locale_source": "override"}
        _, (timezone, language, _, _), _ = open_tab_probe(session.cdp_ws_url)
        assert (timezone, language) == ("UTC", "fr-FR")
        assert field(client.browsers.retrieve(sid), "location")["timezone_source"] == "default"

        # Bad values change nothing.
        refused(lambda: update_browser(client, sid, location={"timezone": "Mars/Olympus_Mons"}), 400,
                "not an IANA timezone")
        refused(lambda: update_browser(client, sid, location={"country": "FR"}), 400, "country")
        assert field(client.browsers.retrieve(sid), "location")["locale"] == "fr-FR"
    finally:
        client.browsers.delete_by_id(sid)


def test_a_profile_loads_into_a_browser_that_has_none(client, test_page_url):
    profile = client.profiles.create(name="loaded-later")
    saver = client.browsers.create(headless=True, profile={"id": profile.id, "save_changes": True})
    read_page(saver.cdp_ws_url, test_page_url, lambda page: page.evaluate(WRITE_STATE, "from-profile"))
    client.browsers.delete_by_id(saver.session_id)

    session = client.browsers.create(headless=True, timeout_seconds=300)
    sid = session.session_id
    try:
        assert read_page(session.cdp_ws_url, test_page_url, lambda page: page.evaluate(READ_STATE))["cookie"] == ""
        refused(lambda: update_browser(client, sid, profile={"name": "no-such-profile"}), 404, "no-such-profile")
        refused(lambda: update_browser(client, sid, profile={}), 400, "exactly one of id or name")

        updated = update_browser(client, sid, profile={"name": "loaded-later"})
        assert field(updated, "profile")["id"] == profile.id
        assert field(updated, "profile_save_changes") in (False, None)
        state = read_page(session.cdp_ws_url, test_page_url, lambda page: page.evaluate(READ_STATE))
        assert state == {"cookie": "from-profile", "local": "from-profile", "idb": "from-profile"}
        assert field(client.browsers.retrieve(sid), "profile")["name"] == "loaded-later"

        # One profile per browser.
        refused(lambda: update_browser(client, sid, profile={"id": profile.id}), 409, "already has profile")
    finally:
        client.browsers.delete_by_id(sid)
        client.profiles.delete(profile.id)


def test_a_profile_loaded_with_save_changes_keeps_what_the_browser_did(client, test_page_url):
    profile = client.profiles.create(name="saved-after-load")
    session = client.browsers.create(headless=True, timeout_seconds=300)
    try:
        # A profile with no state yet: nothing to load, the browser goes on as it is.
        updated = update_browser(client, session.session_id, profile={"id": profile.id, "save_changes": True})
        assert field(updated, "profile")["id"] == profile.id
        read_page(session.cdp_ws_url, test_page_url, lambda page: page.evaluate(WRITE_STATE, "saved"))
    finally:
        client.browsers.delete_by_id(session.session_id)
    reader = client.browsers.create(headless=True, profile={"id": profile.id})
    try:
        assert read_page(reader.cdp_ws_url, test_page_url, lambda page: page.evaluate(READ_STATE))["local"] == "saved"
    finally:
        client.browsers.delete_by_id(reader.session_id)
        client.profiles.delete(profile.id)
