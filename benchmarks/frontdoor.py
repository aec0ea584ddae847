"""How fast perflab answers before any work: a config mistake, --help and the experiment list,
each in a fresh process, against ``import torch`` alone, the cases taking turns (a repeat runs
each once, so a neighbour's load falls on all of them alike). Goal (issue 45, one composer): a
refused config mistake within 0.3 of ``import torch``. ``--beside DIR`` times each perflab case of another
checkout too (its ``perflab`` on PYTHONPATH, e.g. main before a change), interleaved the same.

    python benchmarks/frontdoor.py [--repeats 5] [--beside DIR] [--out benchmarks/results/frontdoor.csv]
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

CASES = {
    "import torch (reference)": [sys.executable, "-c", "import torch"],
    "perflab (the experiment list)": [sys.executable, "-m", "perflab"],
    "an unknown experiment: +experiment=nosuch": [sys.executable, "-m", "perflab", "+experiment=nosuch"],
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
    parser.add_argument("--beside", type=Path, help="another checkout whose perflab cases are timed too")
    args = parser.parse_args()
    cases = {name: (cmd, None) for name, cmd in CASES.items()}
    if args.beside:
        beside = args.beside.resolve()
        cases.update({f"{name} [{beside}]": (cmd, beside) for name, cmd in CASES.items() if "perflab" in cmd})
    times: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for turn in range(args.repeats + 1):  # the first turn warms the file cache, untimed
            for name, (cmd, path) in cases.items():
                env = {**os.environ, "PYTHONPATH": str(path)} if path else None
                t0 = time.perf_counter()
                subprocess.run(cmd, cwd=tmp, capture_output=True, env=env)
                if turn:
                    times[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(t) for name, t in times.items()}
    reference = medians["import torch (reference)"]
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())  # at the end: a busy neighbour shows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        f.write("timestamp,host,loadavg,case,median_s,share_of_import_torch\n")
        for name, seconds in medians.items():
            print(f"{name}: {seconds:.2f} s ({seconds / reference:.0%} of import torch)")
            f.write(f'{when},{platform.node()},{load},"{name}",{seconds},{seconds / reference}\n')
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
