"""Run-to-run stability of the default matmul job vs torch.utils.benchmark on the same op.

Five separate processes of ``perflab +experiment=matmul`` (1024 x 1024, 10 matmuls per call,
the default bench settings) and five separate processes of torch.utils.benchmark's
``blocked_autorange`` on the same call, interleaved (perflab, torch, perflab, ...) so that a
drift of the machine falls on both. The figure of merit: the coefficient of variation of the
five medians. Goal (issue 9): perflab's CV within 1.5x of torch.utils.benchmark's.

    python benchmarks/stability.py [--runs 5] [--out benchmarks/results/stability.csv]
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

TORCH_RUN = """
import json, torch, torch.utils.benchmark as tub
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
def work():
    for _ in range(10):
        torch.mm(a, b)
m = tub.Timer(stmt="work()", globals={"work": work}, num_threads=torch.get_num_threads()).blocked_autorange(
    min_run_time=0.5)
print(json.dumps({"median_s": m.median}))
"""


def perflab_median(store: Path) -> float:
    subprocess.run(
        [sys.executable, "-m", "perflab", "+experiment=matmul", f"results.store={store}", "results.table=false"],
        check=True,
        capture_output=True,
    )
    from perflab.results import load

    df = load(store)
    return float(df.sort_values("timestamp").iloc[-1]["median_s"])


def torch_median() -> float:
    out = subprocess.run([sys.executable, "-c", TORCH_RUN], check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["median_s"])


def cv(values: list[float]) -> float:
    a = np.asarray(values)
    return float(a.std(ddof=1) / a.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "stability.csv")
    args = parser.parse_args()
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            ours.append(perflab_median(Path(tmp) / f"run{i}"))
            theirs.append(torch_median())
            print(f"run {i + 1}: perflab {ours[-1] * 1e3:.2f} ms, torch.utils.benchmark {theirs[-1] * 1e3:.2f} ms")
    rows = [("perflab", m) for m in ours] + [("torch.utils.benchmark", m) for m in theirs]
    ratio = cv(ours) / cv(theirs)
    print(
        f"CV of the medians over {args.runs} processes: perflab {cv(ours):.1%}, torch.utils.benchmark "
        f"{cv(theirs):.1%} (ratio {ratio:.2f}; goal <= 1.5)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with args.out.open("w") as f:
        f.write("timestamp,host,tool,run,median_s,cv_of_medians,cv_ratio\n")
        for i, (tool, m) in enumerate(rows):
            f.write(
                f"{when},{platform.node()},{tool},{i % args.runs + 1},{m},"
                f"{cv(ours) if tool == 'perflab' else cv(theirs)},{ratio}\n"
            )
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
