"""The host trusts nothing a VM hands it. Everything in a VM's directories can be
rewritten from inside (its run directory belongs to the VM's user), so these tests
plant what a tenant could: a "recording" that is an HLS playlist naming host files and
another organization's replay, and links in place of the agent's sockets. The control
plane must neither read those host files into a replay nor connect where the links
point."""

from __future__ import annotations

import os
import pwd
import secrets
import signal
import socket
import stat
import time
from pathlib import Path

from kernel import Kernel

from harness import read_page, session_processes, vm_root, wait_until
from test_kernel_limits import _cgroups
from test_replays import wait_finished
from sdk import on_browser, once

from conftest import TEST_PAGE_TITLE

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


def _vm_owner() -> tuple[int, int]:
    user = pwd.getpwnam("browser-vm")
    return user.pw_uid, user.pw_gid


def _plant(path: Path, data: bytes) -> None:
    """Replaces `path` as the VM could: a new file of the VM's user in its place."""
    partial = path.with_name(path.name + ".planted")
    partial.write_bytes(data)
    os.chown(partial, *_vm_owner())
    os.replace(partial, path)


def _root_only_secret(directory: Path) -> tuple[Path, bytes]:
    directory.mkdir(mode=0o700)
    marker = secrets.token_hex(32).encode()
    secret = directory / "secret"
    secret.write_bytes(marker * 64)
    secret.chmod(0o600)
    return secret, marker


