"""Compare results: within one tree, or two trees A/B.

    perflab compare PATH [--by KEY ...] [--baseline KEY=VALUE] [--plot DIR]
    perflab compare BASE NEW [--fail-if-slower PCT]

What the tables hold, the verdicts and the exit codes: docs/compare.md (the tables are
``perflab.analysis.comparison``'s, the verdict rule ``perflab.analysis.verdicts``'); this module
is their command line and output.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from perflab.analysis import verdicts
from perflab.analysis.comparison import (  # noqa: F401  (perflab.compare.ab, .select ... are documented imports)
    CompareError,
    ab,
    compare,
    figures,
    plain_text,
    select,
)
from perflab.analysis.replicates import FLOOR_CV, measured, samples_by_row  # noqa: F401  (.measured: documented)
from perflab.analysis.stats import ALPHA, MIN_SAMPLES
from perflab.analysis.verdicts import (
    DEFAULT_GATE_PCT,
    PASS_EXIT,
    UNJUDGED_EXIT,
    USAGE_EXIT,
    Verdict,
    exit_code,
    judging,
    meaning,
)
from perflab.config import registry
from perflab.config.schema import ResultsConfig
from perflab.errors import ConfigError, OneLineParser
from perflab.moved import forward
from perflab.results import load
from perflab.store import files
from perflab.store.columns import higher_is_better, unit_of

# Names this module re-exported before 0.5.0 that it does not use (dashboard_name, is_value, Measured,
# metric_for, summary_rows, UNUSABLE_SAMPLES): the old import works until 0.6.0, warning with their home
# (replicates first: comparison imports some of its names).
__getattr__ = forward(__name__, ["perflab.analysis.replicates", "perflab.analysis.comparison"], dropped_in="0.6.0")


def verdict_of(table: pd.DataFrame) -> int:
    """The exit code of an A/B table: its points' verdicts, and any point the new tree lost."""
    verdicts = [Verdict(v) for v in table.get("verdict", pd.Series(dtype=str)).dropna()]
    code = exit_code(verdicts)
    lost = "change" in table and (table["change"] == "only in base").any()
    return UNJUDGED_EXIT if code == PASS_EXIT and lost else code


# --- output -------------------------------------------------------------------------------------


def to_markdown(df: pd.DataFrame, every: bool = False) -> str:
    """The table a person reads (:func:`perflab.analysis.table.markdown`; ``every``: all its columns)."""
    from perflab.analysis import table

    return table.markdown(df, every)


