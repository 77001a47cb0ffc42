"""The suite's own leak check (`conftest.no_vm_process_outlives_the_suite`) counts only
the VMs of the control planes the suite started: browsers that other work runs on the
machine do not fail it, and a VM process the suite left behind still does."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

from harness import suite_vm_paths, vm_dirs_base, vm_processes_left, wait_until

from sdk import once

# What this module tests does not depend on the SDK's generation: run once, in today's phase.
pytestmark = once


def named(directory: Path, program: str, target: str) -> Path:
    """A link called `program` to `target`: a process started through it has that name."""
    link = directory / program
    link.symlink_to(target)
    return link


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def end(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_other_browsers_on_the_machine_are_not_the_suite_s_and_a_planted_leak_is_caught(tmp_path):
    base = tmp_path / "run"
    data_dir = base / "module" / "data"
    (data_dir / "browsers" / "ses_leak").mkdir(parents=True)
    (data_dir / "control-plane.log").write_text("")
    ours = suite_vm_paths(base)
    assert ours == (str(base), f"{vm_dirs_base(data_dir)[1]}/")

    # Unrelated: a real Chromium with a profile outside the run, and a VM-looking
    # process of another control plane's relocated directory.
    with tempfile.TemporaryDirectory(prefix="unrelated-browser-") as elsewhere:
        started: list[subprocess.Popen] = []
        try:
            started.append(spawn("chromium", "--headless", "--no-sandbox", f"--user-data-dir={elsewhere}",
                                 "--remote-debugging-port=0", "about:blank"))
            started.append(spawn(str(named(Path(elsewhere), "browser-agent", "/bin/sh")), "-c",
                                 "while :; do sleep 1; done", "/var/lib/browser-vms/0123456789abcdef/x"))
            unrelated = {process.pid for process in started}
            # Both are running and counted as VM processes by a check that is not scoped.
            assert wait_until(lambda: unrelated <= {pid for pid, _, _ in vm_processes_left(0)}, 10)
            assert vm_processes_left(0, within=ours) == []

            # Planted: what a VM of this run left behind, in its data directory and in
            # its relocated one.
            leaked = []
            try:
                leaked.append(spawn(str(named(data_dir / "browsers" / "ses_leak", "chromium", "/bin/sh")),
                                    "-c", "while :; do sleep 1; done"))
                leaked.append(spawn(str(named(tmp_path, "Xvfb", "/bin/sh")), "-c", "while :; do sleep 1; done",
                                    f"{vm_dirs_base(data_dir)[1]}/browsers/ses_leak/root"))
                found = {pid for pid, _, _ in vm_processes_left(0.5, within=ours)}
                assert found == {process.pid for process in leaked}, found
            finally:
                for process in leaked:
                    end(process)
            assert vm_processes_left(2, within=ours) == []
        finally:
            for process in started:
                end(process)
