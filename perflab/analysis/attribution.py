"""Why a point moved: its operators, kernels and phases judged one by one, by the point's model.

A point measured with ``bench.profile=true`` has, per process, the time each operator took in
the profiled pass (``perflab.measure.operators``). For a point judged FAIL (or significantly
faster), each operator is a point of its own: its figure per process is its self time per
measured call, and its change, interval and p-value come from ``replicates.change`` (the
process the replicate, paired where ``perflab ab`` paired the processes, against the same floor
with one process a side); Benjamini-Hochberg (``stats.fdr``) over the point's operators keeps
the chance of naming an unchanged one at alpha. An operator profiled in every process of one
side and in none of the other ``appeared`` (a fusion broken, a new copy, a cast) or
``disappeared``, named as such where it takes at least ``MIN_SHARE`` of a profiled call. An
operator called a different number of times per measured call, the same in every process of a
side (a count, exact: no noise to judge), is named ``more calls`` / ``fewer calls`` where its
time alone is not significant (a graph break's second compiled region, a cast per layer) and it
takes ``MIN_SHARE`` of a profiled call (``aten::resolve_conj``, a call a matrix product with an
``out=``, is not named).

The moved ones are ordered by their share of the point's change (the change of the profiled
call's wall time, geometric means of the processes). One slower or faster by less than
``MIN_PART`` of that change (a side effect: a new copy evicts the next op's data) is ``minor``:
counted, not named. What the ops and kernels judged do not add up to is ``unexplained``. Ranges
(``record_function``: perflab's phases, a user's own, a compiled region) hold their children's
time: judged and shown, never added to the explained. A compiled region that appears,
disappears or is called more or fewer times (a graph break: a second region, a second Dynamo
cache lookup) is named first: the ops' changes follow from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from perflab.analysis.replicates import FLOOR_CV, Measured, change
from perflab.analysis.stats import ALPHA, fdr
from perflab.analysis.verdicts import Verdict
from perflab.measure.operators import COMPILED_REGION

MIN_SHARE = 0.01  # an operator that appears, disappears or is called more under 1 % of a profiled call: not named
MIN_PART = 0.05  # a slower or faster one whose time moved under 5 % of the point's change: minor, counted, not named
TOP = 5  # moved operators shown in a line (all of them in JSON)
MOVED = ("slower", "faster", "appeared", "disappeared", "more calls", "fewer calls")
NO_OPERATORS = "no operators.csv for its rows: measure both sides with bench.profile=true (or perflab ab --why)"


@dataclass
class Attribution:
    """One point's operators that moved (``moved``: a frame, best explanation first), the
    point's change in seconds per call in the profiled pass, what the moved ops and kernels
    leave of it, and what the profiled pass cost against the timed one (x)."""

    moved: pd.DataFrame
    change_s: float
    unexplained_s: float
    cost_x: float
    notes: list[str] = field(default_factory=list)
    minor: int = 0  # judged slower or faster, but under MIN_PART of the point's change each

    @property
    def unexplained_pct(self) -> float:
        """What is left, in percent of the point's change."""
        return 100 * self.unexplained_s / self.change_s if self.change_s else math.nan

    def line(self, top: int = TOP) -> str:
        """``aten::gelu +26 % (+18..+35, slower); aten::copy_ appeared; unexplained 4 %``."""
        parts = [_said(r) for r in self.moved.head(top).to_dict("records")]
        if len(self.moved) > top:
            parts.append(f"{len(self.moved) - top} more")
        if self.minor:
            parts.append(f"{self.minor} minor (under {100 * MIN_PART:.0f} % of the change each)")
        if not parts:
            parts.append("no operator changed beyond alpha")
        if math.isfinite(self.unexplained_pct):
            parts.append(f"unexplained {self.unexplained_pct:.0f} %")
        return "; ".join(parts)

    def records(self) -> dict[str, Any]:
        """For JSON: the moved operators and the rest, plain values."""
        finite = self.moved.astype(object).where(self.moved.map(_finite_or_text), None)  # JSON has no NaN or inf
        moved = finite.to_dict("records")
        return {
            "moved": moved,
            "change_s": _plain(self.change_s),
            "unexplained_s": _plain(self.unexplained_s),
            "unexplained_pct": _plain(self.unexplained_pct),
            "minor": self.minor,
            "profile_cost_x": _plain(self.cost_x),
        }


def _finite_or_text(v: object) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


