"""The organization's extension library through the official SDK."""

from __future__ import annotations

import hashlib
import io
import subprocess
import zipfile
from pathlib import Path

import httpx
import kernel
import pytest
from kernel import Kernel

from extensions_kit import make_extension
from harness import vm_root
from sdk import SEED_ERA, items


def test_library_upload_list_download_delete(control_plane, client):
    first = make_extension("lib-first")
    second = make_extension("lib-second", top_folder="packed")
    one = client.extensions.upload(file=("first.zip", first), name="lib-first")
    two = client.extensions.upload(file=("second.zip", second))
    assert one.name == "lib-first" and two.name is None
    assert one.id.startswith("ext_") and one.last_used_at is None

    listed = {e.id: e for e in client.extensions.list()}
    assert listed[one.id].size_bytes == len(first) and listed[two.id].size_bytes == len(second)

    assert client.extensions.download(one.id).read() == first
    assert client.extensions.download("lib-first").read() == first
    assert client.extensions.download(two.id).read() == second
    raw = httpx.get(f"{control_plane.base_url}/extensions/lib-first",
                    headers={"Authorization": f"Bearer {control_plane.api_key}"})
    assert raw.headers["content-type"] == "application/zip"
    assert raw.headers["content-length"] == str(len(first))
    assert 'filename="lib-first.zip"' in raw.headers["content-disposition"]

    # Metadata with the archive's checksum (today's `extensions.get`).
    metadata = (client.get("/extensions/lib-first/metadata", cast_to=object) if SEED_ERA
                else client.extensions.get("lib-first").to_dict(mode="json"))
    assert metadata["id"] == one.id and metadata["checksum"] == hashlib.sha256(first).hexdigest()

    # Another organization sees none of it, by id or by name, even with the same name.
    other = Kernel(api_key=control_plane.create_api_key("org-ext-b"), base_url=control_plane.base_url,
                   max_retries=0)
    assert items(other.extensions.list()) == []
    for reference in (one.id, "lib-first"):
        with pytest.raises(kernel.NotFoundError):
            other.extensions.download(reference)
        with pytest.raises(kernel.NotFoundError):
            other.extensions.delete(reference)
        with pytest.raises(kernel.NotFoundError):
            other.get(f"/extensions/{reference}/metadata", cast_to=object)
    theirs = other.extensions.upload(file=("first.zip", make_extension("theirs")), name="lib-first")
    assert client.extensions.download("lib-first").read() == first
    assert other.extensions.download("lib-first").read() != first

    client.extensions.delete("lib-first")
    assert [e.id for e in client.extensions.list()] == [two.id]
    with pytest.raises(kernel.NotFoundError):
        client.extensions.download(one.id)
    with pytest.raises(kernel.NotFoundError):
        client.extensions.delete(one.id)
    client.extensions.delete(two.id)
    other.extensions.delete(theirs.id)


def test_library_bad_input_answers_the_error_shape(control_plane, client):
    base = f"{control_plane.base_url}/extensions"
    auth = {"Authorization": f"Bearer {control_plane.api_key}"}
    no_manifest = io.BytesIO()
    with zipfile.ZipFile(no_manifest, "w") as archive:
        archive.writestr("a/manifest.json", "{}")
        archive.writestr("b/other.txt", "two top-level folders")
    with_symlink = io.BytesIO()
    with zipfile.ZipFile(with_symlink, "w") as archive:
        archive.writestr("manifest.json", "{}")
        link = zipfile.ZipInfo("escape")
        link.external_attr = 0o120777 << 16
        archive.writestr(link, "/etc")
    good = make_extension("dup")
    client.extensions.upload(file=("dup.zip", good), name="dup")
    cases = [
        (httpx.post(base, headers=auth, files={"name": (None, "x")}), 400, "file"),
        (httpx.post(base, headers=auth, files={"file": ("a.zip", b"not a zip")}), 400, "ZIP"),
        (httpx.post(base, headers=auth, files={"file": ("a.zip", no_manifest.getvalue())}), 400, "manifest.json"),
        (httpx.post(base, headers=auth, files={"file": ("a.zip", good), "name": (None, "bad name!")}), 400, "name"),
        (httpx.post(base, headers=auth, files={"file": ("a.zip", good), "name": (None, "..")}), 400, "name"),
        (httpx.post(base, headers=auth, files={"file": ("a.zip", with_symlink.getvalue())}), 400, "symlink"),
        (httpx.post(base, headers=auth, files={"file": ("a.zip", good), "name": (None, "x" * 256)}), 400, "name"),
        (httpx.post(base, headers=auth, files={"file": ("a.zip", good), "name": (None, "dup")}), 409, "dup"),
        (httpx.post(base, headers=auth, files={"file": ("a.zip", good), "other": (None, "?")}), 400, "other"),
        (httpx.post(base, headers={**auth, "content-type": "application/json"}, content=b"{}"), 415, "multipart"),
        (httpx.get(f"{base}/nope", headers=auth), 404, "nope"),
        (httpx.delete(f"{base}/nope", headers=auth), 404, "nope"),
    ]
    for response, status, named in cases:
        assert response.status_code == status, (response.request.url, response.status_code, response.text)
        body = response.json()
        assert isinstance(body["code"], str) and named in body["message"], body
    client.extensions.delete("dup")
    assert items(client.extensions.list()) == []


