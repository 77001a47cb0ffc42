"""The live view behind `browser_live_view_url`: a second, real Chromium opens it, sees
the session's screen change, and drives the session's page with mouse, keyboard and
paste; watch-only and embed variants; tokens bound to their session and its life."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from kernel import Kernel

from harness import first_tab, session_processes, wait_until
from sdk import field, once, update_browser

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

WIDTH, HEIGHT = 1280, 800

# A page filling the screen with one colour, recording clicks (screen coordinates) and
# what reaches its text field.
SESSION_PAGE = """<!doctype html><html><head><style>
html, body { margin: 0; height: 100%; background: rgb(255, 0, 0); }
#text { position: fixed; left: 300px; top: 200px; width: 400px; font-size: 20px; }
</style></head><body><input id="text" autocomplete="off"><script>
window.clicks = [];
document.addEventListener("mousedown", (e) => window.clicks.push({ x: e.screenX, y: e.screenY, button: e.button }), true);
document.addEventListener("contextmenu", (e) => e.preventDefault());
</script></body></html>"""


def live_url(session) -> str:
    return field(session, "browser_live_view_url")


def read_only_url(session) -> str:
    return field(session, "browser_live_view_read_only_url")


@pytest.fixture
def viewer_browser(local_chromium):
    """A fresh context of the viewer's Chromium for each test: views a failed test left
    open close with it, so they cannot keep the next test's encoder running."""
    context = local_chromium.new_context(viewport={"width": 1400, "height": 900})
    yield context
    context.close()


@pytest.fixture(scope="module")
def watched(client, playwright):
    """A headful session showing SESSION_PAGE, and a Playwright page on it."""
    session = client.browsers.create(viewport={"width": WIDTH, "height": HEIGHT}, timeout_seconds=600)
    browser = playwright.chromium.connect_over_cdp(session.cdp_ws_url)
    page = first_tab(browser)
    page.set_content(SESSION_PAGE)
    page.bring_to_front()
    yield session, page
    browser.close()
    client.browsers.delete_by_id(session.session_id)


def canvas_colour(viewer, x: int, y: int) -> list[int]:
    """The viewer's rendered pixel of screen point (x, y)."""
    return viewer.evaluate(
        """([x, y]) => Array.from(document.getElementById('screen').getContext('2d')
              .getImageData(x, y, 1, 1).data.slice(0, 3))""",
        [x, y],
    )


def open_viewer(viewer_browser, url: str):
    viewer = viewer_browser.new_page()
    viewer.goto(url)
    viewer.wait_for_function("() => window.liveView.frames > 0", timeout=10_000)
    return viewer


def near(colour: list[int], wanted: tuple[int, int, int], tolerance: int = 40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(colour, wanted))


def screen_to_viewer(viewer, x: int, y: int) -> tuple[float, float]:
    """Where screen point (x, y) is drawn in the viewer's window."""
    box = viewer.evaluate("""() => { const r = document.getElementById('screen').getBoundingClientRect();
        const c = document.getElementById('screen'); return [r.left, r.top, r.width / c.width, r.height / c.height]; }""")
    return box[0] + (x + 0.5) * box[2], box[1] + (y + 0.5) * box[3]


def test_sessions_answer_live_view_urls_only_when_headful(client):
    headful = client.browsers.retrieve(client.browsers.create(timeout_seconds=60).session_id)
    try:
        url = live_url(headful)
        assert url.startswith("http") and f"/browsers/{headful.session_id}/live?jwt=" in url
        assert read_only_url(headful) != url
    finally:
        client.browsers.delete_by_id(headful.session_id)
    headless = client.browsers.create(headless=True, timeout_seconds=60)
    try:
        assert live_url(headless) is None
    finally:
        client.browsers.delete_by_id(headless.session_id)


