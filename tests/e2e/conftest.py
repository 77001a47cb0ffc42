from __future__ import annotations

import http.server
import threading

import pytest
from kernel import Kernel

from harness import ControlPlane

TEST_PAGE_TITLE = "Kernel compatibility test page"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    server = ControlPlane(tmp_path_factory.mktemp("cp") / "data").start()
    yield server
    server.reap_everything()


@pytest.fixture(scope="module")
def client(control_plane) -> Kernel:
    return Kernel(api_key=control_plane.api_key, base_url=control_plane.base_url, max_retries=0)


# Records every DOM input event (screen coordinates, button, modifiers) in window.events.
# The context menu is suppressed so a right click leaves no native menu over the page.
EVENTS_PAGE = """<!doctype html><html><head><title>events</title><style>
html, body { margin: 0; height: 3000px; background: rgb(10, 200, 30); }
#text { position: fixed; left: 600px; top: 150px; width: 300px; }
</style></head><body><input id="text" autocomplete="off">
<script>
window.events = [];
for (const type of ["mousedown", "mouseup", "click", "dblclick", "contextmenu", "mousemove", "wheel", "keydown"]) {
  document.addEventListener(type, (e) => {
    window.events.push({ type, x: e.screenX, y: e.screenY, button: e.button, buttons: e.buttons,
                         shift: e.shiftKey, ctrl: e.ctrlKey, key: e.key });
    if (type === "contextmenu") e.preventDefault();
  }, true);
}
</script></body></html>"""


# Paints the whole page one of three colours chosen by the wall clock's second, so a
# recording's frame can be checked against the time it was captured.
COLOURS_PAGE = """<!doctype html><html><head><title>colours</title><style>
html, body { margin: 0; height: 100%; }
</style></head><body><script>
const colours = ["rgb(255, 0, 0)", "rgb(0, 255, 0)", "rgb(0, 0, 255)"];
(function paint() {
  document.body.style.background = colours[Math.floor(Date.now() / 1000) % 3];
  requestAnimationFrame(paint);
})();
</script></body></html>"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/events.html"):
            body = EVENTS_PAGE.encode()
        elif self.path.startswith("/colours.html"):
            body = COLOURS_PAGE.encode()
        else:
            body = f"<!doctype html><title>{TEST_PAGE_TITLE}</title><h1>hello</h1>".encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def test_page_url():
    """A page served by the test itself, on loopback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/page.html"
    server.shutdown()
