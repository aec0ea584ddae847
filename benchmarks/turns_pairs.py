"""Do both sides of a process measured in turns see the same machine? An A/A pair of a user's
small model (busy_gate's ``Tiny`` at perflab's default threads, ``+experiment=quick/infer``) in
one ``python -m perflab.job.together`` process: per process and forward row, the ratio of the
two sides' medians (1 when they saw the same machine) and the median |log| of their adjacent
samples' ratios. With ``--old CHECKOUT`` the same processes of an older perflab are interleaved
with this one's (``PYTHONPATH``), so the two are compared under one load.

Where one side's OpenMP pool stalls while the other's does not, the pairs part: the ratio moves
far from 1 in some processes, and ``perflab ab`` cannot decide (#41).

    python benchmarks/turns_pairs.py [--processes 8] [--busy] [--old /path/to/older/checkout]
                                     [--out benchmarks/results/turns_pairs.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _neighbours import spinning
from _results import append
from busy_gate import MODEL

ROOT = Path(__file__).resolve().parents[1]
SHARED = ["+experiment=quick/infer", "model._target_=busygate.Tiny", "results.table=false"]


def one(code: str, checkout: Path | None, work: Path) -> list[dict[str, object]]:
    """One together process of an A/A pair; a row per forward measurement."""
    from perflab import results

    trees = Path(tempfile.mkdtemp(dir=work))
    path = [str(work)] + ([str(checkout)] if checkout else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    pair = [[*SHARED, f"results.store={trees / side}"] for side in ("a", "b")]
    load, start = os.getloadavg()[0], time.monotonic()
    cmd = [sys.executable, "-m", "perflab.job.together", json.dumps([pair])]
    done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - start
    if done.returncode:
        return [{"code": code, "measurement": f"exit {done.returncode}", "seconds": round(took, 1)}]
    rows, samples = {}, {}
    for side in ("a", "b"):
        r = results.load(trees / side)
        s = results.load_samples(trees / side)
        s = s[s["phase"].astype("string") != "warmup"]
        rows[side] = dict(zip(r["measurement"], r["row_id"].astype("string")))
        samples[side] = s
    out = []
    for measurement in rows["a"]:
        if not measurement.startswith("forward"):
            continue
        a, b = (samples[x].loc[samples[x]["row_id"].astype("string") == rows[x][measurement], "seconds"] for x in "ab")
        n = min(len(a), len(b))
        ratio = np.log(a.to_numpy()[:n] / b.to_numpy()[:n])
        out.append(
            {
                "code": code,
                "measurement": measurement,
                "n": n,
                "median_ratio": round(float(np.median(a) / np.median(b)), 4),
                "median_abs_log_pair": round(float(np.median(np.abs(ratio))), 4),
                "seconds": round(took, 1),
                "load_before": round(load, 2),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--busy", action="store_true", help="a process spins on a CPU the whole time")
    parser.add_argument("--old", type=Path, help="a checkout of an older perflab, its processes interleaved")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "turns_pairs.csv")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="turns-pairs-"))
    (work / "busygate.py").write_text(MODEL)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    codes = [("new", None, commit.stdout.strip())]
    if args.old:
        old = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.old, capture_output=True, text=True)
        codes.append(("old", args.old.resolve(), old.stdout.strip()))
    with spinning(int(args.busy)):
        for k in range(args.processes):
            for code, checkout, sha in codes if k % 2 == 0 else codes[::-1]:  # interleaved, each first in turn
                rows = [dict(r, process=k + 1, commit=sha, busy=args.busy) for r in one(code, checkout, work)]
                append(args.out, rows)
                for r in rows:
                    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
