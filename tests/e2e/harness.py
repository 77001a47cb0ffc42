"""Starts the real control-plane binary and inspects the processes it spawns."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("E2E_BIN_DIR", REPO / "target" / "debug"))
CONTROL_PLANE = BIN_DIR / "control-plane"
# The Chromium the control plane runs by default (its `--chromium`): references launch the
# same binary, not Debian's launcher script in front of it.
CHROMIUM = "/usr/lib/chromium/chromium"


class ControlPlane:
    """One `control-plane serve` process with its own data directory."""

    def __init__(self, data_dir: Path, port: int = 0, agent_idle_grace_seconds: int = 60,
                 extra_args: list[str] | None = None, egress_allow: tuple[str, ...] = ("127.0.0.1",),
                 traversable: bool = True, env: dict[str, str] | None = None, default_standby: bool = False):
        self.data_dir = data_dir
        self.env = {**os.environ, **(env or {})}
        self.traversable = traversable
        # The test pages are served on this host's loopback, which browsers may not reach
        # unless the operator allows it.
        self.extra_args = [f"--egress-allow={allowance}" for allowance in egress_allow]
        self.extra_args += extra_args or []
        # Standby browsers are on by default (sized from the host); a test's control plane
        # keeps none unless it asks (`default_standby`, or the flags themselves), so that
        # what a test counts and times is its own.
        for flag in ("--standby-browsers", "--standby-headless-browsers"):
            if not default_standby and flag not in self.extra_args:
                self.extra_args += [flag, "0"]
        self.port = port
        self.agent_idle_grace_seconds = agent_idle_grace_seconds
        self.process: subprocess.Popen | None = None
        self.base_url = ""

    def start(self) -> "ControlPlane":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.traversable:
            make_traversable(self.data_dir)
        log = open(self.data_dir / "control-plane.log", "ab")
        self.process = subprocess.Popen(
            [
                str(CONTROL_PLANE), "serve",
                "--data-dir", str(self.data_dir),
                "--listen", f"127.0.0.1:{self.port}",
                "--agent-idle-grace-seconds", str(self.agent_idle_grace_seconds),
                *self.extra_args,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=self.env,
        )
        deadline = time.monotonic() + 30
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"control plane exited early; see {self.data_dir}/control-plane.log")
            if line.startswith("listening on "):
                self.base_url = line.split(" ", 2)[2].strip()
                if not self.port:
                    # The public URL names the listening port unless it was set.
                    self.port = int(self.base_url.rsplit(":", 1)[1])
                break
        else:
            raise RuntimeError("control plane did not start listening")
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=self.process.stdout.read, daemon=True).start()
        return self

    @property
    def api_key(self) -> str:
        return (self.data_dir / "bootstrap-api-key").read_text().strip()

    def create_api_key(self, org: str, project: str | None = None) -> str:
        """A key of `org` made on the command line; bound to `project` (made if new)."""
        command = [str(CONTROL_PLANE), "api-keys", "create", "--org", org, "--data-dir", str(self.data_dir)]
        if project is not None:
            command += ["--project", project]
        out = subprocess.run(command, check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=15)

    def reap_everything(self) -> None:
        """Kills every process started for this data directory (agents outlive the
        control plane by design, so a test run must end them itself)."""
        self.stop(signal.SIGKILL)
        for pid in processes_mentioning(str(self.data_dir)):
            for member in descendants(pid) | {pid}:
                try:
                    os.kill(member, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        release_vm_resources(self.data_dir)


def vm_dirs_base(data_dir: Path) -> list[Path]:
    """Where the browser directories of `data_dir` may be: inside it, or where the
    service moves them when the VM user cannot pass through its parents."""
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return [data_dir, Path("/var/lib/browser-vms") / digest]


def suite_vm_paths(base: Path) -> tuple[str, ...]:
    """Where the VMs of the control planes started under `base` (a test run's temporary
    directory) live: `base` itself, and the relocated browser directories of each data
    directory found there (a data directory is where a control plane writes its log)."""
    data_dirs = {log.parent for log in base.rglob("control-plane.log")}
    return (str(base), *sorted(f"{vm_dirs_base(data_dir)[1]}/" for data_dir in data_dirs))


def release_vm_resources(data_dir: Path) -> None:
    """What the kernel keeps for VMs whose control plane was killed before it could
    end them (the next one would, at start): their disks' mounts and their cgroups."""
    bases = [str(base / "browsers") + "/" for base in vm_dirs_base(data_dir)]
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split()[4] for line in mounts]
    for point in points:
        if any(point.startswith(base) for base in bases):
            subprocess.run(["umount", "-l", point], check=False)
    for base in vm_dirs_base(data_dir):
        for note in (base / "browsers").glob("*/cgroups"):
            for group in note.read_text().split():
                for _ in range(50):
                    try:
                        os.rmdir(group)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)


