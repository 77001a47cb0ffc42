"""Profiles through the official SDK, with real browsers: state saved on session end and
loaded into new browsers (cookies, local storage, IndexedDB), atomic saves, concurrent
savers, organizations and bad input."""

from __future__ import annotations

import io
import os
import signal
import tarfile
import threading
import zipfile

import kernel
import pytest
import zstandard
from kernel import Kernel

from harness import read_page, session_processes, wait_until
from sdk import SEED_ERA, field, rename

# Writes `value` into a persistent cookie, local storage and IndexedDB of the test page's
# origin, and reads the three back.
WRITE_STATE = """async (value) => {
  document.cookie = `probe=${value}; max-age=86400; path=/`;
  localStorage.setItem('probe', value);
  const db = await new Promise((ok, fail) => {
    const open = indexedDB.open('probe-db', 1);
    open.onupgradeneeded = () => open.result.createObjectStore('kv');
    open.onsuccess = () => ok(open.result);
    open.onerror = () => fail(open.error);
  });
  await new Promise((ok, fail) => {
    const tx = db.transaction('kv', 'readwrite');
    tx.objectStore('kv').put(value, 'probe');
    tx.oncomplete = ok;
    tx.onerror = () => fail(tx.error);
  });
  db.close();
}"""

READ_STATE = """async () => {
  const cookie = (document.cookie.split('; ').find((c) => c.startsWith('probe=')) || '').slice(6);
  const db = await new Promise((ok, fail) => {
    const open = indexedDB.open('probe-db', 1);
    open.onupgradeneeded = () => open.result.createObjectStore('kv');
    open.onsuccess = () => ok(open.result);
    open.onerror = () => fail(open.error);
  });
  const idb = await new Promise((ok) => {
    const get = db.transaction('kv').objectStore('kv').get('probe');
    get.onsuccess = () => ok(get.result === undefined ? '' : get.result);
    get.onerror = () => ok('');
  });
  db.close();
  return { cookie, local: localStorage.getItem('probe') || '', idb };
}"""


def download(client, profile_id: str, fmt: str) -> bytes:
    """`profiles.download` in a format: today's SDK names it; the seed-era SDK sends it as
    an extra query parameter."""
    if SEED_ERA:
        return client.profiles.download(profile_id, extra_query={"format": fmt}).read()
    return client.profiles.download(profile_id, format=fmt).read()


def on_page(session, url: str, script: str, arg=None):
    return read_page(session.cdp_ws_url, url, lambda page: page.evaluate(script, arg))


def write_state(session, url: str, value: str) -> None:
    on_page(session, url, WRITE_STATE, value)


def read_state(client: Kernel, profile_id: str, url: str) -> dict:
    """What a new browser started from the profile (without saving) finds."""
    session = client.browsers.create(headless=True, profile={"id": profile_id})
    try:
        return on_page(session, url, READ_STATE)
    finally:
        client.browsers.delete_by_id(session.session_id)


def test_save_changes_round_trip_keeps_cookies_local_storage_and_indexeddb(client, test_page_url):
    profile = client.profiles.create(name="round-trip")
    assert profile.updated_at is None
    session = client.browsers.create(headless=True, profile={"name": "round-trip", "save_changes": True})
    # The full profile, as both SDK generations model it, and whether the session saves.
    attached = field(session, "profile")
    assert {key: attached[key] for key in ("id", "name", "created_at")} == {
        "id": profile.id, "name": "round-trip", "created_at": field(profile, "created_at")}
    assert attached["last_used_at"] is not None
    assert field(session, "profile_save_changes") is True
    assert field(client.browsers.retrieve(session.session_id), "profile")["name"] == "round-trip"
    write_state(session, test_page_url, "first")
    client.browsers.delete_by_id(session.session_id)

    saved = client.profiles.retrieve(profile.id)
    assert saved.updated_at is not None
    assert saved.last_used_at is not None
    archive = zipfile.ZipFile(io.BytesIO(client.profiles.download(profile.id).read()))
    names = archive.namelist()
    assert any(name.endswith("Cookies") for name in names), names
    assert not any("/Cache/" in name for name in names), names

    # The same state in the formats today's SDK asks for.
    files = {info.filename: archive.read(info) for info in archive.infolist() if not info.is_dir()}
    for fmt in ("tar", "tar.zst"):
        raw = download(client, profile.id, fmt)
        if fmt == "tar.zst":
            assert raw[:4] == b"\x28\xb5\x2f\xfd"
            raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            unpacked = {member.name: tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}
        assert unpacked == files, fmt
    with pytest.raises(kernel.BadRequestError):
        download(client, profile.id, "rar")

    assert read_state(client, profile.id, test_page_url) == {"cookie": "first", "local": "first", "idb": "first"}
    # Reading without save_changes left the stored state alone.
    assert client.profiles.retrieve(profile.id).updated_at == saved.updated_at


def test_a_failed_save_keeps_the_previous_state(client, control_plane, test_page_url):
    profile = client.profiles.create(name="atomic")
    first = client.browsers.create(headless=True, profile={"id": profile.id, "save_changes": True})
    write_state(first, test_page_url, "good")
    client.browsers.delete_by_id(first.session_id)
    good = client.profiles.retrieve(profile.id)
    assert good.updated_at is not None

    second = client.browsers.create(headless=True, profile={"id": profile.id, "save_changes": True})
    write_state(second, test_page_url, "lost")
    # The agent dies: the export cannot happen, the save fails.
    for pid in session_processes(control_plane, second.session_id)["agent"]:
        os.kill(pid, signal.SIGKILL)
    try:
        client.browsers.delete_by_id(second.session_id)
    except kernel.NotFoundError:
        pass  # the heartbeat noticed the dead agent first and ended the session
    assert wait_until(lambda: client.browsers.retrieve(second.session_id, include_deleted=True).deleted_at, 30)

    after = client.profiles.retrieve(profile.id)
    assert after.updated_at == good.updated_at
    assert after.size_bytes == good.size_bytes
    assert read_state(client, profile.id, test_page_url) == {"cookie": "good", "local": "good", "idb": "good"}


