"""Benchmark runner. Each scenario measures our service and a reference in the same run
and prints both with their ratio.

    bench/run.sh                 # every scenario but those run only on request (soak)
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


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    index = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered))) - 1))
    return statistics.median(ordered) if p == 50 else ordered[index]


def report(name: str, ours: list[float], references: dict[str, list[float]],
           percentiles: tuple[int, ...] = (50, 90), unit: str = "ms") -> None:
    """Prints our samples and each reference at the given percentiles, with the ratio
    ours/reference and the difference ours - reference."""
    scale = {"ms": 1000, "us": 1_000_000}[unit]
    columns = [f"p{p}" if p != 50 else "median" for p in percentiles]
    print(f"\n== {name} ({len(ours)} runs each)")
    print(f"{'':34}" + "".join(f"{c:>12}" for c in columns))
    rows = {"ours": ours, **references}
    for label, samples in rows.items():
        print(f"{label:34}" + "".join(f"{percentile(samples, p) * scale:>10.2f}{unit}" for p in percentiles))
    for label, samples in references.items():
        ratios = [percentile(ours, p) / percentile(samples, p) for p in percentiles]
        print(f"{'ratio ours/' + label:34}" + "".join(f"{r:>11.2f}x" for r in ratios))
        differences = [(percentile(ours, p) - percentile(samples, p)) * scale for p in percentiles]
        print(f"{'ours - ' + label:34}" + "".join(f"{d:>+10.2f}{unit}" for d in differences))


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
        # Long scenarios (the soak) run only when named.
        if not wanted and getattr(module, "ON_REQUEST", False):
            continue
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as work_dir:
            module.run(Path(work_dir), report)


if __name__ == "__main__":
    main()
