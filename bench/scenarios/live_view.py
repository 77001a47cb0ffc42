"""The live view (`browser_live_view_url`) next to x11vnc + noVNC (Debian's `x11vnc` and
`novnc` with its `websockify`) on the same 1920x1080 display, in the same run, each
watched by a real Chromium (headless, outside the VM):

- glass-to-glass latency: the session's page turns a new colour and records the instant;
  the viewer page checks the pixel of its canvas after every drawing call on it and
  records when the new colour is there (same machine, same clock); p50 and p90, with one
  viewer and with five (measured on the first);
- frames delivered per second on a page animating all the time (changes of a pixel of
  the viewer's canvas);
- CPU of the serving side per second of animation: ours the agent and the control
  plane, the reference x11vnc and websockify; with one viewer and with five.

Goals: latency p50 <= 100 ms and <= 0.5x the reference; CPU with five viewers <= 1.2x
with one."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from harness import ControlPlane, cpu_seconds, first_tab, session_processes
from scenarios import api_client
from scenarios.record_cpu import display_of

VIEWPORT = (1920, 1080)
SAMPLES = 30
ANIMATION_SECONDS = 8
PROBE = (960, 900)  # a pixel of the page, below the browser's toolbar

FLIP_PAGE = """<!doctype html><html><head><style>html, body { margin: 0; height: 100%; background: rgb(255, 0, 0); }
</style></head><body><script>
window.flip = (colour) => { document.body.style.background = colour; return Date.now(); };
window.animate = (on) => {
  window.animating = on;
  let hue = 0;
  (function step() { if (!window.animating) return;
    hue = (hue + 7) % 360; document.body.style.background = `hsl(${hue}, 90%, 50%)`;
    requestAnimationFrame(step); })();
};
</script></body></html>"""

# Installed in a viewer page: looks at one pixel of `canvas` right after every drawing
# call on it (both viewers draw with drawImage or putImageData), so "seen" is when the
# new colour is on the viewer's canvas, the same instant for both kinds.
WATCHER = """([selector, x, y]) => {
  const canvas = document.querySelector(selector);
  window.probe = { wanted: null, seenAt: 0, changes: 0, last: '' };
  const look = (context) => {
    if (context.canvas !== canvas || canvas.width <= x || canvas.height <= y) return;
    const [r, g, b] = context.getImageData(x, y, 1, 1).data;
    const seen = `${r},${g},${b}`;
    if (seen !== window.probe.last) { window.probe.changes += 1; window.probe.last = seen; }
    const wanted = window.probe.wanted;
    if (wanted && !window.probe.seenAt && Math.abs(r - wanted[0]) < 40 && Math.abs(g - wanted[1]) < 40
        && Math.abs(b - wanted[2]) < 40) window.probe.seenAt = Date.now();
  };
  for (const method of ['drawImage', 'putImageData']) {
    const original = CanvasRenderingContext2D.prototype[method];
    CanvasRenderingContext2D.prototype[method] = function (...args) {
      const result = original.apply(this, args);
      look(this);
      return result;
    };
  }
}"""

COLOURS = [(0, 0, 255), (255, 0, 0)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def connect_in_network_of(pid: int, port: int) -> socket.socket:
    """A TCP connection to 127.0.0.1:port as the network namespace of `pid` sees it, made
    from a thread that enters that namespace (setns affects the calling thread only)."""
    made: dict = {}

    def enter_and_connect():
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        descriptor = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(descriptor, 0x40000000) != 0:  # CLONE_NEWNET
                made["error"] = OSError(ctypes.get_errno(), "setns")
                return
        finally:
            os.close(descriptor)
        try:
            made["socket"] = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError as error:
            made["error"] = error

    worker = threading.Thread(target=enter_and_connect)
    worker.start()
    worker.join()
    if "error" in made:
        raise made["error"]
    made["socket"].settimeout(None)
    return made["socket"]


def bridge_into_vm(pid: int, port: int) -> int:
    """Listens on the host's loopback and forwards each connection to 127.0.0.1:port in
    the VM's network namespace (the VM's display, and so x11vnc, lives there); answers
    the host port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def pump(source, sink):
        try:
            while data := source.recv(262144):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve():
        while True:
            client, _ = listener.accept()
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream = connect_in_network_of(pid, port)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


class Viewers:
    """`count` viewer pages of one kind; the first is the one measured."""

    def __init__(self, browser, url: str, selector: str, ready: str, count: int):
        self.pages = []
        for _ in range(count):
            page = browser.new_page(viewport={"width": 1940, "height": 1120})
            page.goto(url)
            page.wait_for_function(ready, timeout=20_000)
            page.evaluate(WATCHER, [selector, *PROBE])
            self.pages.append(page)

    def close(self):
        for page in self.pages:
            page.close()


def latencies(session_page, viewer) -> list[float]:
    found = []
    for index in range(SAMPLES):
        colour = COLOURS[index % 2]
        viewer.evaluate("(wanted) => { window.probe.wanted = wanted; window.probe.seenAt = 0; }", list(colour))
        changed_at = session_page.evaluate(f"window.flip('rgb{colour}')")
        viewer.wait_for_function("() => window.probe.seenAt > 0", timeout=10_000, polling=5)
        found.append((viewer.evaluate("window.probe.seenAt") - changed_at) / 1000)
        time.sleep(0.15)
    return found