def number(ok: Callable[[float], bool], allowed: str) -> Callable[[str], float]:
    """An argparse type: a number ``ok`` takes (text that is no number reads as nan)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r}: allowed: {allowed}")
        return value

    return parse


percent = number(lambda v: math.isfinite(v) and v >= 0, "a number >= 0 (percent)")  # nan: a CI gate quietly off
probability = number(lambda v: 0 < v < 1, "a number between 0 and 1, e.g. 0.05")  # --alpha
cv_pct = number(lambda v: math.isfinite(v) and v > 0, "a percentage > 0, e.g. 2")  # --process-cv


def to_json(table: pd.DataFrame, *, two_trees: bool, code: int | None = None, gate: bool = False) -> str:
    """The table as JSON for CI dashboards: ``{"rows": [...], "notes": [...]}`` for one tree;
    for two, ``{"verdict", "exit_code", "gate_pct", "gate_given", "alpha", "meaning", "points",
    "only_in_base", "only_in_new", "notes"}``, each point with its verdict and why."""
    import json

    visible = table.drop(columns=[c for c in table.columns if c.startswith("_")])
    records = [{k: _json_value(v) for k, v in r.items() if not _absent(v)} for r in visible.to_dict("records")]
    notes = table.attrs.get("notes", [])
    if not two_trees:
        return json.dumps({"rows": records, "notes": notes}, indent=1, allow_nan=False)
    if "_moved" in table:  # --why: each explained point's operators, structured
        for record, found in zip(records, table["_moved"]):
            if found is not None:
                record.update(found.records())
    judged = [r for r in records if "verdict" in r]
    gate_pct, alpha = table.attrs.get("gate_pct", DEFAULT_GATE_PCT), table.attrs.get("alpha", ALPHA)
    exit_ = verdict_of(table) if code is None else code
    out = {
        "verdict": verdicts.json_verdict(exit_, [str(r.get("verdict")) for r in judged]),
        "exit_code": exit_,
        "gate_pct": gate_pct,
        "gate_given": gate,
        "alpha": alpha,
        "meaning": meaning(gate_pct, alpha, gate),
        "points": judged,
        "only_in_base": [r for r in records if r.get("change") == "only in base"],
        "only_in_new": [r for r in records if r.get("change") == "only in new"],
        "notes": notes,
    }
    return json.dumps(out, indent=1, allow_nan=False)


def _absent(v: object) -> bool:
    """An empty cell: left out of a JSON record."""
    return v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and math.isnan(v))


def _json_value(v: object) -> object:
    """A cell as a valid JSON value: numbers as numbers, an infinite one as null (JSON has no
    infinity: ``detectable_pct`` null means no change was detectable), the rest as text."""
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v if v is None or isinstance(v, (int, float, bool, str)) else str(v)


def to_github(table: pd.DataFrame) -> str:
    """The values (NEW's, for two trees) in github-action-benchmark's shape: one list for
    ``tool: customBiggerIsBetter`` and one for ``customSmallerIsBetter``, under those keys (each
    list goes to its own file: ``jq .customBiggerIsBetter``). ``range`` is the IQR of the raw
    samples; for two trees ``verdict`` (PASS, FAIL, INCONCLUSIVE, INCOMPARABLE) and ``extra``,
    the verdict and why, which the action shows in its chart's tooltip."""
    import json

    out: dict[str, list[dict[str, Any]]] = {"customBiggerIsBetter": [], "customSmallerIsBetter": []}
    for _, r in table.iterrows():
        metric = str(r.get("metric"))
        value = r.get("new") if "new" in table else r.get(metric)
        if value is None or pd.isna(value):
            continue
        name = r.get("_name")
        if not isinstance(name, str):
            parts = [str(r["experiment"]), str(r["measurement"])]
            parts += [f"{c.removeprefix('cfg.')}={plain_text(r[c])}" for c in table.columns if c.startswith("cfg.")]
            name = " / ".join(parts)
        entry: dict[str, Any] = {"name": name, "unit": unit_of(metric) or metric, "value": float(value)}
        samples = r.get("_samples")
        if isinstance(samples, np.ndarray) and len(samples) >= MIN_SAMPLES:
            q1, q3 = np.percentile(samples, [25, 75])
            entry["range"] = f"{q1:.4g} to {q3:.4g}"
        if "verdict" in table and isinstance(r.get("verdict"), str):
            entry["verdict"] = r["verdict"]  # the field a gate reads (jq '.[][] | .verdict')
            entry["extra"] = f"{r['verdict']}: {r.get('why', '')}"
            if isinstance(r.get("why_moved"), str):  # --why: what moved, in the tooltip too
                entry["extra"] += f"; moved: {r['why_moved']}"
        out["customBiggerIsBetter" if higher_is_better(metric) else "customSmallerIsBetter"].append(entry)
    return json.dumps(out, indent=1)


PROG = "perflab compare"  # how its lines start (``python -m perflab.compare`` is the same command)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit codes are perflab.analysis.verdicts' (0 pass, 1 fail, 2 usage, 3 not
    judged): a crash is 3 in one line, never 1, which means FAIL."""
    return judging(PROG, lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths",
        nargs="*",
        default=[ResultsConfig.store],
        help=f"one results tree (or run/sweep dir, or CSV), or BASE NEW (default: {ResultsConfig.store})",
    )
    parser.add_argument("--by", nargs="+", help="config keys to compare over (default: the ones that vary)")
    parser.add_argument("--baseline", help="KEY=VALUE the others are compared with, e.g. devices.count=1")
    parser.add_argument("--metric", help="column to compare (default: each experiment's own)")
    parser.add_argument("--experiment", help="only this experiment")
    parser.add_argument(
        "--where", action="append", default=[], help="KEY=VALUE: only these rows; KEY!=VALUE: all but (repeatable)"
    )
    parser.add_argument(
        "--fail-if-slower",
        type=percent,
        metavar="PCT",
        help=f"BASE NEW: the gate: FAIL beyond PCT %% slower (default {DEFAULT_GATE_PCT:g})",
    )
    parser.add_argument("--alpha", type=probability, default=ALPHA, help="BASE NEW: false discovery rate (0.05)")
    parser.add_argument(
        "--process-cv",
        type=cv_pct,
        metavar="PCT",
        help="BASE NEW: between-process variation assumed with one process a side "
        f"(default: as the trees' points of 2+ processes measured it; else {100 * FLOOR_CV:g})",
    )
    parser.add_argument("--any-device", action="store_true", help="BASE NEW: match points across devices")
    parser.add_argument(
        "--allow-mixed", action="store_true", help="BASE NEW: judge points whose machine identity differs"
    )
    parser.add_argument(
        "--why",
        action="store_true",
        help="BASE NEW: name the operators, kernels and phases that moved in each FAIL (or faster) point, "
        "each with its own verdict (rows measured with bench.profile=true)",
    )
    parser.add_argument("--plot", type=Path, help="write PNG plots into this folder")
    parser.add_argument("--format", choices=("md", "csv", "json", "github"), default="md")
    parser.add_argument("--all-columns", action="store_true", help="md: every column (csv and json have them all)")
    args = parser.parse_args(argv)
    if len(args.paths) > 2:
        parser.error("give one results tree, or two (BASE NEW)")
    two = len(args.paths) == 2
    gate = args.fail_if_slower if args.fail_if_slower is not None else DEFAULT_GATE_PCT
    try:
        if args.plot is not None:  # before any work: a file or a device there is refused in one line
            files.check_dir("--plot", args.plot)
        if two and (args.baseline or args.by):
            one_tree = "--baseline" if args.baseline else "--by"
            raise CompareError(f"{one_tree} compares within one tree; allowed: one PATH with {one_tree}")
        if two:
            table = ab(
                *args.paths,
                metric=args.metric,
                experiment=args.experiment,
                where=args.where,
                any_device=args.any_device,
                gate_pct=gate,
                alpha=args.alpha,
                allow_mixed=args.allow_mixed,
                process_cv=None if args.process_cv is None else args.process_cv / 100,
            )
            if args.why:
                from perflab.analysis import attribution

                floor = None if args.process_cv is None else args.process_cv / 100
                table = attribution.explain(table, args.paths[0], args.paths[1], alpha=args.alpha, floor=floor)
        else:
            for flag, given in (
                ("--why", args.why),
                ("--fail-if-slower", args.fail_if_slower is not None),
                ("--allow-mixed", args.allow_mixed),
                ("--process-cv", args.process_cv is not None),
            ):
                if given:
                    raise CompareError(f"{flag} compares two trees: BASE NEW")
            table = compare(
                args.paths[0],
                by=args.by,
                baseline=args.baseline,
                metric=args.metric,
                experiment=args.experiment,
                where=args.where,
            )
    except (CompareError, FileNotFoundError, ConfigError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return USAGE_EXIT
    except registry.ExperimentError as err:  # an experiment of the tree whose module does not import here
        print(f"{PROG}: error: {err.line()}", file=sys.stderr)
        return USAGE_EXIT
    code = verdict_of(table) if two else PASS_EXIT
    show(table, args.format, two=two, code=code, gate=args.fail_if_slower, every=args.all_columns)
    if args.plot:
        from perflab.analysis import plots

        rows = select(load(args.paths[-1]), args.experiment, args.where)
        try:
            written = plots.write(
                figures(rows, samples_by_row(args.paths[-1:], row_ids=rows["row_id"])), rows, args.plot
            )
        except ConfigError as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return USAGE_EXIT
        for line in written:
            print(line, file=sys.stderr if args.format in ("json", "github") else sys.stdout)
    if two:
        verdict_lines(table, args.format, code=code, gate=args.fail_if_slower, alpha=args.alpha)
    return code


def show(table: pd.DataFrame, fmt: str, *, two: bool, code: int, gate: float | None, every: bool = False) -> None:
    """The table in ``fmt`` (md, csv, json, github) on stdout, notes after md and csv; md shows
    the reader's columns, or ``every`` one."""
    if fmt == "json":
        print(to_json(table, two_trees=two, code=code, gate=gate is not None))
    elif fmt == "github":
        print(to_github(table))
    else:
        visible = table.drop(columns=[c for c in table.columns if c.startswith("_")])
        shown = table.drop(columns=["why_moved"]) if fmt == "md" and "why_moved" in table else table
        print(to_markdown(shown, every) if fmt == "md" else visible.to_csv(index=False), end="\n")
        for note in table.attrs.get("notes", []):
            print(f"note: {note}")
        if fmt == "md":
            for line in why_lines(table):
                print(line)


