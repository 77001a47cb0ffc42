"""Cost and quality of recording: CPU seconds per recorded second at 10 fps on a 1920x1080
display, for a replay (the agent's recorder + its ffmpeg encoder + the X server's extra
work) next to `ffmpeg -f x11grab` with the encoder settings replays had before they
encoded only what changed (libx264 veryfast; ffmpeg + the X server's extra work), in the
same run:

- on an animated page (boxes moving all over the screen, a running clock);
- on a static page (nothing is drawn while recording).

The X server's extra work is its CPU time while recording minus its CPU time over an
equally long stretch without recording (it also draws what Chromium paints).

Quality: a lossless capture of the animated page, taken in the same run, is encoded with
the replay's encoder settings and with x11grab's, and each result's SSIM against the
lossless frames is printed (1.0 is identical). x11grab runs inside the VM's network and
IPC namespaces (nsenter), where the VM's X server listens and shares memory."""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from harness import ControlPlane, descendants, first_tab, process_cpu_seconds, session_processes

ROUNDS = 3
SECONDS = 10
FRAMERATE = 10
VIEWPORT = (1920, 1080)
CPU_PARTS = ("recorder", "encoder", "X server")

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
    """The VM's display name, from Chromium's environment."""
    for pid in chromium_pids:
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in environment:
            if entry.startswith(b"DISPLAY="):
                return entry.split(b"=", 1)[1].decode()
    raise RuntimeError("could not find the session's display")


def idle_cpu(pids: tuple[int, ...]) -> dict[int, float]:
    """Each process's CPU seconds per second without any recording."""
    before = {pid: process_cpu_seconds(pid) for pid in pids}
    time.sleep(SECONDS)
    return {pid: (process_cpu_seconds(pid) - before[pid]) / SECONDS for pid in pids}


def frames_in(video: bytes, work_dir: Path) -> int:
    path = work_dir / "replay.mp4"
    path.write_bytes(video)
    counted = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-count_packets",
                              "-show_entries", "stream=nb_read_packets", "-of", "csv=p=0", str(path)],
                             check=True, capture_output=True, text=True)
    return int(counted.stdout.strip().rstrip(","))


def ours(base: str, headers: dict, session_id: str, agent: int, xvfb: int, idle: dict[int, float],
         work_dir: Path) -> dict:
    replay = httpx.post(f"{base}/browsers/{session_id}/replays", headers=headers,
                        json={"framerate": FRAMERATE}, timeout=30).json()
    (encoder,) = ffmpeg_children(agent)
    start = {pid: process_cpu_seconds(pid) for pid in (agent, encoder, xvfb)}
    time.sleep(SECONDS)
    end = {pid: process_cpu_seconds(pid) for pid in (agent, encoder, xvfb)}
    replay_url = f"{base}/browsers/{session_id}/replays/{replay['replay_id']}"
    httpx.post(f"{replay_url}/stop", headers=headers, timeout=120).raise_for_status()
    video = httpx.get(replay_url, headers=headers, timeout=120)
    video.raise_for_status()
    used = {pid: (end[pid] - start[pid]) / SECONDS for pid in start}
    # The recorder's share of the agent: its CPU above the agent's own idle level.
    return {"recorder": used[agent] - idle[agent], "encoder": used[encoder],
            "X server": used[xvfb] - idle[xvfb],
            "frames per second": frames_in(video.content, work_dir) / SECONDS}


# A page that draws nothing once shown: text, a form, an image-like gradient.
STATIC_PAGE = """<!doctype html><html><body style="margin:40px;font:20px sans-serif;
background:linear-gradient(#fdfdfd,#dde4ec)"><h1>Quarterly report</h1>
<p>Nothing on this page changes once it is drawn.</p>
<form><label>Name <input value="Ada"></label> <button type="button">Save</button></form>
</body></html>"""

# The replay's encoder settings (browser-agent/src/recording/encoder.rs, `encoder_args`).
OUR_ENCODER = ["-c:v", "libx264", "-preset", "ultrafast", "-x264-params", "cabac=1", "-crf", "26"]
# The settings replays used before (and x11grab uses here): libx264 veryfast, CRF 23.
X11GRAB_ENCODER = ["-c:v", "libx264", "-preset", "veryfast"]
COMMON_OUTPUT = ["-pix_fmt", "yuv420p", "-colorspace", "bt709", "-color_primaries", "bt709",
                 "-color_trc", "bt709", "-color_range", "tv", "-g", str(FRAMERATE)]


def in_vm(xvfb: int, command: list[str]) -> list[str]:
    """`command` inside the VM's network namespace (where its X server's abstract socket
    is) and IPC namespace (where MIT-SHM segments are shared with it)."""
    return ["nsenter", "-t", str(xvfb), "-n", "-i", *command]


