"""History: every (experiment, point, machine identity) series lined up by the code under test,
its change points found and labelled (docs/compare.md#history says what users see).

    perflab history PATH... [--experiment NAME] [--metric M] [--threshold PCT]
                            [--min-segment N] [--alpha A] [--format md|json]

A series is one point on one machine identity (a model folder rewritten with other contents is a
series per ``model_digest``); its x axis the subject (``results.subject``) in commit order where
git can tell, else commit time, else when first measured; its value per subject the median of the
experiment's metric over that subject's clean rows. Change points: exact PELT with the L1 cost on
the log of the values (``perflab.analysis.changepoints``), at least ``--min-segment`` subjects a
segment, so a lone spike is no change; the penalty is ``2 log(n)`` times the series' noise (the
median absolute difference of neighbouring subjects), at least 0.5 %. Each change is judged as a
local step on its subjects' per-process figures (``perflab.analysis.replicates``), labelled by
``verdicts.label_step``; exit codes are ``perflab.analysis.verdicts``'.
"""

from __future__ import annotations

import functools
import html
import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from perflab.analysis import replicates
from perflab.analysis.stats import ALPHA, fdr
from perflab.analysis.verdicts import (
    DEFAULT_STEP_PCT,
    USAGE_EXIT,
    Gate,
    StepLabel,
    history_exit_code,
    judging,
    label_step,
)
from perflab.config.schema import ResultsConfig
from perflab.errors import OneLineParser
from perflab.store.columns import higher_is_better

MIN_SEGMENT = 3
NOISE_FLOOR = 0.005  # relative: a noiseless synthetic series still needs a penalty
COMMIT = re.compile(r"^([0-9a-f]{7,40})(\+dirty)?$")


class HistoryError(ValueError):
    """A user mistake: one line, exit 2."""


@dataclass
class SubjectRows:
    """Where each subject of a series has its rows, read again only for the few subjects a change
    is judged on or names (measuring every subject's processes was most of a long history's time)."""

    frame: pd.DataFrame  # the experiment's rows: the columns a subject is measured from
    at: np.ndarray  # positions in ``frame``, subject after subject (the series' order), ascending in each
    bounds: np.ndarray  # subject k's: at[bounds[k]:bounds[k + 1]]
    kept: np.ndarray  # whether each of ``at`` is measured (its subject's clean rows, or all of one with none)
    run_dirs: np.ndarray  # each row of ``frame``'s run dir as text ("": none)
    samples: Mapping[str, np.ndarray]


@dataclass
class Series:
    """One point on one machine identity over its subjects, column by column (subject k: the
    k-th of each)."""

    experiment: str
    measurement: str
    point: dict[str, str]  # the config keys that vary between points of this experiment
    identity: dict[str, str]
    metric: str
    higher_is_better: bool
    names: list[str]  # the subjects, in order
    values: np.ndarray  # each one's: the median of the metric over its rows
    times: list[str]  # when each was first measured
    suspect: list[str]  # why each one's every row was flagged suspect ("": one of them is clean)
    rows: SubjectRows | None = None  # None: a series given by hand (no run dirs; a subject, one process of its value)

    @property
    def label(self) -> str:
        keys = ", ".join(f"{k}={v}" for k, v in self.point.items())
        return f"{self.experiment} {self.measurement}" + (f" ({keys})" if keys else "")

    def run_dirs(self, k: int) -> list[str]:
        """The run dirs that measured subject ``k``, sorted."""
        if self.rows is None:
            return []
        r = self.rows
        return sorted({d for d in r.run_dirs[r.at[r.bounds[k] : r.bounds[k + 1]]].tolist() if d})

    def measured(self, lo: int, hi: int) -> list[replicates.Measured]:
        """Subjects ``lo:hi`` as ``replicates.measured`` gives them: their processes and figures."""
        if self.rows is None:
            return [replicates.Measured(pd.DataFrame(), v, np.array([]), []) for v in self.values[lo:hi].tolist()]
        r = self.rows
        each = [r.at[a:b][r.kept[a:b]] for a, b in zip(r.bounds[lo:hi].tolist(), r.bounds[lo + 1 : hi + 1].tolist())]
        ends = np.cumsum([len(x) for x in each]).tolist()
        groups = [np.arange(a, b) for a, b in zip([0, *ends], ends)]
        frame = r.frame.iloc[np.concatenate(each)]
        return replicates.measured_each(frame, groups, self.metric, r.samples, frames=False)


