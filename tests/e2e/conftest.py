from __future__ import annotations

import time

import pytest
from playwright.sync_api import sync_playwright
from kernel import Kernel

from harness import control_plane_for_module, serve_html, suite_vm_paths, vm_mounts_left, vm_processes_left

TEST_PAGE_TITLE = "Kernel compatibility test page"


@pytest.fixture(scope="session", autouse=True)
def no_vm_process_outlives_the_suite(tmp_path_factory):
    """After the whole suite (every control plane reaped), no process of a browser VM it
    started is left, zombies included, and no VM's disk is still mounted. Only the
    suite's own count: other browsers may run on the machine (`test_leak_check.py`)."""
    yield
    left = vm_processes_left(timeout=10, within=suite_vm_paths(tmp_path_factory.getbasetemp()))
    assert not left, f"browser VM processes left after the suite: {left}"
    mounts = vm_mounts_left(str(tmp_path_factory.getbasetemp()))
    assert not mounts, f"VM disks left mounted after the suite: {mounts}"


# The longest modules, longest first (as CI's "slowest modules" lines measure them). They
# go first, so that with several workers (deploy/test.sh runs two) none is left running
# alone at the end while the other workers idle. deploy/test.sh turns off pytest-xdist's
# own order (modules with the most tests first), which put the schema fuzz, one test of
# minutes, last.
LONG_MODULES = (
    "test_schema_fuzz.py", "test_replicas.py", "test_telemetry.py", "test_managed_auth.py",
    "test_apps.py", "test_replays.py", "test_console.py", "test_pools.py",
    "test_host_admission.py", "test_kubernetes.py", "test_lifecycle.py", "test_playwright.py",
    "test_profiles.py", "test_auth_credentials.py", "test_sign_in.py", "test_names_and_tags.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: position for position, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_MODULES)))


MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    # Also on the controller of a parallel run, which gets every worker's reports.
    module = report.location[0] if report.location else report.nodeid.split("::")[0]
    MODULE_SECONDS[module] = MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The slowest modules (setup, calls and teardown): what LONG_MODULES and the
    workers' balance are judged by."""
    slowest = sorted(MODULE_SECONDS.items(), key=lambda item: -item[1])[:12]
    if slowest:
        terminalreporter.write_line("slowest modules: " + ", ".join(f"{name} {seconds:.0f}s" for name, seconds in slowest))
        # Against the run's wall time times its workers: how well the workers were kept busy.
        terminalreporter.write_line(f"all modules: {sum(MODULE_SECONDS.values()):.0f}s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with the recent log of the control planes that were
    running (their data directories are gone by the time CI's output is read)."""
    outcome = yield
    report = outcome.get_result()
    if report.passed or report.skipped:
        return
    base = item.config._tmp_path_factory.getbasetemp()
    recent = [log for log in base.rglob("control-plane.log") if time.time() - log.stat().st_mtime < 120]
    for log in sorted(recent, key=lambda log: log.stat().st_mtime, reverse=True)[:2]:
        lines = log.read_text(errors="replace").splitlines()[-60:]
        report.sections.append((f"control-plane log {log.parent.name}", "\n".join(lines)))


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    yield from control_plane_for_module(tmp_path_factory)


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
                         shift: e.shiftKey, ctrl: e.ctrlKey, key: e.key, t: e.timeStamp });
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


def _page(path: str) -> bytes:
    if path.startswith("/events.html"):
        return EVENTS_PAGE.encode()
    if path.startswith("/colours.html"):
        return COLOURS_PAGE.encode()
    return f"<!doctype html><title>{TEST_PAGE_TITLE}</title><h1>hello</h1>".encode()


@pytest.fixture(scope="session")
def test_page_url():
    """A page served by the test itself, on loopback."""
    server = serve_html(_page)
    yield f"http://127.0.0.1:{server.server_address[1]}/page.html"
    server.shutdown()


@pytest.fixture(scope="module")
def playwright():
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def local_chromium(playwright):
    """A Chromium of this host's own, outside any VM: a person's browser, a viewer."""
    browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    yield browser
    browser.close()