def test_archives_over_the_limit_are_413(tmp_path):
    from harness import ControlPlane
    server = ControlPlane(tmp_path / "data", extra_args=["--max-extension-bytes", "2000"]).start()
    try:
        client = Kernel(api_key=server.api_key, base_url=server.base_url, max_retries=0)
        with pytest.raises(kernel.APIStatusError) as refused:
            client.extensions.upload(file=("big.zip", make_extension("big") + bytes(5000)))
        assert refused.value.status_code == 413
        assert items(client.extensions.list()) == []
        assert [p.name for p in (tmp_path / "data/blobs/.incoming").iterdir()] == []
    finally:
        server.reap_everything()


def _page_marks(cdp_ws_url: str, page_url: str, markers: list[str]) -> tuple[dict, list[str]]:
    """Opens `page_url` over CDP; answers each marker's attribute value and the URLs of
    the extension service workers CDP lists."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(cdp_ws_url)
        page = browser.contexts[0].new_page()
        page.goto(page_url)
        marks = {m: page.evaluate(f"document.documentElement.getAttribute('data-{m}')") for m in markers}
        targets = browser.new_browser_cdp_session().send("Target.getTargets")["targetInfos"]
        browser.close()
    workers = [t["url"] for t in targets if t["type"] == "service_worker" and t["url"].startswith("chrome-extension://")]
    return marks, workers


def test_extensions_load_at_creation_and_into_a_running_browser(control_plane, client, test_page_url, tmp_path):
    library = client.extensions.upload(file=("created.zip", make_extension("at-create")), name="at-create")
    session = client.browsers.create(extensions=[{"name": "at-create"}], timeout_seconds=300)
    try:
        marks, workers = _page_marks(session.cdp_ws_url, test_page_url, ["at-create"])
        assert marks == {"at-create": "loaded"} and len(workers) == 1
        used = {e.id: e for e in client.extensions.list()}[library.id]
        assert used.last_used_at is not None

        # Python SDK (positional multipart encoding).
        client.browsers.load_extensions(session.session_id, extensions=[
            {"name": "from-python", "zip_file": ("p.zip", make_extension("from-python", top_folder="inner"))},
        ])
        marks, workers = _page_marks(session.cdp_ws_url, test_page_url, ["at-create", "from-python"])
        assert marks == {"at-create": "loaded", "from-python": "loaded"} and len(workers) == 2

        # TypeScript SDK (indexed multipart encoding); earlier extensions are kept.
        archive = tmp_path / "ts.zip"
        archive.write_bytes(make_extension("from-typescript"))
        script = Path(__file__).parent / "node-clients" / "load_extensions.mjs"
        result = subprocess.run(["node", str(script), control_plane.base_url, control_plane.api_key,
                                 session.session_id, "from-typescript", str(archive)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        marks, workers = _page_marks(session.cdp_ws_url, test_page_url,
                                     ["at-create", "from-python", "from-typescript"])
        assert set(marks.values()) == {"loaded"} and len(workers) == 3
        unpacked = vm_root(control_plane, session.session_id) / "home/kernel/extensions"
        assert sorted(p.name for p in unpacked.iterdir()) == ["at-create", "from-python", "from-typescript"]
    finally:
        client.browsers.delete_by_id(session.session_id)
        client.extensions.delete(library.id)


def test_loading_bad_extensions_answers_the_error_shape(control_plane, client):
    # A reference to nothing is a 404, as the extension's own routes answer.
    with pytest.raises(kernel.NotFoundError, match="no extension"):
        client.browsers.create(extensions=[{"name": "never-uploaded"}], headless=True)
    with pytest.raises(kernel.BadRequestError):
        client.browsers.create(extensions=[{}], headless=True)
    session = client.browsers.create(headless=True)
    try:
        base = f"{control_plane.base_url}/browsers/{session.session_id}/extensions"
        auth = {"Authorization": f"Bearer {control_plane.api_key}"}
        no_manifest = io.BytesIO()
        with zipfile.ZipFile(no_manifest, "w") as archive:
            archive.writestr("readme.txt", "no manifest here")
        good = make_extension("bad-input")
        cases = [
            ([("extensions[][zip_file]", ("a.zip", good))], 400, "no name"),
            ([("extensions[][name]", (None, "lonely"))], 400, "zip_file"),
            ([("extensions[][name]", (None, "bad name")), ("extensions[][zip_file]", ("a.zip", good))], 400, "name"),
            ([("extensions[][name]", (None, "notzip")), ("extensions[][zip_file]", ("a.zip", b"plain text"))], 400, "ZIP"),
            ([("extensions[][name]", (None, "nomanifest")),
              ("extensions[][zip_file]", ("a.zip", no_manifest.getvalue()))], 400, "manifest.json"),
            ([("something", (None, "x"))], 400, "something"),
        ]
        for files, status, named in cases:
            response = httpx.post(base, headers=auth, files=files, timeout=60)
            assert response.status_code == status, (files[0][0], response.status_code, response.text)
            assert named in response.json()["message"], response.json()
        # A refused re-load of a loaded extension leaves the loaded one as it was.
        client.browsers.load_extensions(session.session_id, extensions=[
            {"name": "keeper", "zip_file": ("k.zip", make_extension("keeper"))}])
        unpacked = vm_root(control_plane, session.session_id) / "home/kernel/extensions"
        before = (unpacked / "keeper/mark.js").read_bytes()
        response = httpx.post(base, headers=auth, timeout=60, files=[
            ("extensions[][name]", (None, "keeper")), ("extensions[][zip_file]", ("k.zip", no_manifest.getvalue()))])
        assert response.status_code == 400, response.text
        assert (unpacked / "keeper/mark.js").read_bytes() == before
        assert sorted(p.name for p in unpacked.iterdir()) == ["keeper"]
        # The browser still works after the refused loads.
        assert client.browsers.retrieve(session.session_id).session_id == session.session_id
    finally:
        client.browsers.delete_by_id(session.session_id)