def x11grab(xvfb: int, display: str, idle: dict[int, float], out: Path) -> dict:
    ffmpeg = subprocess.Popen(
        in_vm(xvfb, [
            "ffmpeg", "-hide_banner", "-loglevel", "error", "-f", "x11grab", "-draw_mouse", "1",
            "-framerate", str(FRAMERATE), "-video_size", f"{VIEWPORT[0]}x{VIEWPORT[1]}", "-i", display,
            *X11GRAB_ENCODER, *COMMON_OUTPUT,
            "-movflags", "+frag_keyframe+empty_moov+default_base_moof", "-flush_packets", "1",
            "-f", "mp4", "-y", str(out)]),
        stdin=subprocess.PIPE,
    )
    try:
        time.sleep(1)  # ffmpeg's own start-up (probing the display) is not recording
        if ffmpeg.poll() is not None:
            raise RuntimeError(f"x11grab ended at once ({ffmpeg.returncode})")
        start = (process_cpu_seconds(ffmpeg.pid), process_cpu_seconds(xvfb))
        time.sleep(SECONDS)
        end = (process_cpu_seconds(ffmpeg.pid), process_cpu_seconds(xvfb))
    finally:
        assert ffmpeg.stdin is not None
        try:
            ffmpeg.stdin.write(b"q")
            ffmpeg.stdin.close()
        except BrokenPipeError:
            pass
        ffmpeg.wait(timeout=60)
    return {"recorder": 0.0, "encoder": (end[0] - start[0]) / SECONDS,
            "X server": (end[1] - start[1]) / SECONDS - idle[xvfb], "frames per second": FRAMERATE}


def lossless_capture(xvfb: int, display: str, out: Path, seconds: int) -> None:
    """The animated page's frames, uncompressed (I420, as both encoders get them)."""
    subprocess.run(
        in_vm(xvfb, ["ffmpeg", "-hide_banner", "-loglevel", "error", "-f", "x11grab", "-draw_mouse", "1",
                     "-framerate", str(FRAMERATE), "-video_size", f"{VIEWPORT[0]}x{VIEWPORT[1]}",
                     "-i", display, "-t", str(seconds), "-pix_fmt", "yuv420p", "-f", "rawvideo", "-y",
                     str(out)]),
        check=True, timeout=seconds + 60)


def quality(lossless: Path, encoder: list[str], out: Path) -> tuple[float, float]:
    """(SSIM against the lossless frames, megabits per second) of `lossless` encoded
    with `encoder`."""
    raw = ["-f", "rawvideo", "-pix_fmt", "yuv420p", "-s", f"{VIEWPORT[0]}x{VIEWPORT[1]}",
           "-r", str(FRAMERATE), "-i", str(lossless)]
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", *raw, *encoder, *COMMON_OUTPUT,
                    "-f", "mp4", "-y", str(out)], check=True)
    compared = subprocess.run(["ffmpeg", "-hide_banner", *raw, "-i", str(out), "-lavfi", "ssim",
                               "-f", "null", "-"], check=True, capture_output=True, text=True)
    ssim = float(compared.stderr.rsplit("All:", 1)[1].split()[0])
    frames = lossless.stat().st_size / (VIEWPORT[0] * VIEWPORT[1] * 3 // 2)
    return ssim, out.stat().st_size * 8 / 1e6 / (frames / FRAMERATE)


def measure(page, content: str, rounds: int, base: str, headers: dict, session_id: str,
            agent: int, xvfb: int, display: str, work_dir: Path) -> dict[str, list[dict]]:
    page.set_content(content)
    time.sleep(2)
    samples: dict[str, list[dict]] = {"ours": [], "x11grab": []}
    for round_number in range(rounds):
        idle = idle_cpu((agent, xvfb))
        # Alternate which goes first, so neither always follows the idle stretch.
        order = ["ours", "x11grab"] if round_number % 2 == 0 else ["x11grab", "ours"]
        for method in order:
            if method == "ours":
                samples["ours"].append(ours(base, headers, session_id, agent, xvfb, idle, work_dir))
            else:
                samples["x11grab"].append(x11grab(xvfb, display, idle, work_dir / f"x11grab-{round_number}.mp4"))
    return samples


def print_parts(title: str, samples: dict[str, list[dict]]) -> None:
    print(f"\n({title}: CPU ms per recorded second, median per part; {SECONDS} s per run, "
          f"{FRAMERATE} fps, {VIEWPORT[0]}x{VIEWPORT[1]})")
    for method, runs in samples.items():
        parts = ", ".join(f"{part} {statistics.median(run[part] for run in runs) * 1000:.0f} ms"
                          for part in CPU_PARTS)
        frames = statistics.median(run["frames per second"] for run in runs)
        print(f"{method}: {parts}; {frames:.1f} frames encoded per second")


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
            animated = measure(page, ANIMATED_PAGE, ROUNDS, base, headers, session["session_id"],
                               agent, xvfb, display, work_dir)
            lossless = work_dir / "lossless.yuv"
            lossless_capture(xvfb, display, lossless, 5)
            static = measure(page, STATIC_PAGE, 2, base, headers, session["session_id"],
                             agent, xvfb, display, work_dir)
            browser.close()
        print_parts("animated page", animated)
        print_parts("static page", static)
        print("\n(quality: the animated page's lossless capture encoded with each setting)")
        for label, encoder in (("ours (ultrafast, CABAC, CRF 26)", OUR_ENCODER),
                               ("x11grab's (veryfast, CRF 23)", X11GRAB_ENCODER)):
            ssim, megabits = quality(lossless, encoder, work_dir / "quality.mp4")
            print(f"{label:34} SSIM {ssim:.5f}   {megabits:.2f} Mbit/s")
        lossless.unlink()
        for title, samples in (("animated page", animated), ("static page", static)):
            totals = {method: [sum(run[part] for part in CPU_PARTS) for run in runs]
                      for method, runs in samples.items()}
            report(f"recording CPU per recorded second, {title}", totals["ours"],
                   {"ffmpeg -f x11grab": totals["x11grab"]}, percentiles=(50,))
    finally:
        control_plane.reap_everything()
