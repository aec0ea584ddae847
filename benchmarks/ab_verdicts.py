"""How often the A/B gate is right: A/A pairs and A/B pairs with an injected slowdown, on a quiet
machine and beside a busy neighbour, perflab's verdicts beside asv's and pytest-benchmark's rules.

Each pair is two real trees of ``quick/matmul`` (``OMP_NUM_THREADS=1``, ``bench.repeats``), each
measured in ``--processes`` fresh processes, interleaved A B A B (``perflab.job.processes``). The
A/B pairs are the same trees with NEW's times (rows and raw samples) multiplied by 1.05, 1.1,
1.2 and 1.5: the slowdown is exact and the variation between and within processes is the
machine's own. Judged at the gate (``--gate``, 10 % by default) by:

- ``perflab K``: ``perflab compare`` on all K processes a side;
- ``perflab 1``: ``perflab compare`` on process 1 alone (judged against a floor: ``--process-cv``,
  else 10 %; no cache is kept between comparisons any more: see docs/compare.md);
- ``asv``: slower by more than its factor (1.1 at a 10 % gate), with a Mann-Whitney p < 0.05 on the pooled samples
  (asv compares its samples too; its own statistics differ in detail);
- ``pytest-benchmark``: ``--benchmark-compare-fail=median:GATE%`` on process 1's samples.

``--busy`` runs a CPU-burning neighbour process meanwhile; ``--ab N`` also runs N A/A and N
A/B ``perflab ab --budget MINUTES`` runs (the A/B side does real extra work:
``experiment.iterations`` 10 against 11, judged by ``median_s``) and writes their verdicts and
processes a side (``ab_processes``). With ``--instructions`` those runs count instructions
(``bench.instructions=true``, ``experiment.size=64``, ``--metric instructions``, one process a
side at the first look): exact, so the load does not move them, and judged within
``verdicts.EXACT_TOLERANCE_PCT`` whatever the gate (``--pairs 0`` runs only them). A
FAIL needs the change estimated beyond the gate, so a slowdown the size of the gate is caught
about half the time at best: a 10 % slowdown is caught reliably by a smaller gate (``--gate 5``).

Goals (issue 29): A/A false FAIL <= 5 % of pairs in both settings; 10 % slowdowns caught
>= 90 % quiet; with ``perflab ab --budget 5``, <= 20 % of A/A runs undecided beside the busy
neighbour.

    python benchmarks/ab_verdicts.py [--pairs 4] [--processes 3] [--repeats 30] [--busy] [--ab 0]
                                     [--instructions] [--budget 5] [--gate 10]
                                     [--out benchmarks/results/ab_verdicts.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from _neighbours import spinning

SLOWDOWNS = (1.0, 1.05, 1.10, 1.20, 1.50)
GATE = 10.0
JOB = ["+experiment=quick/matmul", "results.table=false"]
ENV = {"OMP_NUM_THREADS": "1"}
# perflab ab's A/B runs: 10 % more work a call, a real slowdown (judged by the time of a call)
AB_SLOWER = ["--base", "experiment.iterations=10", "--new", "experiment.iterations=11"]
# ... judged by the time of a call, or (--instructions) by the instructions it executes, one process a side
BY_TIME = ["--metric", "median_s"]
BY_INSTRUCTIONS = ["bench.instructions=true", "experiment.size=64", "--metric", "instructions", "--min-processes", "1"]


def measure_pair(root: Path, processes: int, repeats: int) -> tuple[Path, Path]:
    """Two trees of the same job, their processes interleaved A B A B."""
    from perflab.job.processes import run_one

    trees = root / "base", root / "new"
    for k in range(1, processes + 1):
        for tree in trees:
            args = [*JOB, f"results.store={tree}", f"bench.repeats={repeats}"]
            code = run_one(args, process=k, env=ENV, quiet=True)
            if code:
                raise SystemExit(f"perflab exited {code} measuring {tree} (process {k})")
    return trees


def slowed(tree: Path, factor: float, out: Path) -> Path:
    """A copy of ``tree`` whose times are ``factor`` x longer (rates 1 / factor), rows and samples."""
    shutil.copytree(tree, out, ignore=shutil.ignore_patterns(".perflab"))
    for csv in out.rglob("results.csv"):
        rows = pd.read_csv(csv)
        for column in ("median_s", "mean_s", "min_s", "max_s", "std_s", "iqr_s"):
            if column in rows:
                rows[column] *= factor
        for column in ("tflops", "gbps", "items_per_s"):
            if column in rows:
                rows[column] /= factor
        rows.to_csv(csv, index=False)
    for csv in out.rglob("samples.csv"):
        samples = pd.read_csv(csv)
        samples["seconds"] *= factor
        samples.to_csv(csv, index=False)
    return out


def pooled(tree: Path, process: int | None = None) -> np.ndarray:
    from perflab.analysis.replicates import samples_by_row
    from perflab.results import load

    rows = load(tree)
    if process is not None:
        rows = rows[rows["process"] == process]
    samples = samples_by_row([tree])
    return np.concatenate([samples[str(r)] for r in rows["row_id"] if str(r) in samples])


def verdicts(base: Path, new: Path, gate: float) -> dict[str, str]:
    """Each judge's word on one pair at the ``gate`` (percent slower): FAIL, PASS, or UNDECIDED."""
    from scipy import stats

    from perflab import compare

    out = {}
    for name, where in (("perflab K", []), ("perflab 1", ["process=1"])):
        table = compare.ab(base, new, where=where, gate_pct=gate)
        code = compare.verdict_of(table)
        out[name] = {0: "PASS", 1: "FAIL"}.get(code, "UNDECIDED")
    a, b = pooled(base), pooled(new)
    slower = np.median(b) / np.median(a) > 1 + gate / 100
    p = stats.mannwhitneyu(a, b, alternative="two-sided").pvalue
    out["asv"] = "FAIL" if slower and p < 0.05 else "PASS"
    a1, b1 = pooled(base, 1), pooled(new, 1)
    out["pytest-benchmark"] = "FAIL" if np.median(b1) > (1 + gate / 100) * np.median(a1) else "PASS"
    return out