def vm_mounts_left(within: str) -> list[str]:
    """Mount points of VM disks under `within`."""
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split()[4] for line in mounts]
    return [p for p in points if p.startswith(within) and "/browsers/" in p]


def free_port() -> int:
    """A loopback port free now (for a server that must be told its port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_traversable(data_dir: Path) -> None:
    """Browser sandboxes run as an unprivileged user that mounts its browser's directory
    under the data directory: pytest's temporary directories (0700) must let it pass."""
    for parent in data_dir.parents:
        if parent == Path(parent.anchor):
            break
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, (mode & 0o7777) | 0o011)


def control_plane_for_module(tmp_path_factory, **options):
    """A module's control plane (started with `ControlPlane`'s `options`); reaped with
    everything it started once the module is done. Yield from it in a module fixture.
    With E2E_REPLICAS=2 it is two replicas on PostgreSQL behind a load balancer."""
    if os.environ.get("E2E_REPLICAS"):
        from replicas_kit import replicated_for_module  # noqa: PLC0415 (imports harness)
        yield from replicated_for_module(tmp_path_factory, count=int(os.environ["E2E_REPLICAS"]),
                                         **options)
        return
    server = ControlPlane(tmp_path_factory.mktemp("cp") / "data", **options).start()
    yield server
    server.reap_everything()


def first_tab(browser):
    """The tab a browser connected over CDP shows, or a new one where it shows none."""
    context = browser.contexts[0]
    return context.pages[0] if context.pages else context.new_page()


def read_page(cdp_ws_url: str, url: str, read):
    """Opens `url` in the first tab of the browser behind `cdp_ws_url`; what `read(page)`
    answers."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(cdp_ws_url)
        page = first_tab(browser)
        page.goto(url)
        result = read(page)
        browser.close()
        return result


def respond(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes,
            content_type: str | None, headers=()) -> None:
    """Answers a request of a test server's `handler`: `status`, the extra `headers`
    (name, value pairs) and `body` of `content_type`."""
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    if content_type:
        handler.send_header("content-type", content_type)
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def send_html(handler: http.server.BaseHTTPRequestHandler, status: int, body: str = "",
              headers=()) -> None:
    respond(handler, status, body.encode(), "text/html; charset=utf-8", headers)


def send_json(handler: http.server.BaseHTTPRequestHandler, status: int, body) -> None:
    respond(handler, status, json.dumps(body).encode(), "application/json")


def answer(request: http.server.BaseHTTPRequestHandler, status: int, content_type: str, body: str | bytes,
           **headers: str) -> None:
    """Sends a whole response from a fake service's handler."""
    data = body.encode() if isinstance(body, str) else body
    request.send_response(status)
    request.send_header("Content-Type", content_type)
    for name, value in headers.items():
        request.send_header(name.replace("_", "-"), value)
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)


def serving(service):
    """Yields a fake service whose `server` serves in a thread, and shuts that down after.
    Yield from it in a fixture."""
    try:
        yield service
    finally:
        service.server.shutdown()


def quiet_handler(**methods) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler class for a fake service: `do_<METHOD>` calls
    `methods[METHOD](handler)`; nothing is logged."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

    for method, call in methods.items():
        setattr(Handler, f"do_{method}", lambda handler, call=call: call(handler))
    return Handler


class _Server(http.server.ThreadingHTTPServer):
    # socketserver's backlog is 5: ten browsers loading a page at once on a busy host
    # overflow it before its one accepting thread gets the CPU, and the kernel drops
    # their connections, retried 1 s and 3 s later (a delay that is the test server's).
    request_queue_size = 128


