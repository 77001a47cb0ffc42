"""Sound: each headful VM has its own sound server; `record_audio` puts what the page
plays into the replay, in sync with the picture, and the live view plays it to a viewer
who unmutes."""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from harness import descendants, first_tab, session_processes, wait_until
from sdk import field, fields, on_browser, once, update_browser
from test_replays import download, wait_finished

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once

# Black and silent; `flash()` turns the page white and plays 440 Hz for one second, both
# at the same instant (the oscillator runs all along behind a muted gain, so starting the
# sound costs nothing).
TONE_PAGE = """<!doctype html><html><head><style>html, body { margin: 0; height: 100%; background: #000; }
</style></head><body><script>
let gain;
window.prepare = async () => {
  const context = new AudioContext();
  await context.resume();
  const oscillator = context.createOscillator();
  oscillator.frequency.value = 440;
  gain = context.createGain();
  gain.gain.value = 0;
  oscillator.connect(gain).connect(context.destination);
  oscillator.start();
  return context.state;
};
window.flash = () => {
  document.body.style.background = '#fff';
  gain.gain.value = 0.8;
  setTimeout(() => { document.body.style.background = '#000'; gain.gain.value = 0; }, 1000);
};
</script></body></html>"""

RATE = 8000
FRAMERATE = 20


@pytest.fixture(scope="module")
def playing(client):
    """A headful session on TONE_PAGE, its sound prepared, and its Playwright page."""
    session = client.browsers.create(viewport={"width": 1024, "height": 768}, timeout_seconds=300)
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(session.cdp_ws_url)
        page = first_tab(browser)
        page.set_content(TONE_PAGE)
        page.bring_to_front()
        assert page.evaluate("prepare()") == "running"
        yield session, page, playwright
        browser.close()
    client.browsers.delete_by_id(session.session_id)


def stream_ends(path: Path) -> dict[str, float]:
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_type,start_time,duration",
                            "-of", "json", str(path)], check=True, capture_output=True, text=True).stdout
    return {stream["codec_type"]: float(stream["start_time"]) + float(stream["duration"])
            for stream in json.loads(probe)["streams"]}


@contextlib.contextmanager
def busy_cores():
    """A busy loop on every core, at the test's own niceness, for as long as it lasts."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def start_times(path: Path) -> dict[str, float]:
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_type,codec_name,start_time",
                            "-of", "json", str(path)], check=True, capture_output=True, text=True).stdout
    streams = json.loads(probe)["streams"]
    return {stream["codec_type"]: float(stream["start_time"]) for stream in streams} | \
        {f"{stream['codec_type']}_codec": stream["codec_name"] for stream in streams}


def samples(path: Path) -> list[int]:
    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-map", "0:a", "-ac", "1", "-ar", str(RATE),
                          "-f", "s16le", "-"], check=True, capture_output=True).stdout
    return list(struct.unpack(f"<{len(raw) // 2}h", raw))


def brightness(path: Path) -> list[int]:
    """Mean luma of the frame shown in each slot of the frame rate (a recording holds a
    frame only when the screen changed; the `fps` filter shows each until the next)."""
    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-map", "0:v",
                          "-vf", f"fps={FRAMERATE},scale=8:8", "-f", "rawvideo", "-pix_fmt", "gray", "-"],
                         check=True, capture_output=True).stdout
    return [sum(raw[i:i + 64]) // 64 for i in range(0, len(raw), 64)]


def strength(window: list[int], frequency: float) -> float:
    """Goertzel: the power of one frequency in the window."""
    coefficient = 2 * math.cos(2 * math.pi * frequency / RATE)
    previous = before = 0.0
    for sample in window:
        previous, before = sample + coefficient * previous - before, previous
    return previous * previous + before * before - coefficient * previous * before


@pytest.mark.parametrize("host", ["quiet", "busy"])
def test_a_replay_with_record_audio_has_the_tone_in_sync_with_the_flash(client, playing, tmp_path, host):
    """Also on a busy host (every core busy at the same niceness): sound and picture are
    stamped when captured, so an encoder short of CPU delays the file, not the sync."""
    session, page, _ = playing
    sid = session.session_id
    with busy_cores() if host == "busy" else contextlib.nullcontext():
        replay = client.browsers.replays.start(sid, framerate=FRAMERATE, **fields(record_audio=True))
        time.sleep(1.5)
        page.evaluate("flash()")
        time.sleep(2.5)
        client.browsers.replays.stop(replay.replay_id, **on_browser(sid))
    wait_finished(client, sid, replay.replay_id, 60)
    video = download(client, sid, replay.replay_id, tmp_path / "tone.mp4")

    starts = start_times(video)
    assert starts.get("audio_codec") == "aac", starts
    sound = samples(video)
    loudest = max(abs(s) for s in sound)
    assert loudest > 3000, f"the tone is missing (peak {loudest})"

    # The sound's onset: the first 5 ms window that is loud.
    window = RATE // 200
    onset = next(i for i in range(0, len(sound) - window, window)
                 if max(abs(s) for s in sound[i:i + window]) > loudest / 4)
    sound_onset = starts["audio"] + onset / RATE
    # Its dominant frequency, among 100..2000 Hz, over the middle of the tone.
    middle = sound[onset + RATE // 4: onset + RATE // 4 + 2048]
    powers = {frequency: strength(middle, frequency) for frequency in range(100, 2001, 10)}
    dominant = max(powers, key=powers.get)
    assert abs(dominant - 440) <= 10, f"dominant frequency {dominant} Hz"

    # The flash's onset: the first frame that turns bright (a new browser's first frames
    # may be white before the page paints).
    frames = brightness(video)
    first_bright = next(i for i in range(1, len(frames)) if frames[i - 1] <= 128 < frames[i])
    flash_onset = starts["video"] + first_bright / FRAMERATE
    # A frame shows what was on screen when its slot began, so the flash happened in the
    # slot before at the earliest.
    print(f"sound onset {sound_onset:.3f} s, flash onset {flash_onset:.3f} s")
    assert abs(sound_onset - flash_onset) <= 0.1 + 1 / FRAMERATE, \
        f"sound at {sound_onset:.3f} s, flash at {flash_onset:.3f} s; {starts}, frames {frames[:60]}"
    # Both streams run to the recording's end.
    ends = stream_ends(video)
    assert abs(ends["audio"] - ends["video"]) <= 0.1, ends


def test_the_segment_after_a_viewport_change_records_sound_too(client, tmp_path):
    session = client.browsers.create(viewport={"width": 1024, "height": 768}, timeout_seconds=300)
    sid = session.session_id
    try:
        first = client.browsers.replays.start(sid, **fields(record_audio=True))
        time.sleep(1)
        update_browser(client, sid, viewport={"width": 800, "height": 600, "force": True})
        second = next(r for r in client.browsers.replays.list(**on_browser(sid)) if r.replay_id != first.replay_id)
        time.sleep(1)
        client.browsers.replays.stop(second.replay_id, **on_browser(sid))
        for replay in (first, second):
            wait_finished(client, sid, replay.replay_id, 60)
            starts = start_times(download(client, sid, replay.replay_id, tmp_path / f"{replay.replay_id}.mp4"))
            assert starts.get("audio_codec") == "aac", (replay.replay_id, starts)
    finally:
        client.browsers.delete_by_id(sid)


def test_replays_without_record_audio_have_no_sound_track(client, playing, tmp_path):
    session, _, _ = playing
    sid = session.session_id
    replay = client.browsers.replays.start(sid)
    time.sleep(1)
    client.browsers.replays.stop(replay.replay_id, **on_browser(sid))
    wait_finished(client, sid, replay.replay_id, 60)
    starts = start_times(download(client, sid, replay.replay_id, tmp_path / "silent.mp4"))
    assert "audio" not in starts and "video" in starts


def sound_captures(control_plane, session_id: str) -> list[int]:
    """The live view's sound capture processes (ffmpeg writing raw PCM) of the session."""
    found = []
    for agent in session_processes(control_plane, session_id)["agent"]:
        for pid in descendants(agent):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"s16le" in command and b"pulse" in command:
                found.append(pid)
    return found