def test_two_sessions_saving_one_profile_are_serialized(client, test_page_url):
    profile = client.profiles.create(name="shared")
    sessions = [client.browsers.create(headless=True, profile={"id": profile.id, "save_changes": True})
                for _ in range(2)]
    for index, session in enumerate(sessions):
        write_state(session, test_page_url, f"writer{index}")
    errors = []

    def end(session_id):
        try:
            client.browsers.delete_by_id(session_id)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=end, args=(s.session_id,)) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    # One complete save won: all three stores agree on one writer.
    state = read_state(client, profile.id, test_page_url)
    assert state["cookie"] in ("writer0", "writer1"), state
    assert state == {"cookie": state["cookie"], "local": state["cookie"], "idb": state["cookie"]}


def test_profiles_list_get_delete_and_download_of_a_new_profile(client):
    created = [client.profiles.create(name=f"listed-{i}") for i in range(3)]
    unnamed = client.profiles.create()
    assert unnamed.name is None
    ids = [p.id for p in client.profiles.list(query="listed-")]
    assert ids == [p.id for p in created]
    page = client.profiles.list(query="listed-", limit=2)
    assert [p.id for p in page.items] == ids[:2] and page.has_next_page()
    assert [p.id for p in page.get_next_page().items] == ids[2:]
    assert client.profiles.retrieve("listed-1").id == created[1].id
    # A profile never saved downloads as an empty archive.
    assert zipfile.ZipFile(io.BytesIO(client.profiles.download(unnamed.id).read())).namelist() == []

    client.profiles.delete("listed-0")
    with pytest.raises(kernel.NotFoundError):
        client.profiles.retrieve(created[0].id)
    with pytest.raises(kernel.NotFoundError):
        client.profiles.delete(created[0].id)
    with pytest.raises(kernel.NotFoundError):
        client.browsers.create(headless=True, profile={"id": created[0].id})


def test_another_organization_cannot_see_or_use_a_profile(client, control_plane):
    mine = client.profiles.create(name="private")
    other = Kernel(api_key=control_plane.create_api_key("org-b"), base_url=control_plane.base_url, max_retries=0)
    assert [p.id for p in other.profiles.list()] == []
    for call in (lambda: other.profiles.retrieve(mine.id), lambda: other.profiles.retrieve("private"),
                 lambda: other.profiles.download(mine.id), lambda: other.profiles.delete(mine.id)):
        with pytest.raises(kernel.NotFoundError):
            call()
    with pytest.raises(kernel.NotFoundError) as refused:
        other.browsers.create(headless=True, profile={"id": mine.id})
    assert "no profile" in refused.value.body["message"]
    # The same name is free in the other organization.
    assert other.profiles.create(name="private").id != mine.id
    assert client.profiles.retrieve(mine.id).name == "private"


def test_a_profile_is_renamed_unless_taken_or_managed(client, control_plane):
    profile = client.profiles.create(name="before-rename")
    client.profiles.create(name="taken-name")
    renamed = rename(client, "profiles", "before-rename", "after-rename")
    assert renamed["id"] == profile.id and renamed["name"] == "after-rename"
    assert client.profiles.retrieve("after-rename").id == profile.id
    with pytest.raises(kernel.NotFoundError):
        client.profiles.retrieve("before-rename")
    with pytest.raises(kernel.ConflictError):
        rename(client, "profiles", profile.id, "taken-name")
    with pytest.raises(kernel.BadRequestError):
        rename(client, "profiles", profile.id, "bad\nname")
    pool = client.browser_pools.create(size=1, headless=True, profile={"name": "after-rename"})
    with pytest.raises(kernel.ConflictError) as named:
        rename(client, "profiles", profile.id, "elsewhere")
    assert pool.id in named.value.body["message"]
    client.browser_pools.delete(pool.id, force=True)
    client.auth.connections.create(domain="rename.example", profile_name="after-rename")
    with pytest.raises(kernel.ConflictError) as managed:
        rename(client, "profiles", profile.id, "elsewhere")
    assert "auth connection" in managed.value.body["message"]
    other = Kernel(api_key=control_plane.create_api_key("org-rename"), base_url=control_plane.base_url,
                   max_retries=0)
    with pytest.raises(kernel.NotFoundError):
        rename(other, "profiles", profile.id, "stolen")


def test_bad_profile_input_answers_the_error_shape(client):
    client.profiles.create(name="taken")
    with pytest.raises(kernel.ConflictError):
        client.profiles.create(name="taken")
    for body in ({"name": ""}, {"name": "x" * 256}, {"name": "tab\there"}, {"nme": "typo"}):
        with pytest.raises(kernel.BadRequestError) as bad:
            client.post("/profiles", body=body, cast_to=object)
        assert bad.value.body["code"] == "bad_request", body
    for profile in ({}, {"id": "a", "name": "b"}, {"id": ""}, {"id": "x", "save": True}):
        with pytest.raises(kernel.BadRequestError):
            client.browsers.create(headless=True, profile=profile)
    with pytest.raises(kernel.BadRequestError):
        client.profiles.list(limit=0)
