"""Does ``perflab chapter --budget N`` end within its budget, and do its jobs take what it
estimated? Runs the chapter in a fresh process in a scratch folder and records its wall time
against the budget, the machine's load before and after, the verdicts it reached, and the range
of its jobs' times over their estimates (each job's line says its own). Goals (issue 21, 27):
within the budget plus 15 %, each job within ±30 % of its estimate, on a 2-core CPU machine.

Each run calibrates and measures anew in a scratch store of its own; with ``--same-store`` the
runs share one, so that from the second on the chapter keeps the calibration and estimates each
job at the pace it had in the runs before (as a user's next ``perflab chapter`` does).

    python benchmarks/chapter_budget.py [--budget 8] [--runs 1] [--same-store] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _results import append

FIELDS = ["timestamp", "host", "cpus", "budget_s", "wall_s", "share_of_budget", "load_before", "load_after", "rc"]
FIELDS += ["claims", "store", "est_ratio_min", "est_ratio_max"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=8.0, help="minutes")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--same-store", action="store_true", help="the runs share one scratch store (see above)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "chapter_budget.csv")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # as a user runs it
    with tempfile.TemporaryDirectory() as shared:
        for run in range(args.runs):
            with tempfile.TemporaryDirectory() as own:
                tmp = shared if args.same_store else own
                load_before = os.getloadavg()[0]
                t0 = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-m", "perflab.chapter", "--budget", f"{args.budget:g}"],
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    env=env,
                )
                wall = time.perf_counter() - t0
                load_after = os.getloadavg()[0]
            tally = re.search(r"^claims: (.*)$", proc.stdout, flags=re.M)
            claims = tally.group(1) if tally else proc.stderr.strip().splitlines()[-1:]
            took = re.search(r"took ([\d.]+)x to ([\d.]+)x their estimates", proc.stdout)
            ratios = (took.group(1), took.group(2)) if took else ("", "")
            print(*(line for line in proc.stdout.splitlines() if "(est. " in line), sep="\n")
            budget_s = 60 * args.budget
            store = f"shared, run {run + 1}" if args.same_store else "fresh"
            print(
                f"budget {budget_s:.0f} s: ended in {wall:.0f} s ({wall / budget_s:.0%}), rc {proc.returncode}: "
                f"{claims}; jobs took {ratios[0]}x to {ratios[1]}x their estimates ({store} store)"
            )
            when = datetime.now(timezone.utc).isoformat(timespec="seconds")
            append(
                args.out,
                [
                    dict(
                        zip(
                            FIELDS,
                            [when, platform.node(), os.cpu_count(), f"{budget_s:.0f}", f"{wall:.1f}"]
                            + [f"{wall / budget_s:.3f}", f"{load_before:.2f}", f"{load_after:.2f}", proc.returncode]
                            + [claims, store, *ratios],
                        )
                    )
                ],
            )
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