def test_the_viewer_sees_the_page_change_within_a_second_and_drives_it(watched, viewer_browser):
    session, page = watched
    viewer = open_viewer(viewer_browser, live_url(session))
    assert viewer.evaluate("document.getElementById('screen').width") == WIDTH
    assert viewer.evaluate("document.getElementById('screen').height") == HEIGHT
    # The page (below the browser's own toolbar) is red in the viewer.
    assert wait_until(lambda: near(canvas_colour(viewer, WIDTH // 2, HEIGHT - 50), (255, 0, 0)), 3)

    # Timed in the two pages, by the wall clock they share on this host (Python's own
    # calls into them take long on a busy machine): the viewer notes when its canvas turns
    # blue, the session's page when it turned blue.
    viewer.evaluate("""([x, y]) => { window.blueAt = null; const screen = document.getElementById('screen');
        const look = () => { const [r, g, b] = screen.getContext('2d').getImageData(x, y, 1, 1).data;
            if (b > 215 && r < 40 && g < 40) window.blueAt = Date.now(); else setTimeout(look, 5); };
        look(); }""", [WIDTH // 2, HEIGHT - 50])
    changed_at = page.evaluate("() => { document.body.style.background = 'rgb(0, 0, 255)'; return Date.now(); }")
    assert wait_until(lambda: viewer.evaluate("window.blueAt") is not None, 10), "the viewer never turned blue"
    assert viewer.evaluate("window.blueAt") - changed_at < 1000, "the viewer did not turn blue within 1 s"
    assert near(canvas_colour(viewer, WIDTH // 2, HEIGHT - 50), (0, 0, 255))

    # A click in the viewer lands at the same screen point in the session's page.
    x, y = screen_to_viewer(viewer, 420, 500)
    viewer.mouse.click(x, y)
    assert wait_until(lambda: page.evaluate("window.clicks.length") > 0, 3)
    click = page.evaluate("window.clicks[0]")
    assert (click["x"], click["y"], click["button"]) == (420, 500, 0)

    # Right button too.
    viewer.mouse.click(*screen_to_viewer(viewer, 430, 510), button="right")
    assert wait_until(lambda: page.evaluate("window.clicks.length") > 1, 3)
    assert page.evaluate("window.clicks[1]")["button"] == 2

    # Typing: focus the field through the viewer, then text with non-ASCII characters,
    # a shortcut with a modifier (select all) and special keys.
    page.evaluate("document.addEventListener('mousedown', (e) => window.offset = [e.screenX - e.clientX, e.screenY - e.clientY], true)")
    viewer.mouse.click(*screen_to_viewer(viewer, 100, 600))
    assert wait_until(lambda: page.evaluate("window.offset !== undefined"), 3)
    dx, dy = page.evaluate("window.offset")
    field = page.evaluate("(() => { const r = document.getElementById('text').getBoundingClientRect(); return [r.left + 30, r.top + r.height / 2]; })()")
    viewer.mouse.click(*screen_to_viewer(viewer, int(field[0] + dx), int(field[1] + dy)))
    assert wait_until(lambda: page.evaluate("document.activeElement.id") == "text", 3)
    # Key by key, as a keyboard whose layout has these keys sends them (Playwright's
    # `type` would insert characters outside the US layout as text, without key events).
    keyboard = viewer.context.new_cdp_session(viewer)
    for character in "Grüße, naïve café!":
        keyboard.send("Input.dispatchKeyEvent", {"type": "keyDown", "key": character, "text": character})
        keyboard.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": character})
    assert wait_until(lambda: page.evaluate("document.getElementById('text').value") == "Grüße, naïve café!", 5), \
        page.evaluate("document.getElementById('text').value")
    viewer.keyboard.press("Control+a")
    viewer.keyboard.type("Zed")
    viewer.keyboard.press("Backspace")
    assert wait_until(lambda: page.evaluate("document.getElementById('text').value") == "Ze", 5), \
        page.evaluate("document.getElementById('text').value")

    # Paste: the viewer's clipboard text arrives in the page.
    viewer.evaluate("""() => { const data = new DataTransfer(); data.setData('text/plain', ' pasted ✓');
        window.dispatchEvent(new ClipboardEvent('paste', { clipboardData: data })); }""")
    assert wait_until(lambda: page.evaluate("document.getElementById('text').value") == "Ze pasted ✓", 5), \
        page.evaluate("document.getElementById('text').value")

    # Scrolling with the wheel scrolls the session's page.
    page.evaluate("document.body.style.height = '5000px'")
    viewer.mouse.move(*screen_to_viewer(viewer, 640, 600))
    viewer.mouse.wheel(0, 300)
    assert wait_until(lambda: page.evaluate("window.scrollY") > 0, 3)
    viewer.close()


def test_the_view_follows_viewport_changes(client, watched, viewer_browser):
    session, _ = watched
    viewer = open_viewer(viewer_browser, live_url(session))
    update_browser(client, session.session_id, viewport={"width": 1024, "height": 768})
    assert wait_until(lambda: viewer.evaluate("document.getElementById('screen').width") == 1024, 10)
    assert viewer.evaluate("document.getElementById('screen').height") == 768
    update_browser(client, session.session_id, viewport={"width": WIDTH, "height": HEIGHT})
    assert wait_until(lambda: viewer.evaluate("document.getElementById('screen').width") == WIDTH, 10)
    viewer.close()


def test_read_only_ignores_input_and_embed_has_no_controls(watched, viewer_browser):
    session, page = watched
    page.evaluate("window.clicks = []; document.getElementById('text').value = ''; document.getElementById('text').focus()")
    viewer = open_viewer(viewer_browser, read_only_url(session))
    assert viewer.locator("#badge").is_visible(), "watch-only is visible"
    assert viewer.locator("#bar").is_visible()
    viewer.mouse.click(*screen_to_viewer(viewer, 400, 400))
    viewer.keyboard.type("nothing")
    # The server drops input on a watch-only view, whatever a client sends.
    viewer.evaluate("""() => new Promise((resolve) => {
        const socket = new WebSocket(location.href.replace(/^http/, 'ws').replace('/live?', '/live/ws?'));
        socket.onopen = () => {
          socket.send(JSON.stringify({ t: 'down', x: 400, y: 400, b: 1 }));
          socket.send(JSON.stringify({ t: 'up', x: 400, y: 400, b: 1 }));
          socket.send(JSON.stringify({ t: 'text', text: 'sneaky' }));
          socket.send(JSON.stringify({ t: 'paste', text: 'sneaky' }));
          setTimeout(() => { socket.close(); resolve(); }, 500);
        };
      })""")
    time.sleep(1)
    assert page.evaluate("window.clicks.length") == 0
    assert page.evaluate("document.getElementById('text').value") == ""
    viewer.close()

    embedded = open_viewer(viewer_browser, live_url(session) + "&embed=true")
    assert not embedded.locator("#bar").is_visible()
    assert not embedded.locator("button").first.is_visible()
    # The picture fills the frame: no toolbar above it.
    assert embedded.evaluate("document.getElementById('screen').getBoundingClientRect().top") <= 50
    embedded.close()


def test_tokens_open_only_their_session_and_die_with_it(client, control_plane, viewer_browser):
    first = client.browsers.retrieve(client.browsers.create(timeout_seconds=120).session_id)
    second = client.browsers.create(timeout_seconds=120)
    try:
        url = live_url(first)
        # Another session's token does not open this one.
        scheme, netloc, path, query, _ = urlsplit(url)
        swapped = urlunsplit((scheme, netloc, path.replace(first.session_id, second.session_id), query, ""))
        assert httpx.get(swapped).status_code == 401
        assert httpx.get(urlunsplit((scheme, netloc, path, "", ""))).status_code == 401
        assert httpx.get(urlunsplit((scheme, netloc, path, "jwt=forged", ""))).status_code == 401
        socket_url = urlunsplit((scheme, netloc, path + "/ws", "jwt=forged", ""))
        assert httpx.get(socket_url).status_code == 401
        # The CDP token is not a live view token.
        cdp_token = urlsplit(first.cdp_ws_url).query
        assert httpx.get(urlunsplit((scheme, netloc, path, cdp_token, ""))).status_code == 401

        # Organization B cannot obtain A's URL.
        other = Kernel(api_key=control_plane.create_api_key("org-live-b"), base_url=control_plane.base_url,
                       max_retries=0)
        with pytest.raises(Exception) as refused:
            other.browsers.retrieve(first.session_id)
        assert getattr(refused.value, "status_code", None) == 404

        viewer = open_viewer(viewer_browser, url)
        client.browsers.delete_by_id(first.session_id)
        # The open stream closes and the URL stops working.
        viewer.wait_for_function("() => window.liveView.closed", timeout=10_000)
        assert httpx.get(url).status_code in (401, 404)
        viewer.close()
    finally:
        for session in (first, second):
            try:
                client.browsers.delete_by_id(session.session_id)
            except Exception:
                pass


def agent_live_view_threads(control_plane, session_id: str) -> int:
    agents = session_processes(control_plane, session_id)["agent"]
    count = 0
    for pid in agents:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                if (task / "comm").read_text().strip() == "live-view":
                    count += 1
            except OSError:
                pass
    return count


def test_viewers_share_one_encoder_that_ends_with_the_last(control_plane, watched, viewer_browser):
    session, page = watched
    viewers = [open_viewer(viewer_browser, live_url(session)) for _ in range(3)]
    assert agent_live_view_threads(control_plane, session.session_id) == 1
    page.evaluate("document.body.style.background = 'rgb(0, 255, 0)'")
    for viewer in viewers:
        assert wait_until(lambda: near(canvas_colour(viewer, WIDTH // 2, HEIGHT - 50), (0, 255, 0)), 3)
    for viewer in viewers:
        viewer.close()
    assert wait_until(lambda: agent_live_view_threads(control_plane, session.session_id) == 0, 5), \
        "the encoder outlived its viewers"


def test_a_pool_browsers_view_ends_with_its_lease(client, viewer_browser):
    """The previous lessee's viewers must not watch the next lessee: releasing the
    browser closes its open views, and their URL no longer opens."""
    pool = client.browser_pools.create(size=1, fill_rate_per_minute=6000, headless=False)
    try:
        assert wait_until(lambda: client.browser_pools.retrieve(pool.id).available_count == 1, 60)
        leased = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=60)
        url = live_url(leased)
        viewer = open_viewer(viewer_browser, url)
        client.browser_pools.release(pool.id, session_id=leased.session_id, reuse=True)
        viewer.wait_for_function("() => window.liveView.closed", timeout=10_000)
        viewer.close()
        assert httpx.get(url).status_code == 401
        # The next lease has a view of its own.
        again = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=60)
        assert again.session_id == leased.session_id and live_url(again) != url
        viewer = open_viewer(viewer_browser, live_url(again))
        viewer.close()
        client.browser_pools.release(pool.id, session_id=again.session_id, reuse=False)
    finally:
        client.browser_pools.delete(pool.id, force=True)
