"""What gathering the environment and machine identity costs a job's start.

Each of ``--runs`` fresh processes imports torch and perflab.measure.instruments (psutil) first (every job
has, before it gathers the environment; not ours to count), then times the first call of
``perflab.measure.environment.environment()`` plus the subject (``subject(None)``: the working
directory's git commit), and the same for the environment module as it was on ``main``
before the machine identity (loaded from ``git show``), in turn.
The figure: the median extra milliseconds per job. Goal (issue 20): a few ms at most.

    python benchmarks/environment_cost.py [--runs 9] [--out benchmarks/results/environment_cost.csv]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from _results import append

ROOT = Path(__file__).resolve().parents[1]
TIMED = """
import json, sys, time, importlib.util
import torch
import perflab.measure.instruments  # a job has imported it (and psutil) before it gathers the environment
spec = importlib.util.spec_from_file_location("env_under_test", sys.argv[1])
env = importlib.util.module_from_spec(spec); spec.loader.exec_module(env)
t0 = time.perf_counter()
env.environment()
if hasattr(env, "subject"):
    env.subject(None)
print(json.dumps({"ms": 1e3 * (time.perf_counter() - t0)}))
"""


def once(module: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-c", TIMED, str(module)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])["ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--base", default="main", help="the git revision whose environment.py is the 'before'")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "environment_cost.csv")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "environment_before.py"
        before.write_text(
            subprocess.run(
                ["git", "show", f"{args.base}:perflab/measure/environment.py"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        now = ROOT / "perflab" / "measure" / "environment.py"
        old, new = [], []
        for _ in range(args.runs):  # interleaved: a drift of the machine falls on both
            old.append(once(before))
            new.append(once(now))
    row = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "runs": args.runs,
        "before_ms_median": round(float(np.median(old)), 2),
        "now_ms_median": round(float(np.median(new)), 2),
        "extra_ms_median": round(float(np.median(new) - np.median(old)), 2),
        "now_ms_max": round(float(np.max(new)), 2),
        "note": "first call per process, torch already imported; with the subject's git calls; shared 2-core machine",
    }
    append(args.out, [row])
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
