"""Benchmark runner. Each scenario measures our service and a reference in the same run
and prints both with their ratio.

    bench/run.sh                 # every scenario
    bench/run.sh cold_create     # one scenario
"""

from __future__ import annotations

import importlib
import pkgutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

import scenarios  # noqa: E402


def summarize(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90_index = max(0, int(round(0.9 * len(ordered))) - 1)
    return {"median": statistics.median(ordered), "p90": ordered[p90_index]}


def report(name: str, ours: list[float], reference: list[float], reference_name: str) -> None:
    o, r = summarize(ours), summarize(reference)
    print(f"\n== {name} ({len(ours)} runs each)")
    print(f"{'':32} {'median':>10} {'p90':>10}")
    print(f"{'ours':32} {o['median'] * 1000:>8.0f}ms {o['p90'] * 1000:>8.0f}ms")
    print(f"{reference_name:32} {r['median'] * 1000:>8.0f}ms {r['p90'] * 1000:>8.0f}ms")
    print(f"{'ratio ours/reference':32} {o['median'] / r['median']:>9.2f}x {o['p90'] / r['p90']:>9.2f}x")


def main() -> None:
    wanted = set(sys.argv[1:])
    available = [m.name for m in pkgutil.iter_modules(scenarios.__path__)]
    unknown = wanted - set(available)
    if unknown:
        sys.exit(f"unknown scenario(s) {sorted(unknown)}; available: {available}")
    for name in available:
        if wanted and name not in wanted:
            continue
        module = importlib.import_module(f"scenarios.{name}")
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as work_dir:
            module.run(Path(work_dir), report)


if __name__ == "__main__":
    main()
