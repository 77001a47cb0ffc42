"""Small, real MV3 extensions made by the tests: a content script that marks every page
with a DOM attribute, and a service worker so that CDP lists a target for it."""

from __future__ import annotations

import io
import json
import zipfile


def make_extension(marker: str, top_folder: str | None = None) -> bytes:
    """A ZIP of an unpacked extension whose content script sets `data-<marker>="loaded"` on
    the document element of every http(s) page."""
    manifest = {
        "manifest_version": 3,
        "name": f"test extension {marker}",
        "version": "1.0",
        "background": {"service_worker": "worker.js"},
        "content_scripts": [{"matches": ["<all_urls>"], "js": ["mark.js"], "run_at": "document_start"}],
    }
    files = {
        "manifest.json": json.dumps(manifest).encode(),
        "mark.js": f'document.documentElement.setAttribute("data-{marker}", "loaded");'.encode(),
        "worker.js": b'self.addEventListener("install", () => self.skipWaiting());',
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(f"{top_folder}/{name}" if top_folder else name, data)
    return buffer.getvalue()