def animated(session_page, viewers: Viewers, serving: list[int]) -> tuple[float, float]:
    """(frames per second seen by the first viewer, serving CPU seconds per second)."""
    session_page.evaluate("window.animate(true)")
    time.sleep(1)
    changes = viewers.pages[0].evaluate("window.probe.changes")
    cpu = cpu_seconds(serving)
    started = time.monotonic()
    time.sleep(ANIMATION_SECONDS)
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(serving) - cpu
    changes = viewers.pages[0].evaluate("window.probe.changes") - changes
    session_page.evaluate("window.animate(false)")
    time.sleep(0.5)
    return changes / elapsed, cpu / elapsed


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    vnc = None
    websockify = None
    try:
        http = api_client(server)
        session = http.post("/browsers", json={
            "viewport": {"width": VIEWPORT[0], "height": VIEWPORT[1]}, "timeout_seconds": 900,
        }).raise_for_status().json()
        processes = session_processes(server, session["session_id"])
        display = display_of(processes["chromium"])
        ours_serving = [*processes["agent"], server.process.pid]

        # x11vnc runs in the VM's network namespace, where its display is; websockify on
        # the host reaches it through a bridge (this process, not counted in its CPU).
        (xvfb,) = processes["xvfb"]
        rfb_port, web_port = 5900, free_port()
        # As the VM's user, in its IPC namespace too, so x11vnc reads frames through MIT-SHM as
        # the agent does.
        uid, gid = (int(line.split()[1]) for line in Path(f"/proc/{xvfb}/status").read_text().splitlines()
                    if line.startswith(("Uid:", "Gid:")))
        vnc = subprocess.Popen(["nsenter", f"--net=/proc/{xvfb}/ns/net", f"--ipc=/proc/{xvfb}/ns/ipc",
                                "-S", str(uid), "-G", str(gid), "--", "x11vnc", "-display", display,
                                "-rfbport", str(rfb_port), "-localhost", "-nopw", "-shared", "-forever", "-quiet"],
                               stdout=subprocess.DEVNULL, stderr=open(work_dir / "x11vnc.log", "wb"))
        time.sleep(2)
        bridge_port = bridge_into_vm(xvfb, rfb_port)
        websockify = subprocess.Popen(["websockify", "--web", "/usr/share/novnc", f"127.0.0.1:{web_port}",
                                       f"127.0.0.1:{bridge_port}"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        time.sleep(1)
        reference_serving = [vnc.pid, websockify.pid]
        novnc_url = (f"http://127.0.0.1:{web_port}/vnc_lite.html?host=127.0.0.1&port={web_port}"
                     "&autoconnect=true&scale=false")

        with sync_playwright() as playwright:
            cdp = playwright.chromium.connect_over_cdp(session["cdp_ws_url"])
            session_page = first_tab(cdp)
            session_page.set_content(FLIP_PAGE)
            session_page.bring_to_front()
            viewer_browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                        args=["--no-sandbox"])
            kinds = {
                "ours": (session["browser_live_view_url"], "#screen", "() => window.liveView.frames > 0",
                         ours_serving),
                "x11vnc + noVNC": (novnc_url, "#screen canvas",
                                   "() => { const c = document.querySelector('#screen canvas');"
                                   " return c && c.width >= 1920; }", reference_serving),
            }
            results = {}
            for count in (1, 5):
                for kind, (url, selector, ready, serving) in kinds.items():
                    viewers = Viewers(viewer_browser, url, selector, ready, count)
                    try:
                        time.sleep(1)
                        measured = latencies(session_page, viewers.pages[0])
                        fps, cpu = animated(session_page, viewers, serving)
                        results[(kind, count)] = (measured, fps, cpu)
                    finally:
                        viewers.close()
            viewer_browser.close()
            cdp.close()

        for count in (1, 5):
            ours, ours_fps, ours_cpu = results[("ours", count)]
            reference, reference_fps, reference_cpu = results[("x11vnc + noVNC", count)]
            report(f"live_view: glass-to-glass latency at 1920x1080, {count} viewer(s)", ours,
                   {"x11vnc + noVNC": reference})
            print(f"frames/s delivered (animated page)  ours {ours_fps:6.1f}   x11vnc + noVNC {reference_fps:6.1f}")
            print(f"serving CPU per second (animated)   ours {ours_cpu:6.3f}   x11vnc + noVNC {reference_cpu:6.3f}"
                  f"   ratio {ours_cpu / max(reference_cpu, 1e-6):.2f}x")
        one, five = results[("ours", 1)][2], results[("ours", 5)][2]
        reference_one, reference_five = results[("x11vnc + noVNC", 1)][2], results[("x11vnc + noVNC", 5)][2]
        print(f"CPU with five viewers / with one     ours {five / max(one, 1e-6):.2f}x"
              f"   x11vnc + noVNC {reference_five / max(reference_one, 1e-6):.2f}x")
        http.delete(f"/browsers/{session['session_id']}").raise_for_status()
    finally:
        for process in (vnc, websockify):
            if process is not None:
                process.kill()
                process.wait()
        server.reap_everything()
