"""`control-plane backup` while the service runs, then `restore` into a fresh data
directory: a control plane started there has the sessions' history, the profiles' saved
state, the extensions, the replays' videos and the credentials (decryptable: their TOTP
codes are right) of the first, byte for byte. An archive that is not a backup, or a data
directory that already has a database, is refused with nothing left behind."""

from __future__ import annotations

import io
import re
import stat
import subprocess
import tarfile
import time
from pathlib import Path

import httpx
import pyotp
import pytest
from kernel import Kernel
from playwright.sync_api import sync_playwright

from extensions_kit import make_extension
from harness import CONTROL_PLANE, REPO, ControlPlane
from sdk import on_browser, once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

SEED = "JBSWY3DPEHPK3PXP"


def raw(control_plane, method: str, path: str, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    return httpx.request(method, f"{control_plane.base_url}{path}", headers=headers, timeout=60, **kwargs)


@pytest.fixture
def planes(tmp_path):
    started: list[ControlPlane] = []

    def start(name: str) -> ControlPlane:
        plane = ControlPlane(tmp_path / name).start()
        started.append(plane)
        return plane

    yield start
    for plane in started:
        plane.reap_everything()


def command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CONTROL_PLANE), *args], capture_output=True, text=True, timeout=120)


def documented(verb: str, **paths: Path) -> list[str]:
    """The documentation's `backup` or `restore` command, as a reader copies it, with its
    example paths put where this test keeps them."""
    page = (REPO / "docs" / "operating" / "backups-and-upgrades.md").read_text()
    line = re.search(rf"^target/release/control-plane ({verb} .*)$", page, re.M).group(1)
    for example, path in paths.items():
        assert example in line, (example, line)
        line = line.replace(example, str(path))
    return line.split()