@dataclass
class ChangePoint:
    series: Series
    at: int  # index of the first subject after the change
    before: float
    after: float
    p_value: float
    label: str = ""

    @property
    def change_pct(self) -> float:
        return 100 * (self.after / self.before - 1)

    def as_json(self) -> dict[str, Any]:
        s, b, a = self.series, self.at - 1, self.at
        return {
            "experiment": s.experiment,
            "measurement": s.measurement,
            "metric": s.metric,
            "before": {"subject": s.names[b], "value": self.before, "time": s.times[b], "suspect": s.suspect[b]},
            "after": {"subject": s.names[a], "value": self.after, "time": s.times[a], "suspect": s.suspect[a]},
            "change_pct": self.change_pct,
            "label": self.label,
            "run_dirs": {"before": s.run_dirs(b), "after": s.run_dirs(a)},
            "point": s.point,
        }


# --- series -------------------------------------------------------------------------------------


def build_series(
    rows: pd.DataFrame,
    samples: Mapping[str, np.ndarray],
    metric: str | None = None,
    notes: list[str] | None = None,
) -> list[Series]:
    """Every (experiment, point, identity) series of ``rows`` (ok rows only), subjects in order.
    A subject's value comes from its clean rows; a subject with none (every row flagged
    ``suspect``) keeps its rows and says why (``Series.suspect``). Rows and samples of no use
    (NaN, not a number, <= 0: ``replicates.measured``) are left out; ``notes`` gets a line saying
    so. Every subject of an experiment is valued in one pass over its rows (``values_each``)."""
    from perflab.analysis.comparison import rewritten
    from perflab.analysis.frames import device_family, identity_columns
    from perflab.analysis.replicates import metric_for, summary_rows, values_each
    from perflab.measure.environment import IDENTITY

    if rows.empty or "status" not in rows:
        return []
    rows = rows[rows["status"].astype("string") == "ok"]
    rev_list = functools.cache(_rev_list)  # git asked once, for every series
    out = []
    for name, part in rows.groupby(rows["experiment"].astype("string"), sort=True):
        # one block per dtype again (a loaded tree is fragmented); its rows' labels their positions
        part = summary_rows(str(name), part).reset_index(drop=True).copy()
        m, _ = metric_for(str(name), part, metric)
        part = part.assign(
            device=part["device_name"].map(functools.cache(device_family)) if "device_name" in part else "",
            _subject=_subjects(part),
        )
        keys = identity_columns(part)
        varying = [c for c in keys if part[c].astype("string").nunique(dropna=False) > 1]
        if "model_digest" in part and rewritten(part, keys):  # a folder rewritten: a series per contents
            keys, varying = [*keys, "model_digest"], [*varying, "model_digest"]
        ident = [c for c in IDENTITY if c in part and part[c].notna().any()]
        group = ["measurement", *keys, "device", *ident]
        frame = part.reindex(columns=list(dict.fromkeys([*part.columns, *group])))
        used = [m, "_subject", "row_id", "median_s", "suspect", "run_dir", "timestamp", "subject_time"]
        small = frame[list(dict.fromkeys(c for c in used if c in frame))]  # what a subject is measured from
        # each row's series (its positions, grouped by the point's columns), then its subject in it
        # (numbered on from the series before: every subject of the experiment one code)
        labels, positions = [], []
        by = [frame[c] for c in group]
        for key, at in pd.Series(np.arange(len(frame))).groupby(by, dropna=False, sort=True, observed=True):
            labels.append(dict(zip(group, key if isinstance(key, tuple) else (key,))))
            positions.append(at.to_numpy())
        subject, names, first = np.empty(len(frame), np.intp), [], [0]
        for at in positions:
            codes, uniques = pd.factorize(small["_subject"].to_numpy()[at])  # in the order they first appear
            subject[at] = codes + first[-1]
            names += uniques.tolist()
            first.append(len(names))
        flagged = _flagged(small)
        # a subject's suspect rows are left out where it has clean ones
        clean = np.bincount(subject[~flagged], minlength=len(names)) > 0
        kept = ~flagged | ~clean[subject]
        values, left = values_each(small, np.where(kept, subject, -1), len(names), m, samples)
        times, subject_times = (
            _least_each(_texts(part, c), subject, len(names)) for c in ("timestamp", "subject_time")
        )
        run_dirs = _texts(part, "run_dir")
        for label, at, lo, hi in zip(labels, positions, first, first[1:]):
            valued = (lo + np.flatnonzero(~np.isnan(values[lo:hi]))).tolist()  # a subject of no usable row: none
            chosen = [[x[k] for k in valued] for x in (names, times, subject_times)]
            order = subject_order(chosen[0], chosen[1], chosen[2], rev_list)
            ordered = [valued[i] for i in order.tolist()]
            r = _subject_rows(small, at, subject[at], ordered, kept, run_dirs, samples)
            series = Series(
                str(name),
                str(label["measurement"]),
                {
                    c.removeprefix("cfg."): _text(label[c])
                    for c in varying
                    if c != "model_digest" or _text(label[c])  # a series of no model folder: no digest to name
                },
                {c: _text(label[c]) for c in ident},
                m,
                higher_is_better(m),
                [names[k] for k in ordered],
                values[ordered],
                [times[k] for k in ordered],
                [
                    "" if clean[k] else _reasons(small.iloc[r.at[r.bounds[i] : r.bounds[i + 1]]])
                    for i, k in enumerate(ordered)
                ],
                r,
            )
            if left[lo:hi].any() and notes is not None:
                notes.append(
                    f"{series.label}: left out of {int(left[lo:hi].sum())} subject(s) rows or samples whose {m} "
                    "is NaN, not a number or <= 0"
                )
            if series.names:
                out.append(series)
    return out


