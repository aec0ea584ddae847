"""The figures the README, the docs and ``perflab`` itself state about how long things take here,
measured: each experiment's default run and its quick/ variant (the ``[25 s; quick/ 5 s]`` of
each preset's first comment, which the README's table repeats), a config mistake's answer, and
the README's test command. Run it on a quiet machine; ``tests/test_readme.py`` then holds every
stated figure to the newest measurement here, so a figure cannot drift from what runs.

    python benchmarks/stated_figures.py [--only compile,matmul,mistake,suite] [--no-suite]

Each figure is the median of ``--repeats`` fresh processes (wall time, imports included, as a
user waits for it); results are appended to ``benchmarks/results/stated_figures.csv`` with the
machine, the commit and the load before each.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _results import append

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "stated_figures.csv"
SKIPPED = {"resnet18_concise"}  # made for GPUs: its default run takes hours on a CPU (said as such); its quick/ runs
MISTAKE = "a config mistake"
SUITE = "the README's test command"


def presets() -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def commands(only: set[str] | None, suite: bool) -> dict[str, list[str]]:
    perflab = [sys.executable, "-m", "perflab"]
    found = {}
    for name in presets():
        if only and name not in only:
            continue
        if name not in SKIPPED:
            found[name] = [*perflab, f"+experiment={name}"]
        found[f"quick/{name}"] = [*perflab, f"+experiment=quick/{name}"]
    if not only or "mistake" in only:
        found[MISTAKE] = [*perflab, "+experiment=matmul", "experiment.size=-5"]
    if suite and (not only or "suite" in only):
        found[SUITE] = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")]
    return found


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per figure (median)")
    parser.add_argument("--only", default="", help="comma-separated presets, 'mistake', 'suite' (default: all)")
    parser.add_argument("--no-suite", action="store_true", help="leave out the test suite (minutes)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    only = {x for x in args.only.split(",") if x} or None
    rows = []
    for figure, cmd in commands(only, not args.no_suite).items():
        load = os.getloadavg()[0]
        times, rc = [], 0
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT if figure == SUITE else tmp, capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                rc = rc or proc.returncode
        median = statistics.median(times)
        print(f"{figure}: {median:.1f} s (rc {rc}, load before {load:.2f})", flush=True)
        rows.append(
            {
                "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "host": platform.node(),
                "commit": commit(),
                "cpus": os.cpu_count(),
                "load_before": round(load, 2),
                "figure": figure,
                "median_s": round(median, 2),
                "repeats": args.repeats,
                "rc": rc,
            }
        )
    append(args.out, rows)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
