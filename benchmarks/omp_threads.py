"""What OMP_NUM_THREADS and OMP_WAIT_POLICY do to a CPU measurement, on a quiet and on a busy machine.

One ``perflab +experiment=matmul`` job per (threads, wait policy, machine) case, ``--rounds``
rounds, the cases interleaved within each round: OMP_NUM_THREADS=1 and =2 (perflab's default on
this machine: every CPU of its affinity mask), OMP_WAIT_POLICY=active (OpenMP's spinning) and
passive (steadier beside a busy process; perflab leaves the policy as the user set it), each on
the machine as it is ("quiet": on a shared machine, as quiet as it gets) and with other
processes spinning on the CPUs ("busy": ``while True: pass``, as many as ``--spinners``, one by
default: a busy neighbour). The job: 512 x 512 float32 matmuls,
4 per call, ``bench.repeats=10``, ``bench.min_time_s=0.3``. Per case: the median over rounds of
the job's median time and TFLOP/s, how long its threads waited for a CPU (``waited_pct``), and how many of its rows
perflab flagged as suspect.

    python benchmarks/omp_threads.py [--rounds 3] [--out benchmarks/results/omp_threads.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from _neighbours import spinning as neighbours
from _results import append

ROOT = Path(__file__).resolve().parents[1]
JOB = ["+experiment=matmul", "experiment.size=512", "experiment.iterations=4", "bench.repeats=10"]
JOB += ["bench.min_time_s=0.3", "results.table=false"]


def one(threads: int, policy: str, spinning: int, store: Path) -> dict:
    with neighbours(spinning, settle_s=0.5):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": policy}
        subprocess.run(
            [sys.executable, "-m", "perflab", *JOB, f"results.store={store}"],
            env=env,
            check=True,
            capture_output=True,
        )
    from perflab.results import load

    row = load(store).iloc[-1]
    return {
        "median_s": float(row["median_s"]),
        "tflops": float(row["tflops"]),
        "waited_pct": float(row.get("waited_pct", float("nan"))),
        "suspect": bool(str(row.get("suspect", "")).strip() not in ("", "<NA>", "nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spinners", type=int, default=1, help="processes spinning beside the busy cases")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "omp_threads.csv")
    args = parser.parse_args()
    cases = [(t, p, s) for s in (0, args.spinners) for p in ("active", "passive") for t in (1, 2)]
    got: dict[tuple[int, str, int], list[dict]] = {c: [] for c in cases}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, case in enumerate(cases[r % len(cases) :] + cases[: r % len(cases)]):
                got[case].append(one(*case, Path(tmp) / f"{'-'.join(map(str, case))}-{r}-{i}"))
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = []
    for (threads, policy, spinning), runs in got.items():
        rows.append(
            {
                "when": when,
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "omp_num_threads": threads,
                "omp_wait_policy": policy,
                "machine": f"busy ({spinning} spinning)" if spinning else "quiet (shared)",
                "load_before": round(load_before, 2),
                "rounds": len(runs),
                "median_ms": round(1e3 * float(np.median([x["median_s"] for x in runs])), 3),
                "tflops": round(float(np.median([x["tflops"] for x in runs])), 4),
                "waited_pct": round(float(np.median([x["waited_pct"] for x in runs])), 1),
                "suspect_runs": sum(x["suspect"] for x in runs),
                "job": " ".join(JOB),
            }
        )
    append(args.out, rows)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