def test_the_live_view_plays_the_sound_once_unmuted(control_plane, playing):
    session, page, playwright = playing
    viewer_browser = playwright.chromium.launch(
        executable_path="/usr/bin/chromium",
        args=["--no-sandbox", "--autoplay-policy=no-user-gesture-required"])
    try:
        viewer = viewer_browser.new_page()
        viewer.goto(field(session, "browser_live_view_url"))
        viewer.wait_for_function("() => window.liveView.frames > 0", timeout=10_000)
        # Count what arrives, and how loud, before it is played.
        viewer.evaluate("""() => { window.heard = { chunks: 0, peak: 0 };
            const play = window.liveViewAudio.play.bind(window.liveViewAudio);
            window.liveViewAudio.play = (buffer) => {
              const samples = new Int16Array(buffer.slice(6));
              window.heard.chunks += 1;
              for (const s of samples) window.heard.peak = Math.max(window.heard.peak, Math.abs(s));
              play(buffer);
            }; }""")
        time.sleep(0.5)
        assert viewer.evaluate("window.heard.chunks") == 0, "muted: no sound is sent"
        viewer.click("#sound")
        assert wait_until(lambda: viewer.evaluate("window.heard.chunks") > 10, 5), "no sound arrived"
        assert viewer.evaluate("window.heard.peak") < 500, "silence before the tone"
        page.evaluate("flash()")
        assert wait_until(lambda: viewer.evaluate("window.heard.peak") > 3000, 3), "the tone was not heard"
        viewer.click("#sound")
        # The capture ends with its last listener, and nothing more arrives.
        assert wait_until(lambda: not sound_captures(control_plane, session.session_id), 5)
        time.sleep(0.3)
        chunks = viewer.evaluate("window.heard.chunks")
        time.sleep(0.5)
        assert viewer.evaluate("window.heard.chunks") == chunks, "muting stops the sound"
        viewer.click("#sound")
        assert wait_until(lambda: len(sound_captures(control_plane, session.session_id)) == 1, 5)
        viewer.close()
        assert wait_until(lambda: not sound_captures(control_plane, session.session_id), 5), \
            "the capture outlived its listener"
    finally:
        viewer_browser.close()
