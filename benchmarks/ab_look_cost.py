"""What one look of ``perflab ab`` costs as the processes grow: a look re-reads both trees and
judges every point, so its cost should grow with the processes measured (linearly), never with
their square; with the sparse schedule (2, 3, 4, 6, 8, 12, 16, 24, 32, 40 a side) the looks of a
whole run then cost about twice the last one.

Each tree holds K one-row runs of ``matmul`` with 30 raw samples each (as ``perflab ab`` writes
them, one run per process), ``--points`` points per run; ``compare.ab`` is timed on them (the
median of ``--repeats`` looks, the file cache warm).

    python benchmarks/ab_look_cost.py [--points 1] [--repeats 3] [--out benchmarks/results/ab_look_cost.csv]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import append  # noqa: E402

SIZES = (2, 4, 8, 16, 32, 40)


def write(tree: Path, side: str, k: int, points: int, rng: np.random.Generator) -> None:
    """Process ``k`` of one side: one run, a row per point, 30 samples each."""
    from perflab.store.rundir import RunWriter

    run = f"{side}{k}"
    writer = RunWriter(tree / run)
    for size in range(points):
        times = 1e-3 * (1 + rng.normal(0, 0.05)) * (1 + rng.normal(0, 0.01, 30))
        median = float(np.median(times))
        row = {
            **{"run_id": run, "experiment": "matmul", "measurement": "cpu alone", "status": "ok", "process": k},
            **{"n": len(times), "median_s": median, "tflops": 2 * 256**3 / median / 1e12},
            **{"device_name": "CPU (1 thread)", "num_threads": 1, "cfg.experiment.size": 64 + size},
        }
        writer.add(row, samples=list(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ab_look_cost.csv"))
    args = parser.parse_args()
    from perflab import compare

    rng, found = np.random.default_rng(0), []
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["XDG_CACHE_HOME"] = scratch  # the floor a look keeps: not the user's
        base, new = Path(scratch) / "base", Path(scratch) / "new"
        done = 0
        for k in SIZES:
            for i in range(done + 1, k + 1):
                write(base, "a", i, args.points, rng)
                write(new, "b", i, args.points, rng)
            done = k
            took = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                compare.ab(base, new, looks=10, busy="left_out", paired=True)  # as perflab ab looks
                took.append(time.perf_counter() - start)
            look = float(np.median(took))
            found.append({"processes": k, "points": args.points, "look_s": round(look, 4)})
            print(f"{k:3d} processes a side, {args.points} point(s): a look takes {look * 1000:.0f} ms", flush=True)
    load = os.getloadavg()[0]
    append(args.out, [{**r, "repeats": args.repeats, "load": round(load, 2)} for r in found])
    print(f"load {load:.2f} -> {args.out}")


if __name__ == "__main__":
    main()
