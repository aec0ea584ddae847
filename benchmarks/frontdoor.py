"""How fast perflab answers before any work: a config mistake, --help and the experiment list,
each in a fresh process, against ``import torch`` alone. Goal (issue 13): under a third of it.

    python benchmarks/frontdoor.py [--repeats 5] [--out benchmarks/results/frontdoor.csv]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

CASES = {
    "import torch (reference)": [sys.executable, "-c", "import torch"],
    "perflab (the experiment list)": [sys.executable, "-m", "perflab"],
    "a config mistake: experiment.size=-5": [
        sys.executable,
        "-m",
        "perflab",
        "+experiment=matmul",
        "experiment.size=-5",
    ],
    "an unknown key: +bench.repeat=3": [sys.executable, "-m", "perflab", "+experiment=matmul", "+bench.repeat=3"],
    "perflab +experiment=matmul --help": [sys.executable, "-m", "perflab", "+experiment=matmul", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "frontdoor.csv")
    args = parser.parse_args()
    medians = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in CASES.items():
            subprocess.run(cmd, cwd=tmp, capture_output=True)  # warm the file cache once
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                subprocess.run(cmd, cwd=tmp, capture_output=True)
                times.append(time.perf_counter() - t0)
            medians[name] = statistics.median(times)
    reference = medians["import torch (reference)"]
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        f.write("timestamp,host,case,median_s,share_of_import_torch\n")
        for name, seconds in medians.items():
            print(f"{name}: {seconds:.2f} s ({seconds / reference:.0%} of import torch)")
            f.write(f'{when},{platform.node()},"{name}",{seconds},{seconds / reference}\n')
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