def _plain(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _said(r: dict[str, Any]) -> str:
    name = r["operator"] + (f" [{r['kind']}]" if r["kind"] != "op" else "")
    if r["verdict"] in ("appeared", "disappeared"):
        return f"{name} {r['verdict']} ({1e6 * (r['new_s'] - r['base_s']):+.3g} us)"
    calls = f", calls {r['calls']}" if isinstance(r.get("calls"), str) else ""
    interval = f"{100 * (r['ci_low'] - 1):+.0f}..{100 * (r['ci_high'] - 1):+.0f}"
    return f"{name} {r['change_pct']:+.0f} % ({interval}, {r['verdict']}{calls})"


def attribute(
    base: pd.DataFrame,
    new: pd.DataFrame,
    *,
    alpha: float = ALPHA,
    floor: float = FLOOR_CV,
    paired: bool = False,
) -> Attribution:
    """Judge one point's operators: ``base`` and ``new`` are its operator lines
    (``perflab.results.load_operators``' rows of the point's rows on each side)."""
    key = ["operator", "kind", "device"]
    a, b = _by_process(base), _by_process(new)
    wall_a, wall_b = _geomean(a["profiled_s"]), _geomean(b["profiled_s"])
    timed_a, timed_b = _geomean(a["median_s"]), _geomean(b["median_s"])
    cost = float(np.nanmean([wall_a / timed_a, wall_b / timed_b]))
    change_s = wall_b - wall_a
    figures_a, figures_b = _figures(base, a.index, key), _figures(new, b.index, key)
    names = sorted(set(figures_a.columns) | set(figures_b.columns))
    lines = []
    for name in names:
        fa = figures_a[name] if name in figures_a else pd.Series(np.nan, index=a.index)
        fb = figures_b[name] if name in figures_b else pd.Series(np.nan, index=b.index)
        line = dict(zip(key, name))
        line.update(base_s=_geomean(fa), new_s=_geomean(fb), base_processes=int(fa.notna().sum()))
        line["new_processes"] = int(fb.notna().sum())
        if fa.notna().all() and fb.isna().all() or fa.isna().all() and fb.notna().all():
            gone = fb.isna().all()
            line["verdict"] = "disappeared" if gone else "appeared"
            line["base_s"], line["new_s"] = (line["base_s"], 0.0) if gone else (0.0, line["new_s"])
            share = max(line["base_s"] / wall_a, line["new_s"] / wall_b)
            if share < MIN_SHARE:
                continue
        elif fa.notna().any() and fb.notna().any():
            c = change(_measured(fa, a), _measured(fb, b), level=alpha, floor=floor, paired=paired)
            line.update(change_pct=100 * (c.ratio - 1), ci_low=c.ci_low, ci_high=c.ci_high, p_value=c.p_value)
            ca, cb = _calls(base, name, key), _calls(new, name, key)
            if ca is not None and cb is not None and ca != cb:  # counted, not timed: exact in every process
                line["calls"] = f"{ca:g} -> {cb:g}"
                if max(line["base_s"] / wall_a, line["new_s"] / wall_b) >= MIN_SHARE:
                    line["verdict"] = "more calls" if cb > ca else "fewer calls"
        lines.append(line)
    table = pd.DataFrame(lines, columns=[*key, "base_s", "new_s", "change_pct", "ci_low", "ci_high", "p_value"])
    for extra in ("verdict", "calls", "base_processes", "new_processes"):
        table[extra] = [line.get(extra) for line in lines]
    table["p_adjusted"] = fdr(table["p_value"].to_numpy(float))
    judged = table["p_adjusted"] < alpha
    table.loc[judged, "verdict"] = np.where(table.loc[judged, "change_pct"] > 0, "slower", "faster")
    table["delta_s"] = table["new_s"].fillna(0) - table["base_s"].fillna(0)
    table["share_of_change"] = table["delta_s"] / change_s if change_s else math.nan
    # a real change that moved the point little (a side effect: a copy that evicts the next
    # op's data) is not where the user's hour should go: counted, not named
    timed = table["verdict"].isin(("slower", "faster"))
    table.loc[timed & (table["share_of_change"].abs() < MIN_PART), "verdict"] = "minor"
    moved = table[table["verdict"].isin(MOVED)]
    # a compiled region come or gone (or called more: a graph break) first, as what the rest
    # follows from; then ops and kernels, the largest share of the point's change first (in its
    # own direction; no change: the largest); then the ranges that hold them
    order = moved["delta_s"] / change_s if math.isfinite(change_s) and change_s else moved["delta_s"].abs()
    region = moved["operator"].str.startswith(COMPILED_REGION) & ~moved["verdict"].isin(("slower", "faster"))
    rank = np.where(region, 0, np.where(moved["kind"] == "range", 2, 1))
    moved = moved.iloc[np.lexsort((-order.to_numpy(float), rank))]
    explaining = "kernel" if (table["kind"] == "kernel").any() else "op"
    counted = table[table["verdict"].isin((*MOVED, "minor")) & (table["kind"] == explaining)]
    minor = int(((table["verdict"] == "minor") & (table["kind"] != "range")).sum())
    unexplained = change_s - float(counted["delta_s"].sum())
    return Attribution(moved.reset_index(drop=True), change_s, unexplained, cost, minor=minor)


def _calls(lines: pd.DataFrame, name: tuple, key: list[str]) -> float | None:
    """An operator's calls per measured call where every process of a side made the same (else None)."""
    calls = lines.loc[(lines[key] == pd.Series(name, index=key)).all(axis=1), "calls"].unique()
    return float(calls[0]) if len(calls) == 1 else None


def _by_process(lines: pd.DataFrame) -> pd.DataFrame:
    """One line per row (a process): its profiled and timed seconds per call, its process number."""
    return lines.groupby("row_id", sort=True)[["profiled_s", "median_s", "process"]].first()


def _figures(lines: pd.DataFrame, rows: pd.Index, key: list[str]) -> pd.DataFrame:
    """Each operator's self seconds per measured call, a column per operator, a row per process."""
    wide = lines.pivot_table(index="row_id", columns=key, values="self_s", aggfunc="sum")
    wide = wide.reindex(rows)
    return wide.where(wide > 0)


def _measured(figures: pd.Series, rows: pd.DataFrame) -> Measured:
    """An operator's per-process figures as replicates.Measured (its ids the process numbers)."""
    kept = figures.dropna()
    ids = rows.loc[kept.index, "process"].astype("string").fillna("").tolist()
    ids = ids if all(ids) and len(set(ids)) == len(ids) else []
    values = kept.to_numpy(float)
    return Measured(pd.DataFrame(), float(np.median(values)), np.array([]), [], [], values, ids)


def _geomean(values: pd.Series) -> float:
    x = pd.to_numeric(values, errors="coerce").to_numpy(float)
    x = x[np.isfinite(x) & (x > 0)]
    return float(np.exp(np.log(x).mean())) if len(x) else math.nan


# --- a comparison's points ----------------------------------------------------------------------


def wanted(point: dict[str, Any] | pd.Series, *, faster: bool = True, every: bool = False) -> bool:
    """A point to explain: FAIL, or significantly faster (``faster``), or any point judged (``every``)."""
    verdict = point.get("verdict")
    if not isinstance(verdict, str):
        return False
    improved = faster and bool(point.get("significant")) and (point.get("speedup") or 0) > 1
    return every or verdict == Verdict.FAIL.value or improved


def explain(
    table: pd.DataFrame,
    base: str | Path | Sequence[str | Path],
    new: str | Path | Sequence[str | Path],
    *,
    alpha: float = ALPHA,
    floor: float | None = None,
    paired: bool = False,
    every: bool = False,
) -> pd.DataFrame:
    """``table`` (``comparison.ab``'s, with its ``_base_ids``/``_new_ids``) with ``why_moved``
    (the line) and ``_moved`` (the Attribution) on each point ``wanted``; ``base`` and ``new``:
    where each side's operators.csv are (its trees, or profiled trees of the same points)."""
    from perflab.results import load_operators

    out = table.copy()
    if out.empty or "verdict" not in out or "_base_ids" not in out:
        return out
    ops_a, ops_b = (load_operators(*([x] if isinstance(x, (str, Path)) else x)) for x in (base, new))
    lines: list[str | None] = []
    moved: list[Attribution | None] = []
    for _, point in out.iterrows():
        if not wanted(point, every=every):
            lines.append(None)
            moved.append(None)
            continue
        a = ops_a[ops_a["row_id"].isin(point["_base_ids"])]
        b = ops_b[ops_b["row_id"].isin(point["_new_ids"])]
        if a.empty or b.empty:
            lines.append(NO_OPERATORS)
            moved.append(None)
            continue
        found = attribute(a, b, alpha=alpha, floor=FLOOR_CV if floor is None else floor, paired=paired)
        lines.append(found.line())
        moved.append(found)
    out["why_moved"] = lines
    out["_moved"] = moved
    return out
