"""CPU cost of recording: CPU seconds per recorded second at 10 fps on a 1920x1080 display
showing an animated page, for a replay (the agent's grabber + its ffmpeg encoder + the X
server's extra work) next to `ffmpeg -f x11grab` with the same encoder settings on the
same display (ffmpeg + the X server's extra work), in the same run.

The X server's extra work is its CPU time while recording minus its CPU time over an
equally long stretch without recording (it also draws what Chromium paints)."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from harness import ControlPlane, descendants, first_tab, session_processes

ROUNDS = 3
SECONDS = 10
FRAMERATE = 10
VIEWPORT = (1920, 1080)
TICKS = os.sysconf("SC_CLK_TCK")

# Boxes moving, rotating and changing colour all over the screen, and a running clock.
ANIMATED_PAGE = """<!doctype html><html><head><style>
body { margin: 0; background: #202830; overflow: hidden; font: 64px sans-serif; color: #eee; }
.box { position: absolute; width: 180px; height: 180px; border-radius: 24px;
       animation: move 4s ease-in-out infinite alternate, tint 3s linear infinite; }
@keyframes move { from { transform: translate(0, 0) rotate(0deg); }
                  to { transform: translate(1500px, 700px) rotate(360deg); } }
@keyframes tint { 0% { background: #e33; } 33% { background: #3e3; } 66% { background: #33e; } 100% { background: #e33; } }
#clock { position: absolute; left: 40px; top: 900px; }
</style></head><body><div id="clock"></div><script>
for (let i = 0; i < 16; i++) {
  const box = document.createElement("div");
  box.className = "box";
  box.style.left = (i % 8) * 40 + "px";
  box.style.top = Math.floor(i / 8) * 100 + "px";
  box.style.animationDelay = -(i * 0.37) + "s, " + -(i * 0.21) + "s";
  document.body.appendChild(box);
}
(function tick() { document.getElementById("clock").textContent = new Date().toISOString(); requestAnimationFrame(tick); })();
</script></body></html>"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (all its threads), not of its children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def ffmpeg_children(agent: int) -> list[int]:
    found = []
    for pid in descendants(agent):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "ffmpeg":
                found.append(pid)
        except OSError:
            pass
    return found


def display_of(chromium_pids: set[int]) -> str:
    for pid in chromium_pids:
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environment:
            if entry.startswith(b"DISPLAY="):
                return entry.split(b"=", 1)[1].decode()
    raise RuntimeError("could not find the session's display")


def x_server_idle(xvfb: int) -> float:
    """The X server's CPU seconds per second without any recording."""
    before = cpu_seconds(xvfb)
    time.sleep(SECONDS)
    return (cpu_seconds(xvfb) - before) / SECONDS


def ours(base: str, headers: dict, session_id: str, agent: int, xvfb: int, idle: float) -> dict:
    replay = httpx.post(f"{base}/browsers/{session_id}/replays", headers=headers,
                        json={"framerate": FRAMERATE}, timeout=30).json()
    (encoder,) = ffmpeg_children(agent)
    start = {pid: cpu_seconds(pid) for pid in (agent, encoder, xvfb)}
    time.sleep(SECONDS)
    end = {pid: cpu_seconds(pid) for pid in (agent, encoder, xvfb)}
    httpx.post(f"{base}/browsers/{session_id}/replays/{replay['replay_id']}/stop",
               headers=headers, timeout=120).raise_for_status()
    return {"recorder": (end[agent] - start[agent]) / SECONDS,
            "encoder": (end[encoder] - start[encoder]) / SECONDS,
            "X server": (end[xvfb] - start[xvfb]) / SECONDS - idle}


def x11grab(display: str, xvfb: int, idle: float, out: Path) -> dict:
    # The agent's encoder settings (browser-agent/src/recording/mod.rs), fed by x11grab.
    ffmpeg = subprocess.Popen(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-f", "x11grab", "-draw_mouse", "1",
         "-framerate", str(FRAMERATE), "-video_size", f"{VIEWPORT[0]}x{VIEWPORT[1]}", "-i", display,
         "-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p",
         "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-color_range", "tv",
         "-g", str(FRAMERATE),
         "-movflags", "+frag_keyframe+empty_moov+default_base_moof", "-flush_packets", "1",
         "-f", "mp4", "-y", str(out)],
        stdin=subprocess.PIPE,
    )
    try:
        time.sleep(1)  # ffmpeg's own start-up (probing the display) is not recording
        start = (cpu_seconds(ffmpeg.pid), cpu_seconds(xvfb))
        time.sleep(SECONDS)
        end = (cpu_seconds(ffmpeg.pid), cpu_seconds(xvfb))
    finally:
        assert ffmpeg.stdin is not None
        ffmpeg.stdin.write(b"q")
        ffmpeg.stdin.close()
        ffmpeg.wait(timeout=60)
    return {"recorder": 0.0, "encoder": (end[0] - start[0]) / SECONDS,
            "X server": (end[1] - start[1]) / SECONDS - idle}


def run(work_dir: Path, report) -> None:
    control_plane = ControlPlane(work_dir / "data").start()
    try:
        base = control_plane.base_url
        headers = {"authorization": f"Bearer {control_plane.api_key}"}
        session = httpx.post(f"{base}/browsers", headers=headers, timeout=60, json={
            "viewport": {"width": VIEWPORT[0], "height": VIEWPORT[1]}, "timeout_seconds": 3600,
        }).json()
        processes = session_processes(control_plane, session["session_id"])
        (agent,), (xvfb,) = processes["agent"], processes["xvfb"]
        display = display_of(processes["chromium"])
        with sync_playwright() as playwright:
            browser = playwright.chromium.connect_over_cdp(session["cdp_ws_url"])
            page = first_tab(browser)
            page.set_content(ANIMATED_PAGE)
            time.sleep(2)
            samples: dict[str, list[dict]] = {"ours": [], "x11grab": []}
            for round_number in range(ROUNDS):
                idle = x_server_idle(xvfb)
                # Alternate which goes first, so neither always follows the idle stretch.
                order = ["ours", "x11grab"] if round_number % 2 == 0 else ["x11grab", "ours"]
                for method in order:
                    if method == "ours":
                        samples["ours"].append(
                            ours(base, headers, session["session_id"], agent, xvfb, idle))
                    else:
                        samples["x11grab"].append(
                            x11grab(display, xvfb, idle, work_dir / f"x11grab-{round_number}.mp4"))
            browser.close()
        print(f"\n(CPU seconds per recorded second, shown as CPU ms per second; "
              f"{SECONDS} s per run, {FRAMERATE} fps, {VIEWPORT[0]}x{VIEWPORT[1]}, libx264 veryfast)")
        for method, runs in samples.items():
            parts = ", ".join(f"{part} {statistics.median(run[part] for run in runs) * 1000:.0f} ms"
                              for part in runs[0])
            print(f"{method}: median per part: {parts}")
        totals = {method: [sum(run.values()) for run in runs] for method, runs in samples.items()}
        report("recording CPU per recorded second", totals["ours"],
               {"ffmpeg -f x11grab": totals["x11grab"]}, percentiles=(50,))
    finally:
        control_plane.reap_everything()