def test_a_backup_taken_while_serving_restores_everything(planes, tmp_path, test_page_url):
    source = planes("source")
    client = Kernel(api_key=source.api_key, base_url=source.base_url, max_retries=0)

    extension = client.extensions.upload(file=("ext.zip", make_extension("backup")), name="kept")
    extension_bytes = client.extensions.download(extension.id).read()

    profile = client.profiles.create(name="kept")
    with_profile = client.browsers.create(headless=True, profile={"id": profile.id, "save_changes": True})
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(with_profile.cdp_ws_url)
        page = browser.contexts[0].pages[0] if browser.contexts[0].pages else browser.contexts[0].new_page()
        page.goto(test_page_url)
        page.evaluate("document.cookie = 'kept=yes; max-age=3600'")
        browser.close()
    client.browsers.delete_by_id(with_profile.session_id)
    profile_bytes = client.profiles.download(profile.id).read()
    assert len(profile_bytes) > 1000

    recorded = client.browsers.create(viewport={"width": 800, "height": 600})
    replay = client.browsers.replays.start(recorded.session_id)
    time.sleep(2)
    client.browsers.replays.stop(replay.replay_id, **on_browser(recorded.session_id))
    video = client.browsers.replays.download(replay.replay_id, **on_browser(recorded.session_id)).read()
    assert len(video) > 1000
    client.browsers.delete_by_id(recorded.session_id)

    created = raw(source, "POST", "/credentials", json={
        "name": "shop", "domain": "shop.example.com", "values": {"username": "alice", "password": "s3cret"},
        "totp_secret": SEED})
    assert created.status_code == 200, created.text
    credential_id = created.json()["id"]

    ended = {b["session_id"] for b in raw(source, "GET", "/browsers?status=deleted&limit=100").json()}
    assert {with_profile.session_id, recorded.session_id} <= ended

    # Online: the source keeps serving (and a browser keeps running) during the backup.
    running = client.browsers.create(headless=True)
    archive = tmp_path / "backup.tar"
    backup = command(*documented("backup", **{"./data": source.data_dir, "/backups/browser-service.tar": archive}))
    assert backup.returncode == 0, backup.stderr
    assert "and the credential key" in backup.stdout, backup.stdout
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600, "the archive holds secrets"
    assert client.browsers.retrieve(running.session_id).session_id == running.session_id
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[-1] == "backup.json", "the manifest comes last: an archive cut short has none"
    assert "control-plane.db" in names and "credential.key" in names
    assert not any(name.startswith("browsers") for name in names), "live VMs are not backed up"

    # Cut short (a full disk, a copy interrupted): refused, nothing left.
    # The worst place: right before the manifest, where the rest still reads as a whole
    # archive (two zero blocks end it).
    cut = tmp_path / "cut.tar"
    with tarfile.open(archive) as tar:
        manifest_at = tar.getmembers()[-1].offset
    cut.write_bytes(archive.read_bytes()[:manifest_at] + bytes(1024))
    refused = command("restore", "--input", str(cut), "--data-dir", str(tmp_path / "from-cut"))
    assert refused.returncode != 0 and "not a backup" in refused.stderr, refused.stderr
    assert list((tmp_path / "from-cut").iterdir()) == []
    # A journal of an older database left in the directory would be replayed into the
    # restored one: refused.
    (tmp_path / "stale").mkdir()
    (tmp_path / "stale" / "control-plane.db-wal").write_bytes(b"old pages")
    refused = command("restore", "--input", str(archive), "--data-dir", str(tmp_path / "stale"))
    assert refused.returncode != 0 and "already holds a database" in refused.stderr, refused.stderr

    restored_dir = tmp_path / "restored"
    restore = command(*documented("restore", **{"/backups/browser-service.tar": archive,
                                                 "./data-restored": restored_dir}))
    assert restore.returncode == 0, restore.stderr
    assert stat.S_IMODE((restored_dir / "credential.key").stat().st_mode) == 0o600
    again = command("restore", "--input", str(archive), "--data-dir", str(restored_dir))
    assert again.returncode != 0 and "already holds a database" in again.stderr

    restored = planes("restored")
    assert restored.data_dir == restored_dir
    assert restored.api_key == source.api_key, "the same key works"
    again_client = Kernel(api_key=restored.api_key, base_url=restored.base_url, max_retries=0)
    history = {b["session_id"] for b in raw(restored, "GET", "/browsers?status=deleted&limit=100").json()}
    assert {with_profile.session_id, recorded.session_id} <= history
    # A browser that was running at the backup did not survive it: its session is ended.
    assert running.session_id in history
    ended_running = raw(restored, "GET", f"/browsers/{running.session_id}?include_deleted=true").json()
    assert "restored from a backup" in ended_running["end_reason"], ended_running
    assert again_client.profiles.download(profile.id).read() == profile_bytes
    assert again_client.extensions.download("kept").read() == extension_bytes
    assert raw(restored, "GET", f"/browsers/{recorded.session_id}/replays/{replay.replay_id}").content == video
    code = raw(restored, "GET", f"/credentials/{credential_id}/totp-code")
    assert code.status_code == 200, code.text
    assert pyotp.TOTP(SEED).verify(code.json()["code"], valid_window=1), "the seed decrypts"


def test_an_archive_that_is_not_a_backup_is_refused_with_nothing_left(tmp_path):
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        for name, data in [("backup.json", b'{"format": 1, "version": "x", "created_at": "2026-01-01T00:00:00Z",'
                                            b' "blobs": 0, "credential_key": false}'),
                           ("control-plane.db", b"not a database"), ("../escaped", b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    target = tmp_path / "target"
    run = command("restore", "--input", str(evil), "--data-dir", str(target))
    assert run.returncode != 0 and "no backup writes" in run.stderr, run.stderr
    assert not (tmp_path / "escaped").exists()
    assert list(target.iterdir()) == [], "nothing half-restored is left"

    linked = tmp_path / "linked.tar"
    with tarfile.open(linked, "w") as tar:
        info = tarfile.TarInfo("blobs/profiles/x")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/shadow"
        tar.addfile(info)
    run = command("restore", "--input", str(linked), "--data-dir", str(target))
    assert run.returncode != 0 and "not a regular file" in run.stderr, run.stderr
    assert list(target.iterdir()) == []


def test_a_postgres_deployment_is_told_to_use_its_own_tools(tmp_path):
    run = command("backup", "--data-dir", str(tmp_path), "--database-url", "postgres://u:p@127.0.0.1/db",
                  "--output", str(tmp_path / "x.tar"))
    assert run.returncode != 0 and "pg_dump" in run.stderr
    assert not (tmp_path / "x.tar").exists() and not (tmp_path / "x.partial").exists()
