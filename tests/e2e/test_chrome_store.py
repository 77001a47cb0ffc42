"""Extensions from the Chrome Web Store, against a small store the test serves: the
control plane asks its update service for a CRX3 package (`--chrome-web-store-url`),
checks and strips the header, answers the ZIP inside and keeps it in the library."""

from __future__ import annotations

import struct
import urllib.parse

import httpx
import kernel
import pytest
from kernel import Kernel

from extensions_kit import make_extension
from harness import control_plane_for_module, quiet_handler, respond, serve, serving, vm_root
from sdk import SEED_ERA

KNOWN = "cjpalhdlnbpafiamejdnhcphjbkeiagm"
NOT_A_PACKAGE = "aaaabbbbccccddddeeeeffffgggghhhh"
UNKNOWN = "pppppppppppppppppppppppppppppppp"
ZIP = make_extension("from-store")


def crx3(zip_bytes: bytes) -> bytes:
    """A CRX3 package: magic, version 3, the length of the (signed, protobuf) header, the
    header and the ZIP. The header's bytes are opaque here."""
    header = b"\x12\x08not-real"
    return b"Cr24" + struct.pack("<II", 3, len(header)) + header + zip_bytes


class Store:
    """The store's update service: `/service/update2/crx?...&x=id%3D<id>%26uc`."""

    def __init__(self):
        asked: list[dict] = []
        self.asked = asked

        def get(handler):
            url = urllib.parse.urlsplit(handler.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            asked.append({"path": url.path, **query})
            wanted = dict(urllib.parse.parse_qsl(query.get("x", ""))).get("id")
            if url.path != "/service/update2/crx" or wanted not in (KNOWN, NOT_A_PACKAGE):
                handler.send_response(204)
                handler.end_headers()
                return
            body = crx3(ZIP) if wanted == KNOWN else b"<html>not a package</html>"
            respond(handler, 200, body, "application/x-chrome-extension")

        self.server = serve(quiet_handler(GET=get))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"


@pytest.fixture(scope="module")
def store():
    yield from serving(Store())


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory, store):
    yield from control_plane_for_module(tmp_path_factory, extra_args=["--chrome-web-store-url", store.url])


def from_store(control_plane, api_key: str | None = None, **params) -> httpx.Response:
    return httpx.get(f"{control_plane.base_url}/extensions/from_chrome_store", params=params,
                     headers={"Authorization": f"Bearer {api_key or control_plane.api_key}"}, timeout=60)


def test_an_extension_comes_from_the_store_unpacked_and_into_the_library(control_plane, client, store):
    url = f"https://chromewebstore.google.com/detail/some-extension/{KNOWN}"
    if SEED_ERA:
        answer = from_store(control_plane, url=url)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/zip"
        body = answer.content
    else:
        body = client.extensions.download_from_chrome_store(url=url).read()
    # The ZIP inside the package, byte for byte: the CRX header is gone.
    assert body == ZIP
    asked = store.asked[-1]
    assert asked["os"] == "linux" and asked["acceptformat"] == "crx3"
    assert f"id={KNOWN}" in asked["x"]

    # Kept in the library under the extension's id; a browser loads it by that name.
    library = {e.name: e for e in client.extensions.list()}
    assert library[KNOWN].size_bytes == len(ZIP)
    assert client.extensions.download(KNOWN).read() == ZIP
    session = client.browsers.create(headless=True, extensions=[{"name": KNOWN}])
    try:
        unpacked = vm_root(control_plane, session.session_id) / "home/kernel/extensions"
        assert (unpacked / KNOWN / "mark.js").is_file()
    finally:
        client.browsers.delete_by_id(session.session_id)

    # Asked again (a bare id, another os): answered again, the library keeps one.
    again = from_store(control_plane, url=KNOWN, os="win")
    assert again.status_code == 200 and again.content == ZIP
    assert store.asked[-1]["os"] == "win"
    assert [e.name for e in client.extensions.list()].count(KNOWN) == 1


def test_store_failures_and_bad_input_are_the_error_shape(control_plane, client):
    for params, status, mentions in [
        ({"url": UNKNOWN}, 404, "no extension"),
        ({"url": NOT_A_PACKAGE}, 502, "Cr24"),
        ({"url": "https://chromewebstore.google.com/detail/no-id-here"}, 400, "url"),
        ({"url": KNOWN, "os": "beos"}, 400, "os"),
        ({}, 400, "url"),
        ({"url": KNOWN, "arch": "arm"}, 400, "arch"),
    ]:
        answer = from_store(control_plane, **params)
        assert answer.status_code == status, (params, answer.text)
        assert mentions in answer.json()["message"], (params, answer.json())
    assert NOT_A_PACKAGE not in [e.name for e in client.extensions.list()]


def test_what_one_organization_fetched_is_not_anothers(control_plane, client):
    assert from_store(control_plane, url=KNOWN).status_code == 200
    other = Kernel(api_key=control_plane.create_api_key("store-org-b"), base_url=control_plane.base_url,
                   max_retries=0)
    with pytest.raises(kernel.NotFoundError):
        other.extensions.download(KNOWN)