def _subject_rows(
    frame: pd.DataFrame,
    at: np.ndarray,
    subject: np.ndarray,
    ordered: list[int],
    kept: np.ndarray,
    run_dirs: np.ndarray,
    samples: Mapping[str, np.ndarray],
) -> SubjectRows:
    """A series' rows (``at``: positions in ``frame``, ``subject``: each one's subject) subject
    after subject in the order ``ordered`` (their codes); a subject not in it (none valued) left out."""
    rank = np.full(len(kept), -1)  # codes are below the rows' count
    rank[ordered] = np.arange(len(ordered))
    of = rank[subject]
    inside = np.flatnonzero(of >= 0)
    order = inside[np.argsort(of[inside], kind="stable")]  # each subject's rows stay in their order
    bounds = np.concatenate(([0], np.cumsum(np.bincount(of[inside], minlength=len(ordered)))))
    return SubjectRows(frame, at[order], bounds, kept[at[order]], run_dirs, samples)


def _flagged(rows: pd.DataFrame) -> np.ndarray:
    """Which rows perflab flagged ``suspect`` (a busy machine, too few samples, above the peak)."""
    if "suspect" not in rows:
        return np.zeros(len(rows), bool)
    return rows["suspect"].astype("string").fillna("").str.strip().ne("").to_numpy(bool)


def _reasons(rows: pd.DataFrame) -> str:
    """The distinct reasons the rows were flagged suspect, in one line."""
    flagged = rows.loc[_flagged(rows), "suspect"] if "suspect" in rows else []
    return "; ".join(sorted({part.strip() for text in flagged for part in str(text).split(";") if part.strip()}))


