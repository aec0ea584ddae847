"""Does ``perflab chapter --budget N`` end within its budget? Runs the chapter in a fresh process
in a scratch folder (each run calibrates and measures anew) and records its wall time against
the budget, the machine's load before and after, and the verdicts it reached. Goal (issue 21):
within the budget plus 15 %, on a 2-core CPU machine.

    python benchmarks/chapter_budget.py [--budget 8] [--runs 1] [--out benchmarks/results/chapter_budget.csv]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=8.0, help="minutes")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "chapter_budget.csv")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    new = not args.out.exists()
    with args.out.open("a") as f:
        if new:
            f.write("timestamp,host,cpus,budget_s,wall_s,share_of_budget,load_before,load_after,rc,claims\n")
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                load_before = os.getloadavg()[0]
                t0 = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-m", "perflab.chapter", "--budget", f"{args.budget:g}"],
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                )
                wall = time.perf_counter() - t0
                load_after = os.getloadavg()[0]
            tally = re.search(r"^claims: (.*)$", proc.stdout, flags=re.M)
            claims = tally.group(1) if tally else proc.stderr.strip().splitlines()[-1:]
            budget_s = 60 * args.budget
            share = wall / budget_s
            print(f"budget {budget_s:.0f} s: ended in {wall:.0f} s ({share:.0%}), rc {proc.returncode}: {claims}")
            when = datetime.now(timezone.utc).isoformat(timespec="seconds")
            f.write(
                f"{when},{platform.node()},{os.cpu_count()},{budget_s:.0f},{wall:.1f},{wall / budget_s:.3f},"
                f'{load_before:.2f},{load_after:.2f},{proc.returncode},"{claims}"\n'
            )
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