def why_lines(table: pd.DataFrame) -> list[str]:
    """``why <point>: <what moved>`` for each point explained (``--why``), with what profiling cost."""
    if "why_moved" not in table:
        return []
    out = []
    for _, r in table[table["why_moved"].notna()].iterrows():
        found = r.get("_moved")
        cost = f" (profiled pass {found.cost_x:.2g}x the timed one)" if found is not None else ""
        out.append(f"why {r.get('_name')} {r.get('verdict')}: {r['why_moved']}{cost}")
    return out


def verdict_lines(
    table: pd.DataFrame, fmt: str, *, code: int, gate: float | None, alpha: float, prog: str = PROG
) -> None:
    """What a PASS means, and the one summary line with the exit code (compare and ab alike)."""
    pct = DEFAULT_GATE_PCT if gate is None else gate
    print(meaning(pct, alpha, gate is not None), file=sys.stderr if fmt in ("json", "github", "csv") else sys.stdout)
    print(f"{prog}: {summary(table)} -> exit {code}", file=sys.stderr)
    slow = int((table["verdict"] == Verdict.FAIL.value).sum()) if "verdict" in table else 0
    if slow:
        print(f"{prog}: {slow} point(s) significantly slower than the base by more than {pct:g}%", file=sys.stderr)


def summary(table: pd.DataFrame) -> str:
    """``3 points: 2 PASS, 1 INCONCLUSIVE; 1 only in base``: what an A/B comparison found."""
    counts = table["verdict"].value_counts() if "verdict" in table else pd.Series(dtype=int)
    parts = [f"{int(counts[v.value])} {v.value}" for v in Verdict if v.value in counts]
    judged = int(counts.sum())
    text = f"{judged} point{'s' if judged != 1 else ''} in both trees" + (f": {', '.join(parts)}" if parts else "")
    if "change" in table:
        for side in ("base", "new"):
            n = int((table["change"] == f"only in {side}").sum())
            if n:
                lost = " (not judged: no ok row of it in NEW)" if side == "base" else ""
                text += f"; {n} only in {side}{lost}"
    return text


if __name__ == "__main__":
    sys.exit(main())