def _text(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return ""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _subjects(rows: pd.DataFrame) -> pd.Series:
    """Each row's subject; a row of a run that recorded none stands for itself (its run id)."""
    subject = rows["subject"].astype("string") if "subject" in rows else pd.Series(pd.NA, index=rows.index)
    fallback = "run " + rows["run_id"].astype("string") if "run_id" in rows else pd.Series("run ?", index=rows.index)
    return subject.where(subject.notna() & (subject != ""), fallback).astype(str)


def _texts(rows: pd.DataFrame, column: str) -> np.ndarray:
    """Each row's ``column`` as text ("" where empty or absent; an array of str): a subject's run
    dirs, and its first time (the least of its rows' texts)."""
    if column not in rows:
        return np.full(len(rows), "", dtype=object)
    codes, uniques = pd.factorize(rows[column])  # each distinct value written once; empty: -1
    if isinstance(uniques, pd.DatetimeIndex) and uniques.unit != "ns":
        uniques = uniques.to_pydatetime()  # written as its Timestamp is (no nanoseconds), 5 times as fast
    return np.array([str(v) for v in uniques.tolist()] + [""], dtype=object)[codes]


def _least_each(texts: np.ndarray, codes: np.ndarray, count: int) -> list[str]:
    """The least non-empty of each group's ``texts`` ("" if none; ``codes``: each text's group,
    0 .. count - 1): a subject's first time."""
    out = np.full(count, "", dtype=object)
    at = np.flatnonzero(texts != "")
    at = at[np.lexsort((_ranks(texts[at]), codes[at]))]  # each group's texts, the least first
    first = at[np.flatnonzero(np.diff(codes[at], prepend=-1))]
    out[codes[first]] = texts[first]
    return out.tolist()


def subject_order(
    names: list[str],
    times: list[str],
    commit_times: list[str] | None = None,
    rev_list: Callable[[], list[str] | None] | None = None,
) -> np.ndarray:
    """The subjects' positions in commit order where the git repository in the working
    directory knows every commit, else by commit time where every subject has one, else by
    when each was first measured (``times``; ties in the order given). ``rev_list``: that
    repository's commits, oldest first (build_series asks git once for all its series)."""
    when = _ranks(times)
    position = _git_order(names, rev_list or _rev_list)
    if position is not None:
        dirty = np.array([n.endswith("+dirty") for n in names])
        return np.lexsort((when, dirty, np.array([position[n] for n in names])))
    if commit_times is not None and all(commit_times):
        return np.lexsort((when, _ranks([_timestamp(t) for t in commit_times])))
    return np.argsort(when, kind="stable")


def _ranks(values: Sequence[Any] | np.ndarray) -> np.ndarray:
    """Each value's rank among the distinct ones, as Python orders them (equal values, one rank)."""
    codes, distinct = pd.factorize(np.array(values, dtype=object))  # each distinct value sorted once
    rank = np.empty(len(distinct), np.intp)
    rank[np.argsort(distinct, kind="stable")] = np.arange(len(distinct))
    return rank[codes]


# a commit's time, parsed once for every series it is a subject of (each of a history's points)
_timestamp = functools.lru_cache(maxsize=1 << 16)(pd.Timestamp)


def _rev_list() -> list[str] | None:
    """Every commit of the repository in the working directory, oldest first (None: no git there)."""
    try:
        return subprocess.run(
            ["git", "rev-list", "--all", "--topo-order", "--reverse"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None


def _git_order(names: list[str], rev_list: Callable[[], list[str] | None]) -> dict[str, int] | None:
    """Each subject's position among the commits (a subject names a commit by a prefix of its
    sha); None unless every one is found. One pass over the commits per prefix length, not one
    per subject (a thousand subjects in a repository of 100k commits took minutes)."""
    found = [COMMIT.match(n) for n in names]
    if not names or not all(found):
        return None
    listed = rev_list()
    if listed is None:
        return None
    first: dict[str, int] = {}  # a prefix of each length asked -> the first commit it starts
    for length in {len(m.group(1)) for m in found if m}:
        for i, sha in enumerate(listed):
            first.setdefault(sha[:length], i)
    out = {}
    for name, match in zip(names, found):
        assert match is not None
        where = first.get(match.group(1))
        if where is None:
            return None
        out[name] = where
    return out


# --- change points ------------------------------------------------------------------------------


def change_points(series: Series, min_segment: int = MIN_SEGMENT) -> list[int]:
    """Indexes of the first subject after each change (PELT, L1 cost on log values)."""
    from perflab.analysis.changepoints import pelt_l1

    values = series.values
    if len(values) < 2 * min_segment or (values <= 0).any():
        return []
    signal = np.log(values)
    noise = float(np.median(np.abs(np.diff(signal)))) if len(signal) > 1 else 0.0
    penalty = 2 * math.log(len(signal)) * max(noise, NOISE_FLOOR)
    breaks = pelt_l1(signal, penalty, min_segment)
    return [b for b in breaks if b < len(values)]


def judge(
    series: list[Series],
    *,
    threshold_pct: float = DEFAULT_STEP_PCT,
    min_segment: int = MIN_SEGMENT,
    alpha: float = ALPHA,
) -> list[ChangePoint]:
    """Every change point of every series, labelled (see the module docstring)."""
    changes = []
    for s in series:
        breaks = change_points(s, min_segment)
        edges = [0, *breaks, len(s.names)]
        for i, at in enumerate(breaks):
            lo, hi = max(edges[i], at - min_segment), min(edges[i + 2], at + min_segment)
            p = replicates.change(_side(s.measured(lo, at)), _side(s.measured(at, hi)), level=alpha).p_value
            changes.append(ChangePoint(s, at, float(np.median(s.values[lo:at])), float(np.median(s.values[at:hi])), p))
    gate = Gate(threshold_pct, alpha)
    for c, p_adj in zip(changes, fdr([c.p_value for c in changes])):
        worse = (c.after < c.before) if c.series.higher_is_better else (c.after > c.before)
        c.label, c.p_value = label_step(p_adj, c.change_pct, worse, gate).value, p_adj
    return changes


def _side(subjects: list[replicates.Measured]) -> replicates.Measured:
    """Subjects as one side of a step: every process of each is a replicate (so a subject
    measured in one process with 1000 samples counts once, not 1000 times)."""
    figures = np.concatenate([x.figures if len(x.figures) else np.array([x.value]) for x in subjects])
    procs = [p for x in subjects for p in (x.processes or [x.samples])]
    return replicates.Measured(pd.DataFrame(), float(np.median(figures)), np.array([]), [], procs, figures)


def judgeable(series: list[Series], min_segment: int = MIN_SEGMENT) -> bool:
    return any(len(s.names) >= 2 * min_segment for s in series)


def doubtful(series: list[Series], min_segment: int = MIN_SEGMENT) -> list[Series]:
    """The series long enough to judge whose clean subjects (not flagged suspect) are too few
    for a change: a busy machine's measurements cannot show that nothing changed. A change
    found in them is still reported (as compare still judges a suspect point, and says so)."""
    need = 2 * min_segment
    return [s for s in series if len(s.names) >= need > sum(not x for x in s.suspect)]


# --- output -------------------------------------------------------------------------------------


def to_json(changes: list[ChangePoint], notes: Sequence[str] = ()) -> str:
    return json.dumps({"changes": [c.as_json() for c in changes], "notes": list(notes)}, indent=1)


def to_text(series: list[Series], changes: list[ChangePoint]) -> str:
    lines = ["| series | machine | metric | subjects | suspect | first | last |", "|---|---|---|---|---|---|---|"]
    for s in series:
        machine = s.identity.get("cpu_model", "") or s.identity.get("gpu_model", "")
        threads = s.identity.get("num_threads")
        machine += f", {threads} threads" if threads else ""
        flagged = sum(bool(x) for x in s.suspect)
        lines.append(
            f"| {s.label} | {machine} | {s.metric} | {len(s.names)} | {flagged or ''} | "
            f"{s.values[0]:.4g} ({s.names[0]}) | {s.values[-1]:.4g} ({s.names[-1]}) |"
        )
    if changes:
        lines += [
            "",
            "| change | series | between | change_pct | adjusted p | run dirs (after) |",
            "|---|---|---|---|---|---|",
        ]
        for c in changes:
            names = c.series.names
            lines.append(
                f"| {c.label} | {c.series.label} | {names[c.at - 1]} -> {names[c.at]} | {c.change_pct:+.1f} % | "
                f"{c.p_value:.2g} | {', '.join(c.series.run_dirs(c.at))} |"
            )
    return "\n".join(lines)


MAX_TREND_FIGURES = 4  # of plots.MAX_TRENDS series each; more series are counted, not drawn
MAX_SERIES_LINES = 100  # the report's table of series; the rest counted (perflab history lists them all)


def report_section(rows: pd.DataFrame, samples: Mapping[str, Any] | None = None) -> str:
    """The report's trend section (HTML): each series of two or more subjects, its metric
    against the subject with its changes and suspect subjects marked (those with a change
    first), and a line per series; bounded whatever the history (figures and lines capped, the
    rest counted); "" when the rows hold no history."""
    from perflab.analysis import plots

    series = [s for s in build_series(rows, samples or {}) if len(s.names) >= 2]
    if not series:
        return ""
    changes = judge(series)
    changed = {id(c.series) for c in changes}
    series = sorted(series, key=lambda s: id(s) not in changed)  # stable: otherwise in build_series' order
    drawn = series[: plots.MAX_TRENDS * MAX_TREND_FIGURES]
    try:
        figure = "".join(
            plots.svg(plots.trend(drawn[i : i + plots.MAX_TRENDS], changes))
            for i in range(0, len(drawn), plots.MAX_TRENDS)
        )
    except ImportError:
        figure = f'<p class="noplot">{html.escape(plots.MISSING_MATPLOTLIB)}</p>'
    if len(series) > len(drawn):
        figure += f'<p class="note">and {len(series) - len(drawn)} more series not drawn (perflab history).</p>'
    items = "".join(
        f"<li>{html.escape(c.label)}: {html.escape(c.series.label)}, "
        f"{html.escape(c.series.names[c.at - 1])} &rarr; {html.escape(c.series.names[c.at])}: "
        f"{c.change_pct:+.1f} %</li>"
        for c in changes
    )
    return (
        '<section id="trends"><h2>Trends over the code under test</h2>'
        f"<p>{len(series)} series of the same point on the same machine over {max(len(s.names) for s in series)} "
        "subjects (results.subject); change points from PELT, each judged as a step "
        "(perflab history); a cross: a subject whose every row was flagged suspect.</p>"
        f"{figure}<ul>{items or '<li>no change point</li>'}</ul>{_series_table(series, changes)}</section>"
    )


def _series_table(series: list[Series], changes: list[ChangePoint]) -> str:
    """A line per series (as ``perflab history`` prints them): its subjects, how many are
    suspect, its first and last values, its change points; capped at ``MAX_SERIES_LINES``."""
    found: dict[int, list[str]] = {}
    for c in changes:
        found.setdefault(id(c.series), []).append(f"{c.label} {c.change_pct:+.1f} % at {c.series.names[c.at]}")
    lines = []
    for s in series[:MAX_SERIES_LINES]:
        cells = [
            s.label,
            s.metric,
            str(len(s.names)),
            str(sum(bool(x) for x in s.suspect) or ""),
            f"{s.values[0]:.4g} ({s.names[0]})",
            f"{s.values[-1]:.4g} ({s.names[-1]})",
            "; ".join(found.get(id(s), [])),
        ]
        lines.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>" for h in ("series", "metric", "subjects", "suspect", "first", "last", "change points")
    )
    more = len(series) - len(lines)
    tail = f'<p class="note">and {more} more series (perflab history lists them all).</p>' if more > 0 else ""
    return f'<table class="series"><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table>{tail}'


PROG = "perflab history"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit codes are perflab.analysis.verdicts' (0 none, 1 a regression, 2 usage,
    3 could not judge: too little or too suspect history, or a crash)."""
    return judging(PROG, lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths",
        nargs="*",
        default=[ResultsConfig.store],
        help=f"results trees, run or sweep dirs, CSV files (default: {ResultsConfig.store})",
    )
    parser.add_argument("--experiment", help="only this experiment")
    parser.add_argument("--metric", help="column to follow (default: each experiment's own)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_STEP_PCT, metavar="PCT", help="regression size")
    parser.add_argument("--min-segment", type=int, default=MIN_SEGMENT, metavar="N", help="subjects a side (3)")
    parser.add_argument("--alpha", type=float, default=ALPHA, help="false discovery rate over all changes (0.05)")
    parser.add_argument("--format", choices=("md", "json"), default="md")
    args = parser.parse_args(argv)
    notes: list[str] = []
    try:
        if not 0 < args.alpha < 1:
            raise HistoryError(f"--alpha {args.alpha}: allowed: a number between 0 and 1")
        if args.min_segment < 2:
            raise HistoryError(
                f"--min-segment {args.min_segment}: allowed: an integer >= 2 (1 would make a spike a change)"
            )
        if not math.isfinite(args.threshold) or args.threshold < 0:
            raise HistoryError(f"--threshold {args.threshold}: allowed: a number >= 0 (percent)")
        series = load_series(args.paths, args.experiment, args.metric, notes)
    except (HistoryError, FileNotFoundError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return USAGE_EXIT
    changes = judge(series, threshold_pct=args.threshold, min_segment=args.min_segment, alpha=args.alpha)
    judged = judgeable(series, args.min_segment)
    unsure = doubtful(series, args.min_segment)
    notes += suspect_lines(series, args.min_segment)
    code = history_exit_code([StepLabel(c.label) for c in changes], judged, bool(unsure))
    print(to_json(changes, notes) if args.format == "json" else to_text(series, changes))
    for note in notes:
        print(f"{PROG}: {note}", file=sys.stderr)
    if not judged:
        longest = max((len(s.names) for s in series), default=0)
        print(
            f"{PROG}: too little history: the longest series has {longest} subject(s); a change needs "
            f"{args.min_segment} on each side ({2 * args.min_segment})",
            file=sys.stderr,
        )
    counts = {label.value: sum(c.label == label.value for c in changes) for label in StepLabel}
    said = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no change point"
    if unsure:
        said += f"; {len(unsure)} series too suspect to call unchanged"
    print(f"{PROG}: {len(series)} series, {said} -> exit {code}", file=sys.stderr)
    return code


def _suspect_reasons(series: Series) -> str:
    return "; ".join(dict.fromkeys(r for x in series.suspect if x for r in x.split("; ")))


def suspect_line(series: Series, min_segment: int = MIN_SEGMENT, reasons: bool = True) -> str:
    """What a series' suspect subjects mean for its verdict, in one line (``reasons``: and why
    they were flagged)."""
    flagged = sum(bool(x) for x in series.suspect)
    why = f" ({_suspect_reasons(series)})" if reasons else ""
    clean, need = len(series.names) - flagged, 2 * min_segment
    head = f"{series.label}: {flagged} of {len(series.names)} subjects' measurements were flagged suspect"
    if len(series.names) >= need > clean:
        return f"{head}{why}: {clean} clean, a change needs {need}: not called unchanged"
    return f"{head}{why}; judged with them"


def suspect_lines(series: list[Series], min_segment: int = MIN_SEGMENT) -> list[str]:
    """A line per series with suspect subjects; reasons every such series shares said once, first."""
    flagged = [s for s in series if any(s.suspect)]
    shared = {_suspect_reasons(s) for s in flagged}
    if len(flagged) < 2 or len(shared) > 1:
        return [suspect_line(s, min_segment) for s in flagged]
    return [f"{len(flagged)} series have subjects flagged suspect, each for: {shared.pop()}"] + [
        suspect_line(s, min_segment, reasons=False) for s in flagged
    ]


def load_series(
    paths: Sequence[str], experiment: str | None = None, metric: str | None = None, notes: list[str] | None = None
) -> list[Series]:
    """The series of the rows under ``paths`` (one line for a path that holds none); ``notes``
    gets what was left out of them (see build_series)."""
    from perflab.analysis.replicates import has_metric, metric_refusal, samples_by_row
    from perflab.results import Reading

    for p in paths:
        if not Path(p).exists():
            raise HistoryError(f"{p}: no such file or folder")
    reading = Reading(*paths, experiment=experiment)  # the rows, then their samples: each tree walked once
    rows = reading.rows()
    if rows.empty:
        raise HistoryError(
            f"no result rows under {', '.join(map(str, paths))}" + (f" of {experiment}" if experiment else "")
        )
    if metric is not None and not has_metric(rows, metric):  # compare's line
        raise HistoryError(metric_refusal(metric, rows))
    ok = (
        rows["row_id"][(rows["status"].astype("string") == "ok").fillna(False).to_numpy(bool)]
        if "status" in rows
        else []
    )
    return build_series(rows, samples_by_row(list(paths), row_ids=ok, reading=reading), metric, notes)


if __name__ == "__main__":
    sys.exit(main())
