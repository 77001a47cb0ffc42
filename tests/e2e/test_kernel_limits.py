"""Limits the kernel enforces per VM, whatever runs inside: memory that no process maps
(a memfd, a private tmpfs) still counts and ends the VM with a reason the API shows; a
fork bomb stops at the VM's task limit; a VM's disk fills its own quota, not the host's;
two busy VMs get equal shares of the CPU however many processes each runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import pytest
from kernel import Kernel

from harness import cpu_seconds, wait_until
from sdk import once
from test_processes import exec_in, out

pytestmark = once

GIB = 1 << 30


def _cgroups(control_plane, session_id: str) -> list[str]:
    return (control_plane.data_dir / "browsers" / session_id / "cgroups").read_text().split()


def _ended(client: Kernel, session_id: str):
    found = {}

    def ended() -> bool:
        found["browser"] = client.get(f"/browsers/{session_id}", options={"params": {"include_deleted": "true"}},
                                      cast_to=object)
        return found["browser"].get("deleted_at") is not None

    assert wait_until(ended, 30, interval=0.25), found
    return found["browser"]


# 1.5 GiB that no process maps: the agent's look at processes cannot see it.
HOARDS = {
    "memfd": """python3 -c '
import os
fd = os.memfd_create("hoard")
chunk = b"\\x07" * (64 << 20)
for _ in range(24):
    os.write(fd, chunk)
'""",
    "private tmpfs": """unshare --user --map-root-user --mount sh -c '
mkdir -p /tmp/hoard && mount -t tmpfs -o size=2g none /tmp/hoard &&
head -c 1610612736 /dev/zero > /tmp/hoard/fill; sleep 30'""",
}


@pytest.mark.parametrize("hoard", sorted(HOARDS))
def test_memory_no_process_maps_ends_the_vm_with_a_memory_reason(control_plane, client, hoard):
    created = client.browsers.create(headless=True, extra_body={"memory": "1GiB"})
    sid = created.session_id
    memory_group = next(group for group in _cgroups(control_plane, sid) if "/memory/" in group)
    peaks = []

    def watch() -> None:
        # The most the VM held, as long as its group exists.
        while True:
            try:
                with open(f"{memory_group}/memory.max_usage_in_bytes") as peak:
                    peaks.append(int(peak.read()))
            except OSError:
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        exec_in(client, sid, command=HOARDS[hoard], timeout_sec=60)
    except Exception:  # the VM (and the call) ended under it
        pass
    browser = _ended(client, sid)
    assert "memory" in browser["end_reason"], browser
    watcher.join(timeout=30)
    # The host never lent the VM more than its 1 GiB (give or take the kernel's charge
    # batches of at most 64 pages per CPU), and took it all back.
    assert peaks and max(peaks) <= GIB + (1 << 20), max(peaks)
    assert not os.path.exists(memory_group)


def test_a_fork_bomb_stops_at_the_vms_task_limit(control_plane, client):
    created = client.browsers.create(headless=True, extra_body={"memory": "4GiB"})
    sid = created.session_id
    try:
        pids_group = next(group for group in _cgroups(control_plane, sid) if "/pids/" in group)
        bomb = exec_in(client, sid, timeout_sec=30, command="""python3 -c '
import os
quiet = [(os.POSIX_SPAWN_OPEN, fd, "/dev/null", os.O_WRONLY, 0) for fd in (1, 2)]
started = 0
while started < 6000:
    try:
        os.posix_spawn("/bin/sleep", ["sleep", "60"], os.environ, file_actions=quiet)
    except OSError:
        break
    started += 1
print("tried", started)' """)
        # Tenant processes stop short of the VM's 4096 tasks (all but 256, which the
        # agent keeps): it still answered the call that started the bomb.
        assert bomb["timed_out"] is False, bomb
        started = int(out(bomb).split()[1])
        assert 3000 < started < 4096 - 200, started
        with open(f"{pids_group}/pids.peak") as peak:
            assert int(peak.read()) <= 4096
        assert subprocess.run(["true"]).returncode == 0
        # The bomb went with its command; the VM works again.
        assert out(exec_in(client, sid, command="echo alive")) == "alive\n"
    finally:
        client.browsers.delete_by_id(sid)


def test_a_vm_fills_its_own_disk_not_the_hosts(control_plane, client):
    created = client.browsers.create(headless=True)
    sid = created.session_id
    host_free = shutil.disk_usage(control_plane.data_dir).free
    try:
        too_big = exec_in(client, sid, command="fallocate -l 50G /home/kernel/big", timeout_sec=30)
        assert too_big["exit_code"] != 0
        assert "No space left" in out(too_big, "stderr")
        # (ext4 keeps what it allocated before it ran out.)
        exec_in(client, sid, command="rm -f /home/kernel/big")
        # Written for real up to the quota (8 GiB): the writes past it fail inside.
        almost = exec_in(client, sid, command="fallocate -l 7G /home/kernel/almost", timeout_sec=30)
        assert almost["exit_code"] == 0, out(almost, "stderr")
        full = exec_in(client, sid, timeout_sec=60,
                       command="dd if=/dev/zero of=/home/kernel/fill bs=1M count=4096")
        assert full["exit_code"] != 0 and "No space left" in out(full, "stderr")
        # The host's disk lost at most what the VM really wrote (under its 8 GiB).
        assert shutil.disk_usage(control_plane.data_dir).free > host_free - 8 * GIB
    finally:
        client.browsers.delete_by_id(sid)
    assert wait_until(lambda: shutil.disk_usage(control_plane.data_dir).free > host_free - GIB, 10)


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _spin(client: Kernel, sid: str, count: int, seconds: int) -> None:
    loops = " ".join(str(i) for i in range(count))
    exec_in(client, sid, timeout_sec=seconds + 30,
            command=f"sh -c 'for i in {loops}; do timeout {seconds} sh -c \"while :; do :; done\" & done; wait'")


def test_two_busy_vms_get_equal_shares_of_the_cpu(control_plane, client):
    many = client.browsers.create(headless=True)
    few = client.browsers.create(headless=True)
    try:
        groups = {sid: next(g for g in _cgroups(control_plane, sid) if "/cpu/" in g)
                  for sid in (many.session_id, few.session_id)}

        def busy_loops(sid: str) -> dict[int, float]:
            """CPU seconds of each busy loop of the VM, by pid: only they are measured (a
            process of Chromium's that ends between two looks would take its time away)."""
            with open(f"{groups[sid]}/cgroup.procs") as procs:
                pids = [int(pid) for pid in procs.read().split()]
            return {pid: cpu_seconds([pid]) for pid in pids if "while :" in _cmdline(pid)}

        # Six busy processes in one VM, two in the other, on this host's cores; they
        # outlast the measurement.
        spinners = [threading.Thread(target=_spin, args=(client, many.session_id, 6, 12)),
                    threading.Thread(target=_spin, args=(client, few.session_id, 2, 12))]
        for spinner in spinners:
            spinner.start()
        time.sleep(2)
        start = {sid: busy_loops(sid) for sid in groups}
        time.sleep(4)
        end = {sid: busy_loops(sid) for sid in groups}
        used = {sid: sum(seconds - start[sid].get(pid, 0.0) for pid, seconds in end[sid].items())
                for sid in groups}
        for spinner in spinners:
            spinner.join()
        ratio = used[many.session_id] / max(used[few.session_id], 0.01)
        # Without a weight per VM the six would get three times the two's time.
        assert 0.6 < ratio < 1.6, used
    finally:
        client.browsers.delete_by_id(many.session_id)
        client.browsers.delete_by_id(few.session_id)