def test_a_recording_replaced_by_a_playlist_of_host_files_brings_none_of_them(control_plane, client, tmp_path):
    # Another organization's replay: a real video on this host.
    other = Kernel(api_key=control_plane.create_api_key("org-victim"), base_url=control_plane.base_url,
                   max_retries=0)
    victim = other.browsers.create()
    victim_replay = other.browsers.replays.start(victim.session_id)
    time.sleep(2)
    other.browsers.replays.stop(victim_replay.replay_id, **on_browser(victim.session_id))
    other.browsers.delete_by_id(victim.session_id)
    (victim_video,) = (control_plane.data_dir / "blobs" / "replays").glob(f"*/{victim_replay.replay_id}.mp4")
    victim_bytes = victim_video.read_bytes()
    # A stretch from the middle of its packets: copied as is by any remux.
    victim_marker = victim_bytes[len(victim_bytes) // 2:len(victim_bytes) // 2 + 64]
    secret, marker = _root_only_secret(tmp_path / "private")
    credential_key = (control_plane.data_dir / "credential.key").read_bytes().strip()

    session = client.browsers.create()
    sid = session.session_id
    replay = client.browsers.replays.start(sid)
    time.sleep(2)
    # A link in the tenant's home to the secret, and a playlist in place of the recording.
    home = vm_root(control_plane, sid)
    (home / "stolen").symlink_to(secret)
    os.lchown(home / "stolen", *_vm_owner())
    playlist = "\n".join([
        "#EXTM3U", "#EXT-X-VERSION:4", "#EXT-X-TARGETDURATION:10", "#EXT-X-MEDIA-SEQUENCE:0",
        "#EXTINF:10.0,", f"file:{victim_video}",
        "#EXTINF:10.0,", "#EXT-X-BYTERANGE:4096@0", f"file:{home / 'stolen'}",
        "#EXTINF:10.0,", f"file:{secret}",
        "#EXTINF:10.0,", f"file:{control_plane.data_dir / 'credential.key'}",
        "#EXT-X-ENDLIST", "",
    ]).encode()
    recordings = control_plane.data_dir / "browsers" / sid / "run" / "recordings"
    _plant(recordings / f"{replay.replay_id}.recording.mp4", playlist)
    # The agent dies: the control plane salvages what is left.
    (agent,) = session_processes(control_plane, sid)["agent"]
    os.kill(agent, signal.SIGKILL)

    finished = wait_finished(client, sid, replay.replay_id, timeout=40)
    try:
        downloaded = client.browsers.replays.download(replay.replay_id, **on_browser(sid)).read()
    except Exception:  # a lost recording has no video
        downloaded = b""
    for foreign, what in ((marker, "the root-only secret"), (victim_marker, "another organization's replay"),
                          (credential_key, "the credential key")):
        assert foreign not in downloaded, f"{what} reached the tenant's replay"
    # Nothing of the playlist was kept either: the replay is lost, with a reason.
    assert downloaded == b"", (finished, len(downloaded))


def test_links_in_place_of_the_agents_sockets_lead_nowhere(control_plane, client, tmp_path, test_page_url):
    # A root-only socket of the host, which a link from the VM must not reach.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(private / "host.sock"))
    listener.listen(16)
    listener.setblocking(False)
    created = client.browsers.create(headless=True)
    sid = created.session_id
    try:
        run = control_plane.data_dir / "browsers" / sid / "run"
        for name in ("agent.sock", "devtools.sock"):
            planted = run / name
            if planted.exists() or planted.is_symlink():
                planted.unlink()
            planted.symlink_to(private / "host.sock")
            os.lchown(planted, *_vm_owner())
        # CDP (a new connection, a DevTools hand-off) and calls to the agent still work.
        assert read_page(created.cdp_ws_url, test_page_url, lambda page: page.title()) == TEST_PAGE_TITLE
        assert client.browsers.retrieve(sid).session_id == sid
        client.browsers.fs.list_files(sid, path="/")
        time.sleep(0.5)
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            connection = None
        assert connection is None, f"the control plane connected to a socket a link named: {connection.recv(4096)!r}"
        assert stat.S_ISSOCK((private / "host.sock").lstat().st_mode)
    finally:
        listener.close()
        client.browsers.delete_by_id(sid)


# Run as the tenant inside the VM: everything it may try against the agent, and every
# file its processes hold, as JSON.
PROBE = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
def attempt(action):
    try:
        action()
        return "allowed"
    except OSError as error:
        return error.strerror
def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
(agent,) = [p for p in pids if cmdline(p)[0].endswith(b"browser-agent")]
def ptrace_attach():
    if libc.ptrace(16, agent, 0, 0) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
def take_descriptor():
    pidfd = os.pidfd_open(agent)
    fd = libc.syscall(438, pidfd, 1, 0)  # pidfd_getfd: the agent's stdout
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
held, visible = [], []
for pid in pids:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    visible.append(pid)
    for fd in fds:
        try:
            info = os.stat(f"/proc/{pid}/fd/{fd}")
            held.append([info.st_dev, info.st_ino])
        except OSError:
            pass
environs = []
for pid in pids:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environs.append(f.read().decode(errors="replace"))
    except OSError:
        pass
print(json.dumps({
    "uid": os.getuid(),
    "environ": attempt(lambda: open(f"/proc/{agent}/environ", "rb").read()),
    "memory": attempt(lambda: open(f"/proc/{agent}/mem", "rb").read(1)),
    "fds": attempt(lambda: os.listdir(f"/proc/{agent}/fd")),
    "signal": attempt(lambda: os.kill(agent, 0)),
    "ptrace": attempt(ptrace_attach),
    "getfd": attempt(take_descriptor),
    "run_dir": attempt(lambda: os.listdir("/run/vm")),
    "agent_visible": agent in visible,
    "held": held,
    "environs": environs,
}))
'''


def _host_files(control_plane) -> set[tuple[int, int]]:
    """(device, inode) of every file of the service outside the VMs' own directories."""
    found = set()
    for path in control_plane.data_dir.rglob("*"):
        relative = path.relative_to(control_plane.data_dir).parts
        if len(relative) >= 3 and relative[0] == "browsers" and relative[2] in ("root", "run"):
            continue
        try:
            info = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            found.add((info.st_dev, info.st_ino))
    return found


def test_tenant_code_cannot_read_signal_trace_or_call_the_agent(control_plane, client):
    import json
    import sqlite3

    from test_processes import exec_in, out

    created = client.browsers.create()
    sid = created.session_id
    try:
        probe = exec_in(client, sid, command="python3", args=["-c", PROBE], timeout_sec=30)
        assert probe["exit_code"] == 0, out(probe, "stderr")
        seen = json.loads(out(probe))
        assert seen["uid"] == 1000
        for attempt in ("environ", "memory", "fds", "signal", "ptrace", "getfd", "run_dir"):
            assert seen[attempt] in ("Permission denied", "Operation not permitted"), (attempt, seen[attempt])
        assert not seen["agent_visible"]
        # No tenant process holds a file of the host (the agent's log included), ...
        host_files = _host_files(control_plane)
        assert (control_plane.data_dir / "browsers" / sid / "agent.log").exists()
        assert not {tuple(held) for held in seen["held"]} & host_files
        # ... and the agent's secret is in no environment a tenant can read.
        with sqlite3.connect(control_plane.data_dir / "control-plane.db") as db:
            (secret,) = db.execute("SELECT agent_secret FROM browser_sessions WHERE id = ?", (sid,)).fetchone()
        assert secret and not any(secret in environ for environ in seen["environs"])
        # The tenant's uid is a host user of its own, not the agent's.
        processes = session_processes(control_plane, sid)
        (agent,) = processes["agent"]
        chromium = next(iter(processes["chromium"]))
        with open(f"/proc/{agent}/status") as status:
            agent_uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
        with open(f"/proc/{chromium}/status") as status:
            chromium_uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
        assert agent_uid == _vm_owner()[0] and chromium_uid == pwd.getpwnam("browser-tenant").pw_uid
    finally:
        client.browsers.delete_by_id(sid)


def test_a_lessees_processes_end_with_its_lease(control_plane, client):
    from test_processes import exec_in

    pool = client.browser_pools.create(size=1, fill_rate_per_minute=6000, headless=True, name="leases")
    try:
        assert wait_until(lambda: client.browser_pools.retrieve(pool.id).available_count == 1, 60)
        first = client.browser_pools.acquire(pool.id)
        # A loop that leaves the command's process group and session (given the time to,
        # before the command ends and its group with it).
        exec_in(client, first.session_id, timeout_sec=10, command=(
            "setsid nohup sh -c 'while :; do date >> /home/kernel/heartbeat; sleep 0.1; done' "
            ">/dev/null 2>&1 < /dev/null & sleep 1"))
        home = vm_root(control_plane, first.session_id)
        assert wait_until(lambda: (home / "heartbeat").exists(), 5)

        def loops() -> list[int]:
            memory_group = next(g for g in _cgroups(control_plane, first.session_id) if "/memory/" in g)
            with open(f"{memory_group}/cgroup.procs") as procs:
                pids = [int(pid) for pid in procs.read().split()]
            found = []
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        if b"heartbeat" in cmdline.read():
                            found.append(pid)
                except OSError:
                    pass
            return found

        assert loops(), "the loop did not start"
        client.browser_pools.release(pool.id, session_id=first.session_id, reuse=True)
        second = client.browser_pools.acquire(pool.id, acquire_timeout_seconds=30)
        assert second.session_id == first.session_id
        assert loops() == []
        # Nothing writes into the next lessee's home.
        time.sleep(0.5)
        assert not (home / "heartbeat").exists()
        client.browser_pools.release(pool.id, session_id=second.session_id, reuse=False)
    finally:
        client.browser_pools.delete(pool.id, force=True)
