"""The browser VM's filesystem through the official SDK: every path confined to the VM
root, uploads extracted atomically, every bad input a 4xx in the Error shape."""

from __future__ import annotations

import io
import json
import os
import stat
import threading
import zipfile

import httpx
import kernel
import pytest

from harness import ControlPlane, vm_root, wait_until
from sdk import SEED_ERA


@pytest.fixture(scope="module")
def session(client):
    created = client.browsers.create(headless=True, timeout_seconds=600)
    yield created
    client.browsers.delete_by_id(created.session_id)


@pytest.fixture(scope="module")
def root(control_plane, session):
    return vm_root(control_plane, session.session_id)


def _zip(entries: list[tuple[str, bytes, int]], symlinks: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = ((stat.S_IFDIR if name.endswith("/") else stat.S_IFREG) | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


def _tree(path) -> dict[str, bytes | str | None]:
    """Everything under the VM root but Chromium's live profile: directories as None,
    symlinks as their target, files as their bytes."""
    found: dict[str, bytes | str | None] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        if dirpath == str(path):
            dirnames[:] = [d for d in dirnames if d != "user-data"]
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            key = os.path.relpath(full, path)
            if os.path.islink(full):
                found[key] = os.readlink(full)
            elif os.path.isdir(full):
                found[key] = None
            else:
                found[key] = open(full, "rb").read()
    return found


def test_files_round_trip_through_the_sdk(client, session, root):
    fs = client.browsers.fs
    sid = session.session_id
    fs.write_file(sid, contents=b"hello world", path="/work/notes/hello.txt", mode="640")
    assert fs.read_file(sid, path="/work/notes/hello.txt").read() == b"hello world"
    assert (root / "work/notes/hello.txt").read_bytes() == b"hello world"
    info = fs.file_info(sid, path="/work/notes/hello.txt")
    assert (info.name, info.path, info.size_bytes, info.is_dir, info.mode) == (
        "hello.txt", "/work/notes/hello.txt", 11, False, "-rw-r-----")

    fs.create_directory(sid, path="/work/empty/nested", mode="750")
    listing = {f.name: f for f in fs.list_files(sid, path="/work")}
    assert set(listing) == {"notes", "empty"} and listing["empty"].is_dir and listing["empty"].size_bytes == 0
    assert fs.file_info(sid, path="/work/empty/nested").mode == "drwxr-x---"

    fs.set_file_permissions(sid, path="/work/notes/hello.txt", mode="600")
    assert stat.S_IMODE((root / "work/notes/hello.txt").stat().st_mode) == 0o600

    archive = zipfile.ZipFile(io.BytesIO(fs.download_dir_zip(sid, path="/work").read()))
    assert archive.read("notes/hello.txt") == b"hello world"

    fs.delete_file(sid, path="/work/notes/hello.txt")
    with pytest.raises(kernel.NotFoundError):
        fs.file_info(sid, path="/work/notes/hello.txt")
    fs.delete_directory(sid, path="/work")
    assert not (root / "work").exists()


def test_move_renames_files_and_directories(client, session, root):
    fs = client.browsers.fs
    sid = session.session_id
    fs.write_file(sid, contents=b"a", path="/mv/dir/a.txt")
    fs.move(sid, src_path="/mv/dir/a.txt", dest_path="/mv/dir/b.txt")
    assert (root / "mv/dir/b.txt").read_bytes() == b"a" and not (root / "mv/dir/a.txt").exists()
    fs.move(sid, src_path="/mv/dir", dest_path="/mv/renamed/deeper")
    assert (root / "mv/renamed/deeper/b.txt").read_bytes() == b"a"

    with pytest.raises(kernel.NotFoundError):
        fs.move(sid, src_path="/mv/missing", dest_path="/mv/x")
    with pytest.raises(kernel.BadRequestError):
        fs.move(sid, src_path="mv/renamed", dest_path="/mv/x")
    with pytest.raises(kernel.BadRequestError):
        fs.move(sid, src_path="/mv/renamed", dest_path="/mv/x", extra_body={"overwrite": True})
    # A non-empty directory cannot be replaced.
    fs.write_file(sid, contents=b"c", path="/mv/other/c.txt")
    with pytest.raises(kernel.ConflictError):
        fs.move(sid, src_path="/mv/renamed", dest_path="/mv/other")
    assert (root / "mv/other/c.txt").exists() and (root / "mv/renamed/deeper/b.txt").exists()


def test_nothing_outside_the_root_is_reachable(client, session, root, tmp_path):
    fs = client.browsers.fs
    sid = session.session_id
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"secret")
    (root / "escape").symlink_to(outside)
    (root / "escape-file").symlink_to(outside / "secret.txt")
    try:
        attempts = [
            lambda: fs.read_file(sid, path="/../../../../etc/hostname").read(),
            lambda: fs.read_file(sid, path="/escape/secret.txt").read(),
            lambda: fs.read_file(sid, path="/escape-file").read(),
            lambda: fs.list_files(sid, path="/escape"),
            lambda: fs.file_info(sid, path="/escape/secret.txt"),
            lambda: fs.write_file(sid, contents=b"x", path="/escape/new.txt"),
            lambda: fs.move(sid, src_path="/escape/secret.txt", dest_path="/stolen.txt"),
            lambda: fs.move(sid, src_path="/escape-file", dest_path="/escape/moved.txt"),
            lambda: fs.create_directory(sid, path="/escape/newdir"),
            lambda: fs.delete_directory(sid, path="/escape/"),
            lambda: fs.set_file_permissions(sid, path="/escape/secret.txt", mode="777"),
            lambda: fs.download_dir_zip(sid, path="/escape").read(),
            lambda: fs.upload_zip(sid, dest_path="/escape", zip_file=_zip([("x.txt", b"x", 0o644)])),
        ]
        for attempt in attempts:
            with pytest.raises(kernel.BadRequestError):
                attempt()
        assert sorted(os.listdir(outside)) == ["secret.txt"]
        assert (outside / "secret.txt").read_bytes() == b"secret"
        assert stat.S_IMODE((outside / "secret.txt").stat().st_mode) != 0o777
    finally:
        (root / "escape").unlink()
        (root / "escape-file").unlink()


def test_upload_writes_each_file_to_its_destination(client, control_plane, session, root):
    fs = client.browsers.fs
    sid = session.session_id
    fs.upload(sid, files=[
        {"dest_path": "/uploads/one.txt", "file": ("one.txt", b"first file")},
        {"dest_path": "/uploads/deeper/two.bin", "file": ("two.bin", bytes(range(256)) * 100)},
        {"dest_path": "/three.txt", "file": ("three.txt", b"")},
    ])
    assert (root / "uploads" / "one.txt").read_bytes() == b"first file"
    assert (root / "uploads" / "deeper" / "two.bin").read_bytes() == bytes(range(256)) * 100
    assert (root / "three.txt").read_bytes() == b""
    assert stat.S_IMODE((root / "uploads" / "one.txt").stat().st_mode) == 0o644

    # Confined like write_file: nothing lands outside the VM root.
    with pytest.raises(kernel.BadRequestError) as refused:
        fs.upload(sid, files=[{"dest_path": "/../../../../tmp/escaped.txt", "file": ("x", b"x")}])
    assert "files[0]" in refused.value.body["message"]
    assert not os.path.exists("/tmp/escaped.txt")

    # Bad forms, from a raw client: each a 400 naming what is wrong, nothing written.
    url = f"{control_plane.base_url}/browsers/{sid}/fs/upload"
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    for parts, needle in [
        ([("files[0][file]", b"a"), ("files[0][dest_path]", b"/late.txt")], "must come before"),
        ([("files[0][dest_path]", b"/nofile.txt")], "files[0][file] is missing"),
        ([("other", b"a")], "unexpected multipart part"),
        ([("files[0][dest_path]", b"relative.txt"), ("files[0][file]", b"a")], "files[0][dest_path]"),
        ([("files[][dest_path]", b"/mixed.txt"), ("files[0][file]", b"a")], "not both"),
        ([], "at least one file"),
    ]:
        body = b"".join(b"--XyZ\r\nContent-Disposition: form-data; name=\"" + name.encode() + b"\"; filename=\"f\"\r\n\r\n"
                        + value + b"\r\n" for name, value in parts) + b"--XyZ--\r\n"
        answer = httpx.post(url, headers={**auth, "Content-Type": "multipart/form-data; boundary=XyZ"}, content=body)
        assert answer.status_code == 400, (needle, answer.text)
        assert needle in answer.text, (needle, answer.text)
    assert not any((root / name).exists() for name in ("late.txt", "nofile.txt", "mixed.txt"))


class Watching:
    """A watch of a directory, its events collected by a thread from the SSE stream: with
    today's SDK's `fs.watch`, or the raw routes for the seed-era SDK, which has none."""

    def __init__(self, client, control_plane, session_id: str, path: str):
        self.client, self.session_id = client, session_id
        self.events: list[dict] = []
        self.auth = {"Authorization": f"Bearer {control_plane.api_key}"}
        self.base = f"{control_plane.base_url}/browsers/{session_id}/fs/watch"
        if SEED_ERA:
            self.watch_id = httpx.post(self.base, json={"path": path, "recursive": True},
                                       headers=self.auth).raise_for_status().json()["watch_id"]
        else:
            self.watch_id = client.browsers.fs.watch.start(session_id, path=path, recursive=True).watch_id
        self.thread = threading.Thread(target=self._collect, daemon=True)
        self.thread.start()

    def _collect(self):
        if SEED_ERA:
            with httpx.stream("GET", f"{self.base}/{self.watch_id}/events", headers=self.auth,
                              timeout=None) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data:"):
                        self.events.append(json.loads(line[5:]))
        else:
            for event in self.client.browsers.fs.watch.events(self.watch_id, id_or_name=self.session_id):
                self.events.append(event.to_dict())

    def saw(self, kind: str, path: str) -> bool:
        return any(e["type"] == kind and e["path"] == path for e in list(self.events))

    def stop(self):
        if SEED_ERA:
            httpx.delete(f"{self.base}/{self.watch_id}", headers=self.auth).raise_for_status()
        else:
            self.client.browsers.fs.watch.stop(self.watch_id, id_or_name=self.session_id)
        self.thread.join(10)
        assert not self.thread.is_alive(), "the event stream did not end with the watch"


def test_a_watch_reports_changes_until_stopped(client, control_plane, session, root):
    fs = client.browsers.fs
    sid = session.session_id
    fs.create_directory(sid, path="/watched")
    watching = Watching(client, control_plane, sid, "/watched")
    try:
        fs.write_file(sid, b"one", path="/watched/a.txt")
        fs.move(sid, src_path="/watched/a.txt", dest_path="/watched/b.txt")
        (root / "watched" / "d.txt").write_bytes(b"made inside the VM")
        with open(root / "watched" / "d.txt", "ab") as appended:
            appended.write(b" and appended")
        # A file made in a new subdirectory at once, before the watch can reach it, is
        # reported as created all the same.
        fs.create_directory(sid, path="/watched/sub")
        (root / "watched" / "sub" / "c.txt").write_bytes(b"right away")
        fs.delete_file(sid, path="/watched/b.txt")
        expected = [("RENAME", "/watched/a.txt"), ("RENAME", "/watched/b.txt"), ("CREATE", "/watched/d.txt"),
                    ("WRITE", "/watched/d.txt"), ("CREATE", "/watched/sub"), ("CREATE", "/watched/sub/c.txt"),
                    ("DELETE", "/watched/b.txt")]
        assert wait_until(lambda: all(watching.saw(*e) for e in expected), 10), (
            [e for e in expected if not watching.saw(*e)], [(e["type"], e["path"]) for e in watching.events])
        sub = next(e for e in watching.events if e["path"] == "/watched/sub" and e["type"] == "CREATE")
        assert sub["is_dir"] is True and sub["name"] == "sub"
    finally:
        watching.stop()
    # Stopped: gone, and nothing more is reported.
    seen = len(watching.events)
    fs.write_file(sid, b"late", path="/watched/late.txt")
    assert len(watching.events) == seen
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    base = f"{control_plane.base_url}/browsers/{sid}/fs/watch"
    assert httpx.delete(f"{base}/{watching.watch_id}", headers=auth).status_code == 404
    for body, status in [({"path": "/nowhere"}, 404), ({"path": "/watched/late.txt"}, 400),
                         ({"path": "relative"}, 400), ({"path": "/watched", "colour": 1}, 400)]:
        answer = httpx.post(base, json=body, headers=auth)
        assert answer.status_code == status, (body, answer.text)
    # Another organization cannot follow or stop this browser's watches.
    other_key = control_plane.create_api_key("org-watch-b")
    mine = httpx.post(base, json={"path": "/watched"}, headers=auth).json()["watch_id"]
    for method, url in [("GET", f"{base}/{mine}/events"), ("DELETE", f"{base}/{mine}")]:
        assert httpx.request(method, url, headers={"Authorization": f"Bearer {other_key}"}).status_code == 404
    # At most 8 per browser.
    started = [mine] + [httpx.post(base, json={"path": "/watched"}, headers=auth).json()["watch_id"]
                        for _ in range(7)]
    assert httpx.post(base, json={"path": "/watched"}, headers=auth).status_code == 409
    for watch_id in started:
        assert httpx.delete(f"{base}/{watch_id}", headers=auth).status_code == 204


def test_upload_zip_extracts_nested_contents_with_modes(client, session, root):
    fs = client.browsers.fs
    sid = session.session_id
    archive = _zip(
        [("pkg/", b"", 0o755), ("pkg/bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755),
         ("pkg/data/deep/values.json", b'{"a": 1}', 0o600), ("README", b"readme", 0o4644)],
        symlinks={"pkg/latest": "bin/run.sh"},
    )
    fs.upload_zip(sid, dest_path="/uploads/first", zip_file=archive)
    base = root / "uploads/first"
    assert (base / "pkg/bin/run.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE((base / "pkg/bin/run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((base / "pkg/data/deep/values.json").stat().st_mode) == 0o600
    # setuid never comes from an archive.
    assert stat.S_IMODE((base / "README").stat().st_mode) == 0o644
    assert os.readlink(base / "pkg/latest") == "bin/run.sh"
    assert fs.read_file(sid, path="/uploads/first/pkg/latest").read() == b"#!/bin/sh\necho hi\n"

    # Extracting again merges: same names are replaced, others kept.
    fs.upload_zip(sid, dest_path="/uploads/first", zip_file=_zip([("README", b"v2", 0o644), ("new.txt", b"n", 0o644)]))
    assert (base / "README").read_bytes() == b"v2" and (base / "new.txt").exists()
    assert (base / "pkg/bin/run.sh").exists()


def test_a_move_never_lifts_an_archived_link_to_where_it_points_outside(client, session, root):
    fs = client.browsers.fs
    sid = session.session_id
    # Inside where it lands (/planted/a/b/c/../../../x is /planted/x): accepted.
    fs.upload_zip(sid, dest_path="/planted", zip_file=_zip([("x", b"x", 0o644)], symlinks={"a/b/c/l": "../../../x"}))
    assert fs.read_file(sid, path="/planted/a/b/c/l").read() == b"x"
    # Lifted to the root, the same link would name a file beside the VM root.
    for src, dest in [("/planted/a/b/c/l", "/l"), ("/planted/a/b", "/b"), ("/planted/a/b/c", "/c")]:
        with pytest.raises(kernel.BadRequestError, match="outside"):
            fs.move(sid, src_path=src, dest_path=dest)
    assert os.readlink(root / "planted/a/b/c/l") == "../../../x"
    assert not any((root / name).exists() or (root / name).is_symlink() for name in ("l", "b", "c"))
    # Moved to the same depth it still points inside, at the same file.
    fs.move(sid, src_path="/planted", dest_path="/kept")
    assert fs.read_file(sid, path="/kept/a/b/c/l").read() == b"x"


@pytest.mark.parametrize("kind", ["zip-slip", "absolute", "symlink-escape", "symlink-chain", "symlink-climb",
                                  "zip-bomb", "corrupt"])
def test_hostile_archives_are_refused_and_change_nothing(client, session, root, kind):
    fs = client.browsers.fs
    sid = session.session_id
    fs.upload_zip(sid, dest_path="/target", zip_file=_zip([("keep.txt", b"original", 0o644)]))
    before = _tree(root)
    archive = {
        "zip-slip": lambda: _zip([("ok.txt", b"ok", 0o644), ("../../evil.txt", b"evil", 0o644)]),
        "absolute": lambda: _zip([("ok.txt", b"ok", 0o644), ("/etc/evil.txt", b"evil", 0o644)]),
        "symlink-escape": lambda: _zip([("ok.txt", b"ok", 0o644)], symlinks={"link": "../../../../etc"}),
        # Each link looks harmless alone; through `a -> .` the second lands far above.
        "symlink-chain": lambda: _zip([], symlinks={"a": ".", "a/a/a/l": "../../../x"}),
        "symlink-climb": lambda: _zip([], symlinks={"s": ".", "u": "s/.."}),
        # 300 MB of zeros compresses about 1000:1.
        "zip-bomb": lambda: _zip([("ok.txt", b"ok", 0o644), ("zeros.bin", bytes(300 * 1024 * 1024), 0o644)]),
        "corrupt": lambda: b"PK\x03\x04 this is not really a zip archive" * 10,
    }[kind]()
    with pytest.raises(kernel.BadRequestError) as refused:
        fs.upload_zip(sid, dest_path="/target", zip_file=archive)
    assert refused.value.body["code"] == "bad_request"
    assert _tree(root) == before
    assert not any(name.startswith(".agent-staging-") for name in os.listdir(root))


def test_an_archive_that_does_not_fit_the_destination_changes_nothing(client, session, root):
    fs = client.browsers.fs
    sid = session.session_id
    fs.upload_zip(sid, dest_path="/fit", zip_file=_zip([("dir/inside.txt", b"keep", 0o644), ("file", b"f", 0o644)]))
    before = _tree(root)
    # "dir" is a directory at the destination; the archive has a file there.
    clash = _zip([("aaa-first.txt", b"new", 0o644), ("dir", b"not a directory", 0o644)])
    with pytest.raises(kernel.ConflictError):
        fs.upload_zip(sid, dest_path="/fit", zip_file=clash)
    with pytest.raises(kernel.ConflictError):
        fs.upload_zip(sid, dest_path="/fit", zip_file=_zip([("file/inner.txt", b"x", 0o644)]))
    assert _tree(root) == before


def test_listing_the_root_answers_clean_paths(client, session):
    listing = client.browsers.fs.list_files(session.session_id, path="/")
    assert "/user-data" in [f.path for f in listing]
    assert all(f.path == "/" + f.name for f in listing)


def test_filesystem_bad_input_answers_the_error_shape(control_plane, session, root):
    base = f"{control_plane.base_url}/browsers/{session.session_id}/fs"
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    (root / "bad").mkdir(exist_ok=True)
    (root / "bad/file.txt").write_bytes(b"x")
    cases = [
        (httpx.get(f"{base}/read_file", headers=auth), 400),
        (httpx.get(f"{base}/read_file?path=relative", headers=auth), 400),
        (httpx.get(f"{base}/read_file?path=/bad", headers=auth), 400),
        (httpx.get(f"{base}/read_file?path=/missing", headers=auth), 404),
        (httpx.get(f"{base}/list_files?path=/bad/file.txt", headers=auth), 400),
        (httpx.put(f"{base}/write_file?path=/bad", headers=auth, content=b"x"), 409),
        (httpx.put(f"{base}/write_file?path=/bad/new&mode=999", headers=auth, content=b"x"), 400),
        (httpx.put(f"{base}/move", headers=auth, json={"src_path": "/bad/file.txt"}), 400),
        (httpx.put(f"{base}/move", headers=auth, json={"src_path": 1, "dest_path": "/x"}), 400),
        (httpx.put(f"{base}/move", headers=auth, json={"src_path": "/bad/file.txt", "dest_path": "/"}), 400),
        (httpx.put(f"{base}/delete_file", headers=auth, json={"path": "/bad"}), 400),
        (httpx.put(f"{base}/delete_directory", headers=auth, json={"path": "/bad/file.txt"}), 400),
        (httpx.put(f"{base}/delete_directory", headers=auth, json={"path": "/"}), 400),
        (httpx.put(f"{base}/create_directory", headers=auth, json={"path": "/bad/file.txt"}), 409),
        (httpx.put(f"{base}/set_file_permissions", headers=auth, json={"path": "/bad/file.txt", "mode": "rwx"}), 400),
        (httpx.put(f"{base}/set_file_permissions", headers=auth, json={"path": "/bad/file.txt", "mode": "4755"}), 400),
        (httpx.put(f"{base}/set_file_permissions", headers=auth,
                   json={"path": "/bad/file.txt", "mode": "644", "owner": "no-such-user-here"}), 400),
        (httpx.post(f"{base}/upload_zip", headers=auth, files={"zip_file": ("a.zip", _zip([]))}), 400),
        (httpx.post(f"{base}/upload_zip", headers=auth, files={"dest_path": (None, "/x")}), 400),
        (httpx.post(f"{base}/upload_zip", headers=auth, data={"dest_path": "/x"}), 415),
        (httpx.post(f"{base}/upload_zip", headers=auth, data={"dest_path": "relative"},
                    files={"zip_file": ("a.zip", _zip([]))}), 400),
        (httpx.post(f"{base}/upload_zip", headers=auth, data={"dest_path": "/bad/file.txt"},
                    files={"zip_file": ("a.zip", _zip([("a", b"a", 0o644)]))}), 409),
        (httpx.post(f"{base}/upload_zip", headers={**auth, "content-type": "application/json"}, content=b"{}"), 415),
        (httpx.get(f"{control_plane.base_url}/browsers/nope/fs/list_files?path=/", headers=auth), 404),
    ]
    for response, status in cases:
        assert response.status_code == status, (response.request.url, response.status_code, response.text)
        body = response.json()
        assert isinstance(body["code"], str) and isinstance(body["message"], str)
    assert (root / "bad/file.txt").read_bytes() == b"x"


def test_uploads_over_the_limit_are_413_and_write_nothing(tmp_path):
    server = ControlPlane(tmp_path / "data", extra_args=["--max-upload-bytes", "1000"]).start()
    try:
        client = kernel.Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        session = client.browsers.create(headless=True)
        root = vm_root(server, session.session_id)
        with pytest.raises(kernel.APIStatusError) as refused:
            client.browsers.fs.write_file(session.session_id, contents=b"x" * 5000, path="/big.bin")
        assert refused.value.status_code == 413
        # Streamed without a length: the limit still holds, and nothing half-written stays.
        response = httpx.put(
            f"{server.base_url}/browsers/{session.session_id}/fs/write_file?path=/big.bin",
            headers={"Authorization": f"Bearer {server.api_key}"},
            content=(b"y" * 500 for _ in range(10)),
        )
        assert response.status_code == 413 and response.json()["code"] == "payload_too_large"
        with pytest.raises(kernel.APIStatusError) as refused:
            client.browsers.fs.upload_zip(session.session_id, dest_path="/z", zip_file=os.urandom(5000))
        assert refused.value.status_code == 413
        # The refused write's hidden temporary file goes when the cancelled call reaches
        # the agent, a moment after the answer.
        # The VM's root is its user's home: Chromium keeps its own dot-directories there.
        chromium_own = {"user-data", ".cache", ".config", ".local", ".pki"}
        assert wait_until(lambda: set(os.listdir(root)) <= chromium_own, 5), os.listdir(root)
        client.browsers.delete_by_id(session.session_id)
    finally:
        server.reap_everything()


def test_another_organizations_browser_filesystem_is_404(control_plane, session):
    intruder = kernel.Kernel(api_key=control_plane.create_api_key("org-fs-intruder"),
                             base_url=control_plane.base_url, max_retries=0)
    with pytest.raises(kernel.NotFoundError):
        intruder.browsers.fs.list_files(session.session_id, path="/")
    with pytest.raises(kernel.NotFoundError):
        intruder.browsers.fs.write_file(session.session_id, contents=b"x", path="/intrusion")