def ab_runs(n: int, budget: float, root: Path, repeats: int, gate: float, judge: list[str]) -> list[dict[str, object]]:
    """``n`` A/A and ``n`` A/B ``perflab ab --budget`` runs, interleaved: the A/B side does real
    extra work (``experiment.iterations`` 10 against 11: 10 % more matmuls a call), judged as
    ``judge`` says (``BY_TIME``, ``BY_INSTRUCTIONS``). Each run's verdict and processes a side."""
    found: list[dict[str, object]] = []
    for i in range(n):
        for slowdown, sides in ((0, []), (10, AB_SLOWER)):
            args = [sys.executable, "-m", "perflab", "ab", *JOB, f"bench.repeats={repeats}", *judge, *sides]
            args += ["--budget", str(budget), "--fail-if-slower", str(gate), "--format", "json"]
            args += ["--out", str(root / f"ab{i}-{slowdown}")]
            ran = subprocess.run(args, env={**os.environ, **ENV}, capture_output=True, text=True)
            try:
                points = json.loads(ran.stdout)["points"]
            except (ValueError, KeyError):
                points = []
            found.append(
                {
                    "pair": i,
                    "slowdown_pct": slowdown,
                    "verdict": {0: "PASS", 1: "FAIL", 3: "UNDECIDED"}.get(ran.returncode, f"exit {ran.returncode}"),
                    "ab_processes": max((int(p.get("base_processes") or 0) for p in points), default=0),
                }
            )
            print(f"perflab ab {i + 1} of {n}, +{slowdown} %: {found[-1]['verdict']}", file=sys.stderr, flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4, help="0: only the --ab runs")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--busy", action="store_true", help="beside a CPU-burning neighbour")
    parser.add_argument("--ab", type=int, default=0, help="also this many A/A and A/B (+10 %%) perflab ab runs")
    parser.add_argument("--instructions", action="store_true", help="the --ab runs judged on instructions")
    parser.add_argument("--gate", type=float, default=GATE, help="every judge's gate, percent slower")
    parser.add_argument("--budget", type=float, default=5.0, help="perflab ab --budget MINUTES")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ab_verdicts.csv"))
    args = parser.parse_args()
    if args.pairs < 0 or args.ab < 0 or not args.pairs + args.ab:
        parser.error(f"--pairs {args.pairs} --ab {args.ab}: allowed: integers >= 0, not both 0")
    setting = "busy neighbour" if args.busy else "no neighbour"  # the machine itself may be busy: see load
    found = []
    with tempfile.TemporaryDirectory() as scratch, spinning(int(args.busy)):
        load = os.getloadavg()[0]
        for i in range(args.pairs):
            base, new = measure_pair(Path(scratch) / f"pair{i}", args.processes, args.repeats)
            for factor in SLOWDOWNS:
                judged = new if factor == 1.0 else slowed(new, factor, Path(scratch) / f"pair{i}-x{factor}")
                for judge, word in verdicts(base, judged, args.gate).items():
                    found.append(
                        {
                            "setting": setting,
                            "pair": i,
                            "slowdown_pct": round(100 * (factor - 1)),
                            "judge": judge,
                            "verdict": word,
                        }
                    )
            print(f"pair {i + 1} of {args.pairs} judged", file=sys.stderr, flush=True)
        by = BY_INSTRUCTIONS if args.instructions else BY_TIME
        runs = ab_runs(args.ab, args.budget, Path(scratch), args.repeats, args.gate, by)
        load = max(load, os.getloadavg()[0])
    judge = f"perflab ab --budget {args.budget:g}" + (" --metric instructions" if args.instructions else "")
    found += [{"setting": setting, "judge": judge, **r} for r in runs]  # beside the pairs' verdicts
    table = pd.DataFrame(found)
    summary = table.pivot_table(
        index=["setting", "slowdown_pct"],
        columns="judge",
        values="verdict",
        aggfunc=lambda v: f"{(v == 'FAIL').sum()}/{len(v)} FAIL, {(v == 'UNDECIDED').sum()} undecided",
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table = table.assign(
        load=load, processes=args.processes if args.pairs else None, repeats=args.repeats, gate=args.gate
    )
    table.to_csv(args.out, index=False)
    side = f"{args.processes} processes a side, bench.repeats={args.repeats}"
    print(f"{setting}, load up to {load:.1f}, {args.pairs} pairs, {side}")
    print(summary.to_string())
    for slowdown in (0, 10):
        words = [str(r["verdict"]) for r in runs if r["slowdown_pct"] == slowdown]
        if words:
            reached = [int(str(r["ab_processes"])) for r in runs if r["slowdown_pct"] == slowdown]
            print(
                f"{judge} --fail-if-slower {args.gate:g}, +{slowdown} %: {words.count('FAIL')} FAIL, "
                f"{words.count('UNDECIDED')} undecided of {len(words)} (processes a side: {reached})"
            )
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
