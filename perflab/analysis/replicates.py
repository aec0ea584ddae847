"""One statistics model for compare, ab and history: the process is the unit of replication.

The samples inside one process are not independent replicates of a build: the process (its
allocation, its thread placement, its clocks) is (Kalibera and Jones, "Rigorous Benchmarking in
Reasonable Time", 2013; Georges et al. 2007). So a point's figure per process is the median of
that process's samples (its row's metric), and a change is judged from those figures:

- the change: the ratio of the geometric means of the two sides' per-process figures;
- significance: Student's t-test on their logs (pooled variance, ``m + n - 2`` degrees of
  freedom), so its p-value is about the code, not about one process;
- the interval: the same t-test's, inverted (so it excludes no change exactly where p < 0.05:
  the words, the p-value and the interval cannot disagree);
- detectable: the smallest change ``m`` and ``n`` processes at this between-process spread find
  with probability ``POWER``; the advice: how many processes a side would do, bounded;
- the margin: half the width of the change's interval at the level a lone point must meet
  (Student's t on the logs, the spread detectability assumes): where the interval excludes a
  slowdown beyond the gate, the point is equivalent within it (a PASS).

A process is a run (``run_id``): ``bench.processes=K`` measures a point in K fresh processes,
each its own run, its rows carrying ``process`` (1..K). With one process a side the
between-process spread is unknown: no p-value is made from within-process samples; the change
is judged against a floor (``perflab.analysis.floor``: ``--process-cv``, else the variation the
same experiment's points of two or more processes measured in the trees, else ``FLOOR_CV``),
and the verdict says so. Below
``MEASURED_FROM`` processes a side the floor is also the least spread assumed for detectability.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from perflab.analysis.frames import PER_SAMPLE_TIMES
from perflab.analysis.stats import ALPHA, POWER
from perflab.config import registry
from perflab.store.columns import EXACT, FEW_FOR_SPREAD, RATES, unit_of
from perflab.store.rows import Notes

FLOOR_CV = 0.10  # between-process variation assumed where none was measured or kept (docs/compare.md)
MEASURED_FROM = 3  # processes a side from which the measured spread alone is trusted for detectability
MOST_PROCESSES = 50  # advice beyond this many processes a side is no advice: said as such
MEDIAN_SE = math.sqrt(math.pi / 2)  # a median's standard error over the samples' standard deviation / sqrt(n)


# --- a point's rows: its metric, its samples, its processes -----------------------------------


def metric_for(experiment: str, rows: pd.DataFrame, asked: str | None) -> tuple[str, str]:
    """(metric, note): the asked one if the experiment's rows have it, else the experiment's own
    (the one home of "an experiment's metric, with median_s as its fallback")."""
    module = registry.of_rows(rows)
    own = module.metric if module else "median_s"
    if asked and asked in rows and rows[asked].notna().any():
        return asked, ""
    if own not in rows or rows[own].isna().all():
        own = "median_s"
    note = f"{experiment} has no {asked} values: compared by {own}" if asked else ""
    return own, note


def numeric(metric: str) -> bool:
    """Whether a column of that name may hold a metric: any but perflab's text, category and flag
    columns (an experiment's own figures are no columns perflab knows)."""
    from perflab.store.columns import CATEGORIES, FLAGS, TEXT

    return metric not in {*TEXT, *CATEGORIES, *FLAGS}


def metric_refusal(metric: str, rows: pd.DataFrame | None = None, tree: str = "") -> str:
    """The one line that refuses ``--metric`` (compare, ab, history alike): no row (of ``tree``)
    has a value of it, and the judged columns the rows have (all of them where none are given)."""
    from perflab.store.columns import JUDGED

    have = sorted(c for c in JUDGED if rows is None or (c in rows and rows[c].notna().any()))
    where = "" if rows is None else f"no row{' of ' + tree if tree else ''} has a value of it; "
    return f"--metric {metric}: {where}allowed: a numeric column, e.g. {', '.join(have)}"


def has_metric(rows: pd.DataFrame, metric: str) -> bool:
    """Whether some row has a numeric value of ``metric``."""
    return metric in rows and bool(pd.to_numeric(rows[metric], errors="coerce").notna().any())


def summary_rows(experiment: str, rows: pd.DataFrame) -> pd.DataFrame:
    """The rows an experiment compares by default (training: its summary row, not every epoch)."""
    module = registry.of_rows(rows)
    keep = module.hooks.SUMMARY_ROWS if module else None
    return rows[rows["measurement"].astype("string").isin(keep)] if keep else rows


UNUSABLE_SAMPLES = "left out {n} unusable sample{s} (NaN, not a number, or <= 0 s) of the rows"


class RowSeconds(Mapping[str, np.ndarray]):
    """Rows' usable raw sample seconds by row id, in one long array, row after row: row
    ``ids[k]``'s are ``seconds[bounds[k]:bounds[k + 1]]`` (none: its samples were kept, none
    usable). Read as a dict (built on first use); ``row_samples`` gathers many rows' at once
    (a dict of 46k arrays, built and looked up one by one, was most of reading a history's samples)."""

    def __init__(self, ids: Sequence[str], bounds: np.ndarray, seconds: np.ndarray) -> None:
        self.ids, self.bounds, self.seconds = pd.Index(ids, dtype=object), bounds, seconds

    @functools.cached_property
    def _by_id(self) -> dict[str, np.ndarray]:
        b = self.bounds.tolist()
        return {str(k): self.seconds[a:z] for k, a, z in zip(self.ids.tolist(), b, b[1:])}

    def __getitem__(self, row_id: str) -> np.ndarray:
        return self._by_id[row_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self.ids)

    def gather(self, row_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(each row's count of seconds, -1 where its samples were not kept; their seconds, row after row)."""
        at = self.ids.get_indexer(pd.Index(row_ids, dtype=object))
        kept = at >= 0
        starts, ends = self.bounds[at[kept]], self.bounds[at[kept] + 1]
        counts = np.full(len(at), -1, np.intp)
        counts[kept] = ends - starts
        lengths = ends - starts
        # each row's positions in ``seconds``: a running count, shifted by its start
        shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        return counts, self.seconds[np.arange(len(shift)) + shift]


def samples_by_row(
    paths: Sequence[str | Path],
    notes: Notes | None = None,
    row_ids: Iterable[str] | None = None,
    reading: Any = None,
) -> Mapping[str, np.ndarray]:
    """Every row's raw sample seconds (not its warm-up) under ``paths``, by row id (``row_ids``:
    only those rows': a results tree's index reads no other); a sample that is no time (NaN,
    not a number, <= 0) is left out and said: in ``notes`` by row id (kind ``UNUSABLE_SAMPLES``),
    else as a warning. ``reading``: the ``perflab.results.Reading`` that read the rows of
    ``paths`` (their trees not walked again)."""
    from perflab.results import load_samples

    columns = ("row_id", "phase", "seconds")  # not ``i``: 0.2 s of decoding at 4.7M samples
    try:
        if reading is not None:
            table = reading.samples(row_ids, columns, arrow=True)
        else:
            table = load_samples(*paths, row_ids=row_ids, columns=columns, arrow=True)
    except FileNotFoundError:
        return {}
    # a batch (a row group of the index) at a time: its arrays fit the caches (4.7M samples: 0.1 s, not 1)
    runs = [_runs(b) for b in table.to_batches()]
    names = [n for r in runs for n in r[0]]
    if not names:
        return {}
    codes, ids = pd.factorize(np.array(names, dtype=object))  # a row's samples split between batches: one row
    good = np.bincount(codes, np.concatenate([r[1] for r in runs]), len(ids)).astype(np.intp)
    bad = np.bincount(codes, np.concatenate([r[2] for r in runs]), len(ids)).astype(np.intp)
    seconds = np.concatenate([r[3] for r in runs])
    if (codes[1:] < codes[:-1]).any():  # a row's samples apart (two places, or CSVs): together
        seconds = seconds[np.argsort(np.repeat(codes, np.concatenate([r[1] for r in runs])), kind="stable")]
    own = notes if notes is not None else Notes()
    for k in sorted(np.flatnonzero(bad).tolist(), key=lambda k: ids[k]):
        own.add(UNUSABLE_SAMPLES, ids[k], count=int(bad[k]))
    if notes is None:
        own.say()
    return RowSeconds(ids, np.concatenate(([0], np.cumsum(good))), seconds)


def _runs(batch: Any) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """A batch of samples (Arrow) as its runs of one row's timed samples (not warm-ups): each
    run's row id, its usable samples (a time: finite, > 0) and its unusable ones, and the usable
    seconds, in order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids, phase = (_coded(batch.column(c)) for c in ("row_id", "phase"))
    codes = pc.fill_null(ids.indices, -1).to_numpy(zero_copy_only=False)
    timed = pc.fill_null(pc.take(pc.equal(phase.dictionary, "sample"), phase.indices), False)
    seconds = batch.column("seconds")
    if not pa.types.is_floating(seconds.type):  # text from a CSV: a damaged cell reads as NaN
        seconds = pa.array(pd.to_numeric(seconds.to_pandas(), errors="coerce"), pa.float64())
    keep = timed.to_numpy(zero_copy_only=False) & (codes >= 0)
    codes, values = codes[keep], seconds.to_numpy(zero_copy_only=False)[keep]
    good = np.isfinite(values) & (values > 0)
    starts = np.flatnonzero(np.concatenate(([len(codes) > 0], codes[1:] != codes[:-1])))
    usable = np.add.reduceat(good, starts) if len(starts) else np.zeros(0, np.intp)
    names = ids.dictionary.take(pa.array(codes[starts], pa.int64())).to_pylist()
    return names, usable, np.diff(np.append(starts, len(codes))) - usable, values[good]


def _coded(column: Any) -> Any:
    """A text column (Arrow) as a dictionary array: the index's are already."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column.cast(pa.string()))


def iqr_pcts(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """IQR / median in percent of each array (the spread the job's table and
    bench.noise_threshold use); NaN below ``FEW_FOR_SPREAD`` values, as the job's table shows
    "?". The arrays of one length in one numpy call (a call each was most of a compare of a
    tree of 1,000 points)."""
    out = np.full(len(arrays), math.nan)
    for at, values in by_length(arrays):
        if values.shape[1] >= FEW_FOR_SPREAD:
            values.sort(axis=1)  # the same statistics, each found in place: half the time of a partition of each row
            q1, q3 = np.percentile(values, [25, 75], axis=1)
            out[at] = 100 * (q3 - q1) / np.median(values, axis=1)
    return out


def by_length(arrays: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(positions, values as rows of a matrix) of the arrays of each length: numpy's statistics
    of a matrix's rows are those of each row alone, in one call (processes of a point mostly
    keep the same number of samples)."""
    lengths = np.fromiter((len(x) for x in arrays), np.intp, len(arrays))
    out = []
    for n in np.unique(lengths).tolist():
        at = np.flatnonzero(lengths == n)
        out.append((at, np.stack([arrays[i] for i in at.tolist()]) if n else np.empty((len(at), 0))))
    return out


@dataclass
class RowSamples:
    """Every row's raw samples in one long array, row after row (``rows``' order): ``seconds``
    as kept, ``values`` those of the metric (``frames.sample_values``: what a rate's each sample
    implies, or the seconds; NaN for a metric no sample gives), ``good`` the usable values."""

    row: np.ndarray  # each sample's row position
    seconds: np.ndarray
    values: np.ndarray
    good: np.ndarray
    every: np.ndarray  # a row's samples as values of the metric (0: none, or a metric no sample gives)
    clean: np.ndarray  # a row's usable ones
    applies: bool  # the metric comes from the samples (a time or a rate: an instruction count does not)
    recorded: np.ndarray  # a row's samples were kept (its id is in them, even with none usable)


def row_samples(
    rows: pd.DataFrame, metric: str, samples: Mapping[str, np.ndarray], order: np.ndarray | None = None
) -> RowSamples:
    """The raw samples of every row at once (a ``sample_values`` and a ``usable`` call a row were
    most of a compare of 46k points); ``order``: the rows' positions in the order their samples
    follow each other (a point's rows together: no sort of every sample to group them)."""
    at = np.arange(len(rows)) if order is None else order
    ids = [str(r) for r in rows["row_id"].iloc[at].tolist()] if samples and "row_id" in rows else []
    counts, seconds = _gather(samples, ids)
    row = np.repeat(at[: len(ids)], np.maximum(counts, 0))
    recorded = np.zeros(len(rows), bool)
    recorded[at[: len(ids)]] = counts >= 0
    applies = metric in RATES | PER_SAMPLE_TIMES
    if metric in RATES:  # metric x median / sample seconds, as sample_values
        values = (_floats(rows, metric) * _floats(rows, "median_s"))[row] / seconds
    else:
        values = seconds if applies else np.full(len(seconds), math.nan)
    good = np.isfinite(values) & (values > 0)
    every = np.bincount(row, minlength=len(rows)) if applies else np.zeros(len(rows), np.intp)
    clean = np.bincount(row[good], minlength=len(rows))
    return RowSamples(row, seconds, values, good, every, clean, applies, recorded)


def _gather(samples: Mapping[str, np.ndarray], ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``RowSeconds.gather`` of any mapping of row id -> seconds."""
    if isinstance(samples, RowSeconds):
        return samples.gather(ids)
    found = [samples.get(r) for r in ids]
    counts = np.fromiter((-1 if x is None else len(x) for x in found), np.intp, len(ids))
    kept = [x for x in found if x is not None and len(x)]
    return counts, np.concatenate(kept).astype(float, copy=False) if kept else np.array([])


def _floats(rows: pd.DataFrame, column: str) -> np.ndarray:
    """``column`` as floats (NaN: empty, not a number or absent)."""
    if column not in rows:
        return np.full(len(rows), math.nan)
    return pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _timed(metric: str) -> bool:
    """Whether a value of ``metric`` <= 0 is damage (a time, a rate or a count), not a value."""
    return metric in RATES or unit_of(metric) == "s" or metric.endswith("_per_s") or metric in EXACT


def _split(values: np.ndarray, groups: np.ndarray, count: int) -> list[np.ndarray]:
    """``values`` by group (``groups``: each one's, 0 .. count - 1), each group's in their order
    (slices, not np.split's pieces: a tenth of the time at 46k groups)."""
    if len(groups) and (groups[1:] < groups[:-1]).any():  # not grouped yet
        order = np.argsort(groups, kind="stable")
        values, groups = values[order], groups[order]
    bounds = np.concatenate(([0], np.cumsum(np.bincount(groups, minlength=count)))).tolist()
    return [values[a:b] for a, b in zip(bounds, bounds[1:])]


@dataclass
class Points:
    """Every point's figures at once, column by column (``measured_each``'s, less a Measured a
    point): the value, the processes and their spread, the usable samples pooled, what was left
    out, and the IQR % of the raw seconds (the job's table's)."""

    value: np.ndarray  # the median of its usable rows' metric (NaN: none)
    processes: np.ndarray  # its processes (runs) with a usable row
    cv: np.ndarray  # its processes' figures' standard deviation over their mean (NaN: fewer than 2, or mean 0)
    samples: list[np.ndarray]  # its usable raw samples as values of the metric, pooled
    left_out: list[list[str]]
    iqr_pct: np.ndarray


def measured_points(
    rows: pd.DataFrame,
    codes: np.ndarray,
    count: int,
    metric: str,
    samples: Mapping[str, np.ndarray],
    said: Notes | None = None,
) -> Points:
    """``measured_each`` of every point at once (``codes``: each row's point, 0 .. count - 1), as
    long arrays grouped with bincounts and sorts: the same figures, and the same words."""
    r = _rows(rows, metric, samples, said, np.argsort(codes, kind="stable"))  # each point's samples together
    s, values, good = r.samples, r.values, r.good
    n_lost, n_bad, dropped = _tally(r, codes, count)
    left: list[list[str]] = [[] for _ in range(count)]
    for i in np.flatnonzero(n_lost | n_bad | dropped).tolist():
        left[i] = left_out(metric, r.timed, int(n_lost[i]), int(n_bad[i]), int(dropped[i]))
    # the processes: each point's runs with a usable row, in the order they first appear
    run = rows["run_id"].astype(str).to_numpy() if "run_id" in rows else np.arange(len(rows)).astype(str)
    runs, names = pd.factorize(run[good])
    width = max(len(names), 1)
    pairs, firsts = pd.factorize(codes[good].astype(np.int64) * width + runs)
    point_of = firsts // width
    figures = _medians(values[good], pairs, len(firsts))  # each process's: the median of its rows'
    processes = np.bincount(point_of, minlength=count)
    cv = np.full(count, math.nan)
    several = np.flatnonzero(processes > 1)
    if len(several):
        of_point = _split(figures, point_of, count)
        for i in several.tolist():
            if of_point[i].mean():
                cv[i] = of_point[i].std(ddof=1) / of_point[i].mean()
    keep = s.good & good[s.row]
    return Points(
        _medians(values[good], codes[good], count),
        processes,
        cv,
        _split(s.values[keep], codes[s.row[keep]], count),
        left,
        iqr_pcts(_split(s.seconds, codes[s.row], count)),
    )


def values_each(
    rows: pd.DataFrame, codes: np.ndarray, count: int, metric: str, samples: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Each point's value as ``measured_each`` gives it (the median of its usable rows' metric;
    NaN: none) and whether it left anything out (its ``left_out`` said something), every point
    at once (``codes``: each row's point, 0 .. count - 1; -1: a row of none): a history's
    thousands of subjects need no more of each until one is judged."""
    r = _rows(rows, metric, samples)
    good = r.good & (codes >= 0)
    n_lost, n_bad, dropped = _tally(r, codes, count)
    return _medians(r.values[good], codes[good], count), (n_lost + n_bad + dropped) > 0


def _tally(r: _Rows, codes: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each point's rows whose samples give no usable value, rows whose metric is none, and
    usable rows' samples left out (``codes``: each row's point; -1: a row of none)."""
    inside = codes >= 0
    good, lost = r.good & inside, r.lost & inside
    n_lost = np.bincount(codes[lost], minlength=count)
    n_bad = np.bincount(codes[inside & ~(r.good | r.lost)], minlength=count)
    dropped = np.bincount(codes[good], (r.at_read + r.samples.every - r.samples.clean)[good], minlength=count)
    return n_lost, n_bad, dropped.astype(np.int64)


@dataclass
class Measured:
    """What a point's rows give to judge it by: the rows whose metric is usable, the median of
    it, their usable raw samples as values of the metric (pooled, and per process), each
    process's figure, and what was left out, in words. ``rows`` is empty (its columns only)
    where ``measured_each(frames=False)`` made it (history: nothing reads them back there); a
    reader of rows (an exact metric's ``*_spread_pct``: ``verdicts``) takes ``measured``'s."""

    rows: pd.DataFrame
    value: float
    samples: np.ndarray
    left_out: list[str]
    processes: list[np.ndarray] = field(default_factory=list)  # usable samples, process by process
    figures: np.ndarray = field(default_factory=lambda: np.array([]))  # one per process
    ids: list[str] = field(default_factory=list)  # each figure's process number (``process``), where rows carry one

    @property
    def n_processes(self) -> int:
        return len(self.figures)


def measured(rows: pd.DataFrame, metric: str, samples: Mapping[str, np.ndarray], said: Notes | None = None) -> Measured:
    """A point's usable values: a row whose metric is NaN or not a number -- or, for a time or a
    rate, <= 0 (an accuracy of 0 is a value) -- is left out with its samples, and so is a sample
    that implies no positive value (``said``: the notes of ``samples_by_row``, for the samples
    left out when they were read). Its processes are its runs (``run_id``); a process's figure
    is the median of its rows' metric. Nothing usable: value NaN, no samples, no process."""
    return measured_each(rows, [np.arange(len(rows))], metric, samples, said)[0]


def measured_each(
    rows: pd.DataFrame,
    groups: Sequence[np.ndarray],
    metric: str,
    samples: Mapping[str, np.ndarray],
    said: Notes | None = None,
    frames: bool = True,
) -> list[Measured]:
    """``measured`` of each group of ``rows`` (their positions), each row read once: history's
    thousands of subjects took a few milliseconds of pandas each, one ``measured`` call apiece.
    ``frames=False``: each ``Measured.rows`` is left empty (its columns only), for a caller
    that reads no rows back (a frame a group was most of what remained)."""
    r = _rows(rows, metric, samples, said)
    clean_of = _split(r.samples.values[r.samples.good], r.samples.row[r.samples.good], len(rows))  # a row's usable
    runs = rows["run_id"].astype(str).to_numpy() if "run_id" in rows else None
    numbers = rows["process"].astype("string").fillna("").to_numpy() if "process" in rows else None
    empty = rows.iloc[:0]  # once: a slice a group took most of a history of 1,000 subjects
    # a row's usable, value and samples left out, as Python values read once (numpy scalars a subject otherwise)
    each = (r.good.tolist(), r.values.tolist(), (r.at_read + r.samples.every - r.samples.clean).tolist())
    out = []
    for at in groups:
        if len(at) == 1 and not frames:  # a row a point (a subject of a history): nothing to pool
            out.append(_one_row(int(at[0]), r, each, clean_of, numbers, empty))
            continue
        values, lost, good = r.values[at], r.lost[at], r.good[at]
        kept_at = at[good]
        kept = rows.iloc[kept_at] if frames else empty
        clean = np.concatenate([clean_of[i] for i in kept_at]) if len(kept_at) else np.array([])
        process = runs[kept_at] if runs is not None else np.arange(len(kept_at)).astype(str)
        # each process's rows found in one pass (a search of every row per process grew as their product)
        codes, names = _first_seen(process)  # processes in the order they first appear
        numbered = [str(numbers[kept_at[i]]) for i in _firsts(codes, len(names))] if numbers is not None else []
        # a row a process (the usual point): its figure is its value, no median to take
        figures = values[good] if len(names) == len(kept_at) else _medians(values[good], codes, len(names))
        if len(names) == len(kept_at):  # a row a process (the usual point): its samples are the process's
            per_process = [clean_of[i] for i in kept_at]
        else:
            members: list[list[np.ndarray]] = [[] for _ in range(len(names))]
            for code, i in zip(codes, kept_at):
                members[code].append(clean_of[i])
            per_process = [np.concatenate(m) for m in members]
        dropped = r.at_read[kept_at].sum() + r.samples.every[kept_at].sum() - r.samples.clean[kept_at].sum()
        left = left_out(metric, r.timed, int(lost.sum()), int((~(good | lost)).sum()), int(dropped))
        # np.median's value (the middle one, or the mean of the two middle), without its fixed
        # cost: one call a subject was a third of a long history's measuring
        value = float(statistics.median(values[good].tolist())) if good.any() else math.nan
        out.append(Measured(kept, value, clean, left, per_process, figures, numbered))
    return out


@dataclass
class _Rows:
    """What every row gives the points it is in: its metric's value, whether it is usable (its
    metric, and its samples where the metric comes from them), its raw samples."""

    metric: str
    timed: bool  # a value <= 0 is damage
    values: np.ndarray
    good: np.ndarray
    lost: np.ndarray  # a usable value whose kept samples give none: damage too (a negative median_s)
    samples: RowSamples
    at_read: np.ndarray  # samples left out when they were read, a row


def _rows(
    rows: pd.DataFrame,
    metric: str,
    samples: Mapping[str, np.ndarray],
    said: Notes | None = None,
    order: np.ndarray | None = None,
) -> _Rows:
    """Every row of ``rows`` read once (``said``: the notes of ``samples_by_row``; ``order``:
    ``row_samples``')."""
    values = _floats(rows, metric)
    timed = _timed(metric)
    usable_of = np.isfinite(values) & ((values > 0) if timed else True)
    s = row_samples(rows, metric, samples, order)
    lost = usable_of & s.recorded & (s.clean == 0) & s.applies
    unusable = said.kinds.get(UNUSABLE_SAMPLES, {}) if said and "row_id" in rows else {}  # by row id
    at_read = np.zeros(len(rows), np.int64)
    if unusable:
        at_read[:] = [unusable.get(str(r), 0) for r in rows["row_id"].tolist()]
    return _Rows(metric, timed, values, usable_of & ~lost, lost, s, at_read)


def left_out(metric: str, timed: bool, lost: int, bad: int, samples: int) -> list[str]:
    """What a point left out, in words: ``lost`` rows whose samples give no usable value, ``bad``
    rows whose metric is none (``timed``: <= 0 is none either), ``samples`` unusable samples."""
    why = "NaN, not a number or <= 0" if timed else "NaN or not a number"
    said = [
        (lost, f"row{'s' if lost != 1 else ''} whose samples give no positive {metric}"),
        (bad, f"row{'s' if bad != 1 else ''} whose {metric} is {why}"),
        (samples, f"sample{'s' if samples != 1 else ''} that give no positive {metric} (NaN, not a number, <= 0)"),
    ]
    return [f"{n} {what}" for n, what in said if n]


def _one_row(
    i: int,
    r: _Rows,
    each: tuple[list, list, list],
    clean_of: list[np.ndarray],
    numbers: np.ndarray | None,
    empty: pd.DataFrame,
) -> Measured:
    """``measured_each``'s Measured of a group of the one row ``i`` (frames=False), as its loop
    makes it, without its numpy calls on arrays of one (most of a history of 46k subjects);
    ``each``: every row's usable, value and samples left out."""
    good, values, dropped = each[0][i], each[1][i], each[2][i]
    if not good:
        left = left_out(r.metric, r.timed, int(r.lost[i]), int(not r.lost[i]), 0)
        return Measured(empty, math.nan, np.array([]), left, [], np.array([]), [])
    clean = clean_of[i]
    numbered = [str(numbers[i])] if numbers is not None else []
    return Measured(
        empty,
        values,
        clean,
        left_out(r.metric, r.timed, 0, 0, dropped) if dropped else [],  # its words made only where there are some
        [clean],
        r.values[i : i + 1],
        numbered,
    )


def _firsts(codes: np.ndarray, groups: int) -> list[int]:
    """The position of each group's first member."""
    where: dict[int, int] = {}
    for i, code in enumerate(codes.tolist()):
        where.setdefault(code, i)
    return [where[g] for g in range(groups)]


def _first_seen(values: np.ndarray) -> tuple[np.ndarray, list]:
    """pd.factorize's (codes, uniques) of a group's few values, without its fixed cost (a tenth of
    a history's time, one call a subject)."""
    names = list(dict.fromkeys(values.tolist()))
    where = {v: i for i, v in enumerate(names)}
    return np.array([where[v] for v in values.tolist()], dtype=np.intp), names


def _medians(values: np.ndarray, codes: np.ndarray, groups: int) -> np.ndarray:
    """The median of each group's ``values`` (``codes``: each value's group, 0 .. groups - 1),
    as np.median takes it (the middle value, or the mean of the two middle ones; NaN of none), in one sort:
    a point of many processes took a median call (or a pandas groupby) per process."""
    counts = np.bincount(codes, minlength=groups)
    ordered = values[np.lexsort((values, codes))]
    starts = (np.cumsum(counts) - counts)[counts > 0]
    out = np.full(groups, math.nan)  # a group of none: NaN
    out[counts > 0] = (ordered[starts + (counts[counts > 0] - 1) // 2] + ordered[starts + counts[counts > 0] // 2]) / 2
    return out


# --- the statistics at the process level ------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The variation at each level, as coefficients of variation (log standard deviations):
    between processes (``between``; ``measured`` false: the floor, none was measured) and
    within a process (the median of each process's IQR / 1.349; NaN without samples)."""

    between: float
    within: float
    measured: bool
    df: int  # degrees of freedom of the between-process estimate


def _log_sd_within(processes: Sequence[np.ndarray]) -> float:
    """The median over processes of 3 samples or more of their log IQR / 1.349."""
    return float(_within_each([processes])[0])


def _within_each(points: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """``_log_sd_within`` of each point's processes: every process of every point in a few
    numpy calls (a percentile and a median call a point were most of judging 1,000 points)."""
    processes = [x for p in points for x in p]
    owner = np.repeat(np.arange(len(points)), [len(p) for p in points]).astype(np.intp)
    found = np.full(len(processes), math.nan)
    counted = np.zeros(len(processes), bool)  # of 3 samples or more
    for at, values in by_length(processes):
        if values.shape[1] >= 3:
            q3, q1 = np.percentile(np.log(values), [75, 25], axis=1)
            found[at], counted[at] = (q3 - q1) / 1.349, True
    out = _medians(found[counted], owner[counted], len(points))
    out[np.bincount(owner[counted], np.isnan(found[counted]), len(points)) > 0] = math.nan  # as np.median's
    return out


def _pairs(base: Measured, new: Measured) -> list[float] | None:
    """The ratio new / base of each process number both sides have (``Measured.ids``), or None
    where fewer than two pairs are."""
    if not base.ids or not new.ids:
        return None
    a = dict(zip(base.ids, base.figures.tolist()))
    b = dict(zip(new.ids, new.figures.tolist()))
    both = [k for k in a if k in b and a[k] > 0 and b[k] > 0 and math.isfinite(a[k]) and math.isfinite(b[k])]
    return [b[k] / a[k] for k in both] if len(both) >= 2 else None


def between(base: Measured, new: Measured) -> tuple[float, int]:
    """(the pooled log standard deviation of the two sides' per-process figures, its degrees of
    freedom): (NaN, 0) with one process a side."""
    return between_each([(base, new)])[0]


def between_each(sides: Sequence[tuple[Measured, Measured]]) -> list[tuple[float, int]]:
    """``between`` of each (base, new), all at once."""
    f = _figures(sides)
    return list(zip(f.sd.tolist(), f.df.tolist()))


@dataclass
class _Figures:
    """Each point's two sides' per-process figures as logs (``_logs_each``): how many a side, their
    mean a side, and ``between``'s pooled standard deviation (NaN: df < 1) and degrees of freedom."""

    m: np.ndarray
    n: np.ndarray
    mean_a: np.ndarray
    mean_b: np.ndarray
    sd: np.ndarray
    df: np.ndarray


def _figures(sides: Sequence[tuple[Measured, Measured]]) -> _Figures:
    (m, mean_a, ss_a), (n, mean_b, ss_b) = (_moments(_logs_each([s[k].figures for s in sides])) for k in (0, 1))
    df = m + n - 2
    sd = np.full(len(sides), math.nan)
    pooled = df >= 1
    sd[pooled] = np.sqrt((ss_a[pooled] + ss_b[pooled]) / df[pooled])
    return _Figures(m, n, mean_a, mean_b, sd, np.where(pooled, df, 0))


def _logs_each(arrays: Sequence[Any]) -> list[np.ndarray]:
    """The logs of each array's usable values (``stats.usable``), in one numpy pass over them all."""
    if not len(arrays):
        return []
    flat = np.concatenate([np.asarray(x, float) for x in arrays])
    owner = np.repeat(np.arange(len(arrays)), [len(x) for x in arrays]).astype(np.intp)
    keep = np.isfinite(flat) & (flat > 0)
    return _split(np.log(flat[keep]), owner[keep], len(arrays))


def _moments(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each array's length, mean (NaN: empty) and sum of squared deviations from it, each as
    numpy gives it of that array alone (``a.mean()``, ``((a - a.mean()) ** 2).sum()``): arrays
    of one length as the rows of a matrix."""
    count = np.fromiter((len(x) for x in arrays), np.intp, len(arrays))
    mean, ss = np.full(len(arrays), math.nan), np.zeros(len(arrays))
    for at, x in by_length(arrays):
        if x.shape[1]:
            mean[at] = mu = x.mean(axis=1)
            ss[at] = ((x - mu[:, None]) ** 2).sum(axis=1)
    return count, mean, ss


@functools.lru_cache(maxsize=4096)
def _quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (normal for df 0: a
    spread assumed, not estimated). Kept: every point's advice asks the same few (a scipy call
    each took most of a compare of many one-process points)."""
    if df < 1:
        return NormalDist().inv_cdf(p)
    from scipy import special  # the t distribution's own functions: scipy.stats costs 1.3 s to import

    return float(special.stdtrit(df, p))


def _assumed(s: Spread, m: int, n: int, floor: float) -> float:
    """The spread detectability assumes: the measured one from ``MEASURED_FROM`` processes a
    side, else at least the floor (two processes that agree by chance promise nothing)."""
    if s.measured and min(m, n) >= MEASURED_FROM:
        return s.between
    return max(s.between, floor)


@dataclass(frozen=True)
class Change:
    """``new`` against ``base`` at the process level."""

    ratio: float  # new / base in the metric (NaN: a side has no process)
    p_value: float  # NaN: nothing to test
    ci_low: float  # 95 % interval of the ratio
    ci_high: float
    spread: Spread
    detectable_pct: float  # at ``level``; inf: nothing could be
    base_processes: int
    new_processes: int
    margin: float = math.inf  # half the width of the log ratio's interval at ``level`` (the spread assumed)
    paired: bool = False  # judged on the log ratios of processes that ran side by side


def change(
    base: Measured,
    new: Measured,
    *,
    level: float = ALPHA,
    floor: float = FLOOR_CV,
    power: float = POWER,
    paired: bool = False,
) -> Change:
    """The change from ``base`` to ``new``, its p-value, its interval and what was detectable
    (see the module docstring). ``level``: the significance a lone change must reach (compare:
    alpha over the number of points; ab: over the looks too). ``paired``: the sides' processes
    of the same number ran side by side in time (``perflab ab``: A B, B A, ...), so the change is
    the mean of their log ratios, tested on those (Student's paired t): a drift or a neighbour
    that slows both of a pair cancels, where two independent samples keep it in their spread.
    Fewer than two pairs (or no process numbers): judged unpaired."""
    return changes([(base, new)], level=level, floors=[floor], power=power, paired=paired)[0]


def changes(
    sides: Sequence[tuple[Measured, Measured]],
    *,
    level: float = ALPHA,
    floors: Sequence[float] | None = None,
    power: float = POWER,
    paired: bool = False,
) -> list[Change]:
    """``change`` of each (base, new) of ``sides`` (``floors``: each one's floor, else
    ``FLOOR_CV``), the arrays of every point reduced together: a few dozen numpy calls a point
    were most of judging a compare of 1,000 points. Each figure is the one a point alone gives.

    The spread is the two sides' pooled between-process spread of their log figures (Student's
    pooled variance); paired, what the pairs' log ratios leave: sd(d) / sqrt(2), on k - 1
    degrees of freedom. With one process a side: the floor, or, where larger, what the samples'
    own spread alone makes a process's median vary by (1.2533 x the within-process spread /
    sqrt(samples): a busy machine's wide samples are no place for a 2 % floor)."""
    from scipy import special

    f = _figures(sides)
    ratios = [_pairs(base, new) if paired else None for base, new in sides]
    # every point's figures as Python numbers, read once (numpy scalars a point otherwise)
    k_of, pair_mean, pair_ss = (x.tolist() for x in _moments(_logs_each([r or [] for r in ratios])))
    within = _within_each([[*base.processes, *new.processes] for base, new in sides]).tolist()
    m_of, n_of, sd_of, df_of, diffs = (x.tolist() for x in (f.m, f.n, f.sd, f.df, f.mean_b - f.mean_a))
    out = []
    for i, (base, new) in enumerate(sides):
        floor, m, n, pairs = FLOOR_CV if floors is None else floors[i], m_of[i], n_of[i], ratios[i] is not None
        if pairs:  # np.std(ddof=1) of the log ratios, over sqrt(2)
            s = Spread(math.sqrt(pair_ss[i] / (k_of[i] - 1)) / math.sqrt(2), within[i], True, k_of[i] - 1)
        elif df_of[i] < 1:
            counts = [len(x) for x in (*base.processes, *new.processes) if len(x) >= 3]
            w = within[i]
            of_median = MEDIAN_SE * w / math.sqrt(min(counts)) if counts and math.isfinite(w) else 0.0
            s = Spread(max(floor, of_median), w, False, 0)
        else:
            s = Spread(sd_of[i], within[i], True, df_of[i])
        if not m or not n:
            out.append(Change(math.nan, math.nan, math.nan, math.nan, s, math.inf, m, n))
            continue
        diff = pair_mean[i] if pairs else diffs[i]
        k, j = (k_of[i], k_of[i]) if pairs else (m, n)  # paired: se = sd(d) / sqrt(k)
        se = s.between * math.sqrt(1 / k + 1 / j)
        if se > 0:
            t = diff / se
            p = float(2 * (special.stdtr(s.df, -abs(t)) if s.df >= 1 else NormalDist().cdf(-abs(t))))
        else:
            p = 1.0 if diff == 0 else 0.0
        z = _quantile(1 - ALPHA / 2, s.df) * se  # the test's own interval: it excludes 1 exactly where p < ALPHA
        low, high = math.exp(diff - z), math.exp(diff + z)
        sd = _assumed(s, k, j, floor)
        margin = _quantile(1 - level / 2, s.df) * sd * math.sqrt(1 / k + 1 / j)
        found = detectable(k, j, sd, s.df, level, power)
        out.append(Change(math.exp(diff), p, low, high, s, found, m, n, margin, pairs))
    return out


def detectable(m: int, n: int, sd: float, df: int, level: float = ALPHA, power: float = POWER) -> float:
    """The smallest change in percent that ``m`` against ``n`` processes of this log spread find
    with probability ``power`` at two-sided ``level``: 100 (exp(d) - 1),
    d = (t[1 - level/2] + t[power]) sd sqrt(1/m + 1/n)."""
    if not m or not n or not math.isfinite(sd):
        return math.inf
    d = (_quantile(1 - level / 2, df) + _quantile(power, df)) * sd * math.sqrt(1 / m + 1 / n)
    return 100 * math.expm1(d) if d < math.log(sys.float_info.max) else math.inf  # a tiny level at 1 df: none


def processes_needed(c: Change, pct: float, level: float = ALPHA, floor: float = FLOOR_CV) -> int | None:
    """Processes a side that would make a ``pct`` % change detectable at this spread; None
    beyond ``MOST_PROCESSES`` (no budget buys it) or for pct <= 0."""
    if not pct > 0:
        return None
    for k in range(max(2, c.base_processes, c.new_processes), MOST_PROCESSES + 1):
        sd = c.spread.between if c.spread.measured and k >= MEASURED_FROM else max(c.spread.between, floor)
        if detectable(k, k, sd, k - 1 if c.paired else 2 * k - 2, level) <= pct:
            return k
    return None
