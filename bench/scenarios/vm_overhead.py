"""Memory a browser VM costs beyond Chromium itself: with 10 headful browsers live, the
proportional set size (PSS: shared pages split among their users) of each VM's agent,
Xvfb and sandbox helpers (bubblewrap and its PID 1), beside that of its Chromium
processes, per VM."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import httpx

from harness import ControlPlane, descendants, processes_mentioning, program_of

BROWSERS = 10


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _kind(pid: int) -> str:
    program = program_of(pid)
    if program.endswith("bwrap"):
        return "sandbox helpers"
    if program.endswith("browser-agent"):
        return "agent"
    if program.endswith("Xvfb"):
        return "Xvfb"
    if "chrom" in program:
        return "Chromium"
    return "other (encoder, ...)"


def run(work_dir: Path, report) -> None:
    server = ControlPlane(work_dir / "data").start()
    try:
        http = httpx.Client(base_url=server.base_url,
                            headers={"Authorization": f"Bearer {server.api_key}"}, timeout=60)
        sessions = [http.post("/browsers", json={}).raise_for_status().json()["session_id"]
                    for _ in range(BROWSERS)]
        time.sleep(3)  # past start-up: what a live, idle browser holds
        per_vm: dict[str, list[int]] = {}
        for session_id in sessions:
            root = str(server.data_dir / "browsers" / session_id / "root")
            holders = processes_mentioning(root)
            totals: dict[str, int] = {}
            for pid in holders.union(*(descendants(h) for h in holders)):
                totals[_kind(pid)] = totals.get(_kind(pid), 0) + _pss_kib(pid)
            for kind, kib in totals.items():
                per_vm.setdefault(kind, []).append(kib)
        print(f"\n== vm_overhead: PSS per browser VM with {BROWSERS} headful browsers live (median)")
        medians = {kind: statistics.median(values) for kind, values in per_vm.items()}
        for kind, kib in sorted(medians.items(), key=lambda item: -item[1]):
            print(f"{kind:34}{kib / 1024:>10.1f} MiB")
        overhead = sum(kib for kind, kib in medians.items() if kind != "Chromium")
        chromium = medians.get("Chromium", 0)
        print(f"{'VM overhead (all but Chromium)':34}{overhead / 1024:>10.1f} MiB")
        if chromium:
            print(f"{'ratio overhead/Chromium':34}{overhead / chromium:>11.2f}x")
        for session_id in sessions:
            http.delete(f"/browsers/{session_id}")
    finally:
        server.reap_everything()
