"""Does the gate decide on a shared runner? `perflab ab` runs, A/A and with a real slowdown,
beside a process spinning on a CPU the whole time (a CI runner's neighbour), or quiet.

Two workloads, as #41 sets them:

- ``matmul``: ``+experiment=quick/matmul experiment.size=128`` at one thread
  (``devices.threads=1``); the slowdown is real work: ``experiment.iterations`` 20 against 25 (25 %; 23 for 15 %);
- ``model``: a user's small model (linear, GELU, layer norm; a package this script writes to a
  scratch folder, on ``PYTHONPATH``) through ``+experiment=quick/infer`` at perflab's default
  threads; the slowdown: ``+model.depth`` 4 against 5 blocks (25 %; a smaller --slowdown rounds to whole blocks);
  judged on its forward rows (``--where measurement!=load``: the load row is one sample a process).

Each run is ``perflab ab ... --budget MINUTES`` at the default 10 % gate (both sides in one
process each round, in turns; ``--apart``: a process a side); its verdict, processes a
side, what was judged (wall or CPU time) and the load beside it go to ``--out``.

Goals (#41): beside one spinning process, the same code never FAILs and PASSes >= 16 of 20; a
25 % slowdown FAILs >= 16 of 20 and never PASSes; quiet, a 15 % slowdown FAILs >= 19 of 20.

    python benchmarks/busy_gate.py [--runs 20] [--budget 3] [--busy] [--workloads matmul,model]
                                   [--slowdown 25] [--apart] [--out benchmarks/results/busy_gate.csv]
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

from _neighbours import spinning
from _results import append

MODEL = '''
import torch
from torch import nn


class Tiny(nn.Module):
    """A user's small model: blocks of linear, GELU and layer norm."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, depth: int = 4, width: int = 256) -> None:
        super().__init__()
        self.inp = nn.Linear(in_channels * 28 * 28, width)  # quick/infer's images: 28 x 28
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width)) for _ in range(depth))
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x.flatten(1))))
'''


def workload(name: str, slowdown_pct: float) -> tuple[list[str], list[str], list[str]]:
    """(shared overrides, base's, new's) of a workload; the new side does ``slowdown_pct`` more work."""
    if name == "matmul":
        base = 20  # matmuls a call: enough that 15 % more is a whole number of them (23)
        new = round(base * (1 + slowdown_pct / 100)) if slowdown_pct else base
        shared = ["+experiment=quick/matmul", "experiment.size=128", "devices.threads=1", "results.table=false"]
        return shared, [f"experiment.iterations={base}"], [f"experiment.iterations={new}"]  # judged by median_s
    base = 4
    new = round(base * (1 + slowdown_pct / 100)) if slowdown_pct else base
    shared = ["+experiment=quick/infer", "model._target_=busygate.Tiny", "results.table=false"]
    return shared, [f"+model.depth={base}"], [f"+model.depth={new}"]


def one(
    name: str, slowdown_pct: float, budget: float, work: Path, env: dict[str, str], apart: bool
) -> dict[str, object]:
    shared, base, new = workload(name, slowdown_pct)
    out = work / f"ab-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "perflab",
        "ab",
        *shared,
        "--budget",
        str(budget),
        "--out",
        str(out),
        "--format",
        "json",
    ]
    cmd += [x for o in base for x in ("--base", o)] + [x for o in new for x in ("--new", o)]
    if name == "matmul":  # more matmuls a call is more time a call, not fewer TFLOP/s: judge the time
        cmd += ["--metric", "median_s"]
    else:  # its speed: the forward rows (load is one sample a process, tens of percent apart)
        cmd += ["--where", "measurement!=load"]
    if apart:  # a process for each side each round (default: both in one, in turns)
        cmd += ["--apart"]
    load = os.getloadavg()[0]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env, timeout=budget * 60 + 300)
    took = time.monotonic() - start
    try:
        points = json.loads(done.stdout)["points"]
    except (ValueError, KeyError):
        points = []
    verdicts = sorted({str(p.get("verdict")) for p in points}) or [f"exit {done.returncode}"]
    return {
        "workload": name,
        "slowdown_pct": slowdown_pct,
        "rounds": "apart" if apart else "together",
        "verdict": "+".join(verdicts),
        "exit": done.returncode,
        "processes": max((int(p.get("new_processes") or 0) for p in points), default=0),
        "judged": "+".join(sorted({str(p.get("judged") or p.get("metric")) for p in points})),
        "paired": all(bool(p.get("paired")) for p in points) if points else False,
        # each point's measured change and its interval (speedup of new over base): why it passed or not
        "change_pct": "+".join(f"{float(p.get('change_pct') or 'nan'):.1f}" for p in points),
        "ci": "+".join(f"{float(p.get('ci_low') or 'nan'):.3f}-{float(p.get('ci_high') or 'nan'):.3f}" for p in points),
        "seconds": round(took, 1),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--budget", type=float, default=3.0, help="minutes a perflab ab run")
    parser.add_argument("--busy", action="store_true", help="a process spins on a CPU the whole time")
    parser.add_argument("--workloads", default="matmul,model")
    parser.add_argument("--slowdown", type=float, default=25.0, help="percent more work on the new side")
    parser.add_argument("--apart", action="store_true", help="perflab ab --apart: a process a side each round")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "busy_gate.csv")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="busy-gate-"))
    (work / "busygate.py").write_text(MODEL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")])}
    with spinning(int(args.busy)):
        for name in args.workloads.split(","):
            for slowdown in (0.0, args.slowdown):
                for k in range(args.runs):
                    row = one(name, slowdown, args.budget, work, env, args.apart)
                    row.update(run=k + 1, busy=args.busy, budget_min=args.budget)
                    append(args.out, [row])
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
