"""perflab ab's sequential design, simulated: how often runs of its schedule of looks end FAIL,
PASS or undecided, and after how many processes a side, for a known between-process variation
and true slowdowns, with and without the equivalence rule (PASS where the interval at the look's
level excludes a slowdown beyond the gate). No machine is measured: each process's figure is
drawn (log-normal at ``--cv``), and judged by ``perflab.analysis.verdicts.judge`` as ab judges.

    python benchmarks/ab_sequential.py [--runs 300] [--cv 10] [--gate 10] [--max-processes 40]
                                       [--slowdowns 0 5 10 12 15 20]
                                       [--out benchmarks/results/ab_sequential.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import append  # noqa: E402

SLOWDOWNS = (0, 5, 10, 12, 15, 20)  # percent


def side(logs: np.ndarray):
    from perflab.analysis.replicates import Measured

    figures = np.exp(logs)
    return Measured(pd.DataFrame(), float(np.median(figures)), figures, [], [np.array([])] * len(figures), figures)


def one_run(rng: np.random.Generator, cv: float, slowdown: float, gate: float, looks: list[int]) -> tuple[str, int]:
    from perflab.analysis import verdicts

    a, b = rng.normal(0, cv, looks[-1]), rng.normal(np.log(slowdown), cv, looks[-1])
    for k in looks:
        point = verdicts.ComparedPoint("aa", "a/a", "median_s", side(a[:k]), side(b[:k]), higher=False)
        ((_, decision),) = verdicts.judge([point], gate, 0.05, False, None, len(looks))
        if decision.verdict != "INCONCLUSIVE":
            break
    return decision.verdict.value, k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--cv", type=float, default=10.0, help="between-process variation, percent")
    parser.add_argument("--gate", type=float, default=10.0)
    parser.add_argument("--max-processes", type=int, default=40)
    parser.add_argument("--slowdowns", type=float, nargs="+", default=SLOWDOWNS, help="true slowdowns, percent")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ab_sequential.csv"))
    args = parser.parse_args()
    from perflab import ab
    from perflab.analysis import verdicts

    looks, within, found = ab.schedule(2, args.max_processes), verdicts._within, []
    for rule in ("equivalence", "detectable only"):
        verdicts._within = within if rule == "equivalence" else (lambda stats, gate: False)  # type: ignore[assignment]
        for slowdown in (1 + pct / 100 for pct in args.slowdowns):
            rng = np.random.default_rng(1)
            ends = [one_run(rng, args.cv / 100, slowdown, args.gate, looks) for _ in range(args.runs)]
            words = [w for w, _ in ends]
            row = {"rule": rule, "slowdown_pct": round(100 * (slowdown - 1)), "runs": args.runs}
            row.update({w: words.count(w) for w in ("FAIL", "PASS", "INCONCLUSIVE")})
            row.update(mean_processes=round(float(np.mean([k for _, k in ends])), 1), cv_pct=args.cv, gate=args.gate)
            found.append(row)
            print(row, flush=True)
    verdicts._within = within
    append(args.out, found)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