def serve(handler: type[http.server.BaseHTTPRequestHandler],
          host: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """Serves `handler` on a free port of `host`, from a thread, until shut down."""
    server = _Server((host, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_html(page_for_path, host: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """Serves `page_for_path(path)` (HTML bytes; `None`: a 404 with no body) on a port of
    `host` (loopback unless told), from a thread."""

    def get(handler: http.server.BaseHTTPRequestHandler) -> None:
        body = page_for_path(handler.path)
        respond(handler, 404 if body is None else 200, body or b"", None if body is None else "text/html")

    return serve(quiet_handler(GET=get), host)


def vm_root(control_plane: ControlPlane, session_id: str) -> Path:
    """Where the browser's filesystem `/` lives on this host (local runtime)."""
    return control_plane.data_dir / "browsers" / session_id / "root"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_state(pid: int) -> str | None:
    """The process's state letter (`R`, `S`, `T` for stopped, `Z`…); `None` once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return None


def is_alive(pid: int) -> bool:
    """Running and not a zombie."""
    state = process_state(pid)
    return state is not None and state not in "ZX"


def idle_pool_browsers(control_plane, metrics_token: str) -> int:
    """Idle pool browsers as /metrics tells them; where the tests' organizations have no
    pools, the standby browsers."""
    text = httpx.get(f"{control_plane.base_url}/metrics",
                     headers={"Authorization": f"Bearer {metrics_token}"}, timeout=10).text
    return sum(int(float(value)) for value in
               re.findall(r'^browser_service_pool_browsers\{[^}]*state="idle"[^}]*\} (\S+)$', text, re.M))


def processes_mentioning(text: str) -> set[int]:
    return {
        int(p.name) for p in Path("/proc").iterdir()
        if p.name.isdigit() and int(p.name) != os.getpid() and text in _cmdline(int(p.name)) and is_alive(int(p.name))
    }


def descendants(*roots: int) -> set[int]:
    """The processes below any of `roots` (one pass over /proc)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p.name))
    found, stack = set(), list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (all its threads), not of its children;
    OSError once it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids) -> float:
    """The CPU time of the processes among `pids` still there."""
    total = 0.0
    for pid in pids:
        try:
            total += process_cpu_seconds(pid)
        except OSError:
            continue
    return total


def program_of(pid: int) -> str:
    return _cmdline(pid).split(" ")[0]


def session_processes(control_plane: ControlPlane, session_id: str) -> dict[str, set[int]]:
    """The sandbox of a session, its agent and everything the agent started, by kind."""
    root = str(control_plane.data_dir / "browsers" / session_id / "root")
    holders = processes_mentioning(root)  # the sandbox (bwrap), or an unsandboxed agent
    everything = holders | descendants(*holders)
    agents = {pid for pid in everything if program_of(pid).endswith("browser-agent")}
    tree = descendants(*agents)
    kinds = {"sandbox": {pid for pid in holders if program_of(pid).endswith("bwrap")},
             "agent": agents, "xvfb": set(), "chromium": set()}
    for pid in tree:
        program = _cmdline(pid).split(" ")[0]
        if program.endswith("Xvfb"):
            kinds["xvfb"].add(pid)
        elif "chromium" in program or "chrome" in program:
            kinds["chromium"].add(pid)
    return kinds


VM_PROGRAMS = ("bwrap", "browser-agent", "Xvfb", "chromium", "chrome_crashpad_handler", "ffmpeg")


def vm_processes_left(timeout: float, within: tuple[str, ...] = ()) -> list[tuple[int, str, str]]:
    """(pid, state, program) of every process, zombies included, that a browser VM runs,
    still there after `timeout` seconds; with `within`, only VMs whose directories are
    under one of those paths (the machine may run other browsers meanwhile): a process
    whose mounts or command line name one, or a zombie whose parent is such a process."""
    def mentions(pid: str) -> bool:
        for source in ("mountinfo", "cmdline"):
            try:
                text = Path(f"/proc/{pid}/{source}").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if any(path in text for path in within):
                return True
        return False

    def left() -> list[tuple[int, str, str]]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name, rest = stat.split(" (", 1)[1].rsplit(") ", 1)
            if not any(program.startswith(name) for program in VM_PROGRAMS):
                continue
            state, parent = rest[0], rest.split()[1]
            if within and not (mentions(entry.name) or (state == "Z" and mentions(parent))):
                continue
            found.append((int(entry.name), state, name))
        return found
    wait_until(lambda: not left(), timeout)
    return left()


def wait_until(predicate, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def video_frame_at(video: Path, seconds: float, framerate: int = 10) -> bytes:
    """The RGB frame a player shows `seconds` into a recording, at the recording's frame
    rate. Recordings hold a frame only when the screen changed (a variable frame rate),
    so `ffmpeg -ss` (which gives the first frame at or after the time) would skip to the
    next change; the `fps` filter first puts a frame in every slot, as a player shows it."""
    frame = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(video),
         "-vf", f"fps={framerate},trim=start={seconds:.3f}", "-frames:v", "1",
         "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        check=True, capture_output=True,
    ).stdout
    assert frame, f"{video} has no frame at {seconds:.3f} s"
    return frame
