"""The tables behind ``perflab compare``: one tree (a line per experiment, measurement and
varying config keys, with a baseline's speedup and a device count's scaling) and two trees
(every point of NEW matched with BASE's and judged by ``perflab.analysis.verdicts`` on the
model of ``perflab.analysis.replicates``). ``perflab.compare`` is their command line and
output; ``perflab ab`` judges its trees with ``ab`` here."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np
import pandas as pd

from perflab.analysis import verdicts
from perflab.analysis.frames import config_column, device_family, identity_columns, plain_text
from perflab.analysis.replicates import (
    has_metric,
    measured,
    measured_each,
    measured_points,
    metric_for,
    metric_refusal,
    samples_by_row,
    summary_rows,
)
from perflab.analysis.stats import ALPHA, Difference, compare_samples
from perflab.analysis.verdicts import DEFAULT_GATE_PCT
from perflab.config import registry
from perflab.results import Reading
from perflab.store.columns import EXACT, higher_is_better
from perflab.store.rows import Notes

COUNT_KEYS = ("cfg.devices.count", "n_devices")
NOISY_BETWEEN_RUNS = 0.10  # run-to-run coefficient of variation above this: say so
UNIT_COLUMNS = ("items_unit", "batch_unit")  # what a row's counts count (images, tokens, sequences ...)


class CompareError(ValueError):
    """A user mistake in a comparison: one line."""


class MetricError(CompareError):
    """``--metric`` names a column no row of the tree has (or one that is no figure)."""


WHERE_FORM = "KEY=VALUE (rows that have it) or KEY!=VALUE (rows that don't)"


def where_item(item: str) -> tuple[str, str, str, bool]:
    """A ``--where`` filter as (key, separator, value, whether rows equal to it are kept); the
    separator is empty where the item has none."""
    key, sep, value = item.partition("=")
    if key.endswith("!"):
        return key[:-1], "!=", value, False
    return key, sep, value, True


def select(
    df: pd.DataFrame,
    experiment: str | None = None,
    where: Sequence[str] = (),
    metric: str | None = None,
    tree: str = "",
) -> pd.DataFrame:
    """The ok rows, of one experiment, with ``KEY=VALUE`` filters; refuses a ``metric`` no row
    has (``tree``: which tree, for the message: ``NEW (path)``)."""
    if df.empty:
        said = "; ".join(df.attrs.get("notes", []))
        raise CompareError(f"{tree + ': ' if tree else ''}no rows to compare" + (f" ({said})" if said else ""))
    df = df[df["status"].astype("string") == "ok"]
    if experiment is not None:
        if experiment not in set(df["experiment"].astype("string")):
            raise CompareError(
                f"--experiment {experiment}: no ok rows of it (have: "
                f"{', '.join(sorted(set(df['experiment'].astype('string'))))})"
            )
        df = df[df["experiment"].astype("string") == experiment]
    for item in where:
        key, sep, value, keep = where_item(item)
        column = config_column(key)
        if not sep or column not in df:
            raise CompareError(f"--where {item}: allowed: {WHERE_FORM} with KEY one of the rows' columns")
        kept = df[is_value(df[column], value) == keep]
        if kept.empty:
            have = ", ".join(sorted({str(v) for v in df[column].dropna()}, key=_natural)[:12]) or "none"
            left = "no ok row has it" if keep else f"every ok row has {key}={value}"
            raise CompareError(f"--where {item}: {left}; allowed: {key}= one of {have}")
        df = kept
    if metric is not None and not has_metric(df, metric):
        raise MetricError(metric_refusal(metric, df, tree))
    return df.copy()  # one block per dtype again: a loaded tree is fragmented


def figures(rows: pd.DataFrame, samples: Mapping[str, np.ndarray]) -> list[tuple[str, Any]]:
    """(experiment, figure) for every figure the experiments' report hooks draw from these rows:
    ``--plot`` writes the figures the HTML report shows."""
    out = []
    for name, part in rows.groupby(rows["experiment"].astype("string"), sort=True, observed=True):
        experiment = registry.of_rows(part)
        if experiment is not None:
            out += [(str(name), f) for f in experiment.section(part, samples).figures]
    return out


def compare(
    *paths: str | Path,
    by: Sequence[str] | None = None,
    baseline: str | None = None,
    metric: str | None = None,
    experiment: str | None = None,
    where: Sequence[str] = (),
    rows: pd.DataFrame | None = None,
    samples: Mapping[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """The comparison table of one tree as a DataFrame (see the module docstring).

    ``rows``: a DataFrame from ``load()`` to use instead of ``paths``; ``samples``: their raw
    sample seconds by row id (``samples_by_row``), for significance tests and error bars.
    ``df.attrs["notes"]`` holds the lines worth showing (pooled configs, differing metrics,
    suspect figures). Each line's raw values of its metric are in its ``_samples`` column.
    """
    tree = ", ".join(map(str, paths)) if rows is None else ""
    reading = Reading(*paths)  # the rows, then their samples: each tree walked once
    df = select(reading.rows() if rows is None else rows, experiment, where, metric, tree=tree)
    if baseline:
        _check_baseline(df, baseline)
    if samples is None:
        samples = samples_by_row(paths, row_ids=df["row_id"], reading=reading) if rows is None else {}
    tables, notes = [], []
    for name, part in df.groupby(df["experiment"].astype("string"), sort=True):
        table, more = _one_experiment(str(name), summary_rows(str(name), part), by, baseline, metric, samples)
        tables.append(table)
        notes += more
    out = pd.concat(tables, ignore_index=True, sort=False) if tables else pd.DataFrame()
    out.attrs["notes"] = notes
    return out


def _check_baseline(df: pd.DataFrame, baseline: str) -> None:
    """``KEY=VALUE`` names a key of these rows and a value some ok row has (in any experiment:
    each experiment finds its baseline among its own rows that have the key)."""
    key, sep, value = baseline.partition("=")
    column = config_column(key)
    varying = [c for c in identity_columns(df) if df[c].astype("string").nunique(dropna=True) > 1]
    known = ", ".join(sorted(c.removeprefix("cfg.") for c in varying)) or "none (no key varies here)"
    if not sep or not key:
        raise CompareError(f"--baseline {baseline}: allowed: KEY=VALUE with KEY a key that varies: {known}")
    if column not in df or df[column].isna().all():
        raise CompareError(f"--baseline {baseline}: not a key of these results; allowed: a key that varies: {known}")
    if not is_value(df[column], value).any():
        have = ", ".join(sorted({str(v) for v in df[column].dropna()}, key=_natural))
        raise CompareError(f"--baseline {baseline}: no ok row has {key}={value}; allowed: {key}= one of {have}")


def _natural(text: str) -> tuple[float, str]:
    try:
        return (float(text), "")
    except ValueError:
        return (math.inf, text)


def is_value(column: pd.Series, value: str) -> pd.Series:
    """Which cells of ``column`` equal ``value`` as typed on a command line (``1`` matches an
    integer key 1, ``0.10`` a float 0.1; text compares as text)."""
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        try:
            return (column == float(value)).fillna(False).astype(bool)
        except ValueError:
            return pd.Series(False, index=column.index)
    return (column.astype("string") == value).fillna(False).astype(bool)


def _one_experiment(
    name: str,
    df: pd.DataFrame,
    by: Sequence[str] | None,
    baseline: str | None,
    asked: str | None,
    samples: Mapping[str, np.ndarray],
) -> tuple[pd.DataFrame, list[str]]:
    metric, note = metric_for(name, df, asked)
    module = registry.of_rows(df)
    beside = module.hooks.BESIDE if module else ()
    notes = [note] if note else []
    identity = identity_columns(df)
    if by:
        keys = [config_column(k) for k in by]
        missing = [k for k in keys if k not in df]
        if missing:
            some = [c for c in identity if df[c].astype("string").nunique() > 1] or identity[:5]
            raise CompareError(
                f"--by {', '.join(k.removeprefix('cfg.') for k in missing)}: not a key of {name}'s results; "
                f"allowed: a config key, e.g. {', '.join(c.removeprefix('cfg.') for c in some)}"
            )
    else:
        keys = [c for c in identity if df[c].astype("string").nunique(dropna=False) > 1]
    if baseline and config_column(baseline.partition("=")[0]) in df:  # a key no other ok point varies
        keys = list(dict.fromkeys([*keys, config_column(baseline.partition("=")[0])]))
    if "device_name" in df:
        df = df.assign(device=_device(df["device_name"]))
        if df["device"].nunique() > 1 and "device" not in keys:
            keys.append("device")  # different hardware is never pooled
    if "subject" in df and df["subject"].astype("string").nunique() > 1 and "subject" not in keys:
        keys.append("subject")  # nor different code under test (a commit each): a line per subject
    if "model_digest" in df and "model_digest" not in keys and rewritten(df, identity):
        keys.append("model_digest")  # nor a model folder rewritten between runs: a line per contents
    group = list(dict.fromkeys(["measurement", *keys]))
    df = df.reset_index(drop=True)
    codes = df.groupby(group, dropna=False, sort=True, observed=True).ngroup().to_numpy()
    n = int(codes.max()) + 1 if len(codes) else 0
    found = measured_points(df, codes, n, metric, samples)  # every point's figures, in one pass
    firsts = np.unique(codes, return_index=True)[1]
    # each point's keys, as its rows hold them (text listed at once: not a scalar at a time from Arrow)
    label = {c: _listed(df[c].iloc[firsts]) for c in group}
    runs = _distinct(codes, df["run_id"], n)
    differ = {c: _distinct(codes, df[c], n) > 1 for c in identity if c not in keys}
    pooled = [""] * n  # the keys a point's runs differ in
    for i in np.flatnonzero(np.logical_or.reduce([*differ.values(), np.zeros(n, bool)])).tolist():
        pooled[i] = ", ".join(c.removeprefix("cfg.") for c, many in differ.items() if many[i])
    noisy = (runs > 1) & (found.processes > 1) & ~np.isnan(found.cv)
    left_out = [", ".join(x) for x in found.left_out]
    # the table's columns, each a list a point; None: every point has it, else which points do
    columns: dict[str, tuple[list, np.ndarray | None]] = {
        "experiment": ([name] * n, None),
        **{c: (values, None) for c, values in label.items()},
        "metric": ([metric] * n, None),
        metric: (found.value.tolist(), None),
        "runs": (runs.tolist(), None),
        "left_out": (left_out, np.array([bool(x) for x in left_out], bool)),
        "cv_between_runs": (found.cv.tolist(), noisy),
        "_samples": (found.samples, None),
        "iqr_pct": (found.iqr_pct.tolist(), ~np.isnan(found.iqr_pct)),
        **{  # what the experiment wants seen beside speed
            c: (pd.to_numeric(df[c], errors="coerce").groupby(codes).median().to_numpy().tolist(), None)
            for c in beside
            if c in df and c != metric
        },
        **{  # each point keeps its rows' units: a table may mix images and tokens
            c: ([str(v) for v in first.tolist()], first.notna().to_numpy(bool))
            for c in UNIT_COLUMNS
            if c in df
            for first in [df[c].groupby(codes).first().reindex(range(n))]
        },
        "pooled": (pooled, np.array([bool(x) for x in pooled], bool)),
        "suspect": (_texts_by(codes, df.get("suspect"), n), None),
        "_busy": (busy_rows(df).groupby(codes).any().reindex(range(n), fill_value=False).tolist(), None),
        "_threads": (_one_value(codes, _device_threads(df), n), None),
    }
    said = columns["left_out"][1] | noisy | columns["pooled"][1]  # what a point's lines say, in its order
    for i in np.flatnonzero(said).tolist():
        measurement = label["measurement"][i]
        if left_out[i]:
            notes.append(f"{name} {measurement}: left out {left_out[i]}")
        if noisy[i] and found.cv[i] > NOISY_BETWEEN_RUNS:
            where = ", ".join(f"{k.removeprefix('cfg.')}={v[i]}" for k, v in label.items())
            notes.append(f"{name} {where}: {metric} varies {found.cv[i]:.0%} between runs ({runs[i]} runs)")
        if pooled[i]:
            notes.append(
                f"{name} {measurement}: {runs[i]} runs pooled although they differ in {pooled[i]} "
                "(add --by to separate them)"
            )
    out = _frame(columns, n)
    if baseline:
        out = _against_baseline(out, keys, metric, baseline, name, notes)
    count = next((k for k in keys if k in COUNT_KEYS), None)
    if count and higher_is_better(metric):
        out = _scaling(out, keys, metric, count, df)
        for i, why in out["scaling_note"].dropna().items():
            out.loc[i, "suspect"] = "; ".join(x for x in (str(out.at[i, "suspect"] or ""), why) if x)
            notes.append(f"{name} {out.at[i, 'measurement']} at {count.removeprefix('cfg.')}={out.at[i, count]}: {why}")
    return out.drop(columns=["_busy", "_threads"], errors="ignore"), notes


def _listed(column: pd.Series) -> list:
    """A column's values, each as iterating it gives it (an Int64's as numpy integers)."""
    return column.tolist() if isinstance(column.dtype, pd.StringDtype) else list(column)


def _frame(columns: dict[str, tuple[list, np.ndarray | None]], count: int) -> pd.DataFrame:
    """A row a point from ``columns`` (a value a point, and which points have one: None, all),
    NaN where a point has none, the columns in the order a list of a dict a point made them:
    each where it first appears (the order the tables and their JSON keep)."""
    first = {}  # the first point that has each column (a column no point has: none)
    for c, (_, has) in columns.items():
        if has is None or has.any():
            first[c] = 0 if has is None else int(np.argmax(has))
    names = sorted(first, key=first.__getitem__)  # stable: in their own order where they appear together
    cells = [
        values if has is None else [v if h else np.nan for v, h in zip(values, has.tolist())]
        for values, has in (columns[c] for c in names)
    ]
    return pd.DataFrame(list(zip(*cells)), columns=names) if count else pd.DataFrame()


def _distinct(codes: np.ndarray, column: pd.Series, groups: int) -> np.ndarray:
    """How many distinct values (as text, an empty cell one of them) ``column`` holds in each
    group (``codes``: each row's group): one pass over the column, not a frame per group."""
    values, _ = pd.factorize(column.astype("string"), use_na_sentinel=False)
    width = int(values.max()) + 1 if len(values) else 1
    pairs = np.unique(codes.astype(np.int64) * width + values)
    return np.bincount(pairs // width, minlength=groups)


def _texts_by(codes: np.ndarray, column: pd.Series | None, groups: int) -> list[str]:
    """Each group's distinct non-empty texts of ``column``, sorted, joined by "; "."""
    out = [""] * groups
    if column is None:
        return out
    found = pd.DataFrame({"g": codes, "t": column.astype("string").to_numpy()}).dropna().drop_duplicates()
    found = found[found["t"].str.strip() != ""].sort_values(["g", "t"])
    for g, joined in found.groupby("g")["t"].agg("; ".join).items():
        out[int(g)] = joined
    return out


def _one_value(codes: np.ndarray, column: pd.Series | None, groups: int) -> list[Any]:
    """Each group's value of ``column`` where it holds one (empty cells aside), else None."""
    out: list[Any] = [None] * groups
    if column is None:
        return out
    found = pd.DataFrame({"g": codes, "v": column.to_numpy()}).dropna().drop_duplicates()
    single = found[found["g"].map(found["g"].value_counts()) == 1]
    for g, v in single.itertuples(index=False):
        out[int(g)] = v
    return out


BUSY = "the machine was busy"  # how a row's suspect says it, in rows older than the busy column
CPU_TIME = "cpu_median_s"  # what a busy point is judged by, where its rows have it


def _cpu_timed(rows: pd.DataFrame) -> pd.Series:
    """Which rows carry the CPU time of their threads (host work measured by perflab.measure.bench)."""
    if CPU_TIME not in rows:
        return pd.Series(False, index=rows.index)
    return pd.to_numeric(rows[CPU_TIME], errors="coerce").gt(0).fillna(False).astype(bool)


def busy_rows(rows: pd.DataFrame) -> pd.Series:
    """Which rows were measured on a machine too busy for a clean figure: their ``busy`` flag,
    or (rows written before it) their suspect reason."""
    flagged = rows["busy"].fillna(False).astype(bool) if "busy" in rows else pd.Series(False, index=rows.index)
    if "suspect" in rows:
        flagged |= rows["suspect"].astype("string").str.contains(BUSY, regex=False).fillna(False).astype(bool)
    return flagged


def _device_threads(rows: pd.DataFrame) -> pd.Series | None:
    """``threads_of`` each row's ``device_name`` (made once per distinct name), or None."""
    if "device_name" not in rows:
        return None
    return pd.Series(_texts(rows["device_name"], threads_of), index=rows.index, dtype=object)


def threads_of(device_name: object) -> int | None:
    """The threads of each CPU device a row's ``device_name`` names ("CPU (2 threads)"), or None."""
    import re

    found = re.fullmatch(r"CPU \((\d+) threads?\)", str(device_name).strip())
    return int(found.group(1)) if found else None


def _point_keys(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The columns that name a point, as text to match on (an empty cell matches an empty one)."""
    return df[columns].astype("string").fillna("")


def _against_baseline(
    out: pd.DataFrame, keys: list[str], metric: str, baseline: str, name: str, notes: list[str]
) -> pd.DataFrame:
    key, _, value = baseline.partition("=")
    key = config_column(key)
    is_base = is_value(out[key], value) if key in out else pd.Series(False, index=out.index)
    if not is_base.any():  # another experiment's key or value: this one has no baseline
        notes.append(f"{name}: no baseline: none of its points has {baseline}")
        return out
    others = ["measurement", *(k for k in keys if k not in (key, "model_digest"))]  # a rewritten folder's baseline too
    higher = higher_is_better(metric)
    left = _point_keys(out, others).assign(_row=out.index)
    right = _point_keys(out[is_base], others).assign(_base=out.index[is_base.to_numpy()])
    matched = left.merge(right.drop_duplicates(others), on=others, how="left")  # the first baseline of each point
    base_of = matched.set_index("_row")["_base"].reindex(out.index)
    speedups, words = [], []
    for row, base in base_of.items():
        if pd.isna(base):
            speedups.append(math.nan)
            words.append("no baseline")
            continue
        ratio = out.at[row, metric] / out.at[base, metric]
        speedups.append(ratio if higher else 1 / ratio)
        if base == row:
            words.append("baseline")
        else:
            words.append(_verdict(out.at[base, "_samples"], out.at[row, "_samples"], higher, metric).words)
    return out.assign(speedup_vs_baseline=speedups, significance=words)


def rewritten(df: pd.DataFrame, identity: Sequence[str]) -> bool:
    """Whether one config's rows hold two model contents (``model_digest``: its folder rewritten
    between runs). Two folders are two configs already (``model.name``): no key of their own."""
    if df["model_digest"].nunique() < 2:  # one contents or none (no folder model): nothing to look at
        return False
    cols = [c for c in identity if c in df]
    both = df[[*cols, "model_digest"]].astype("string")
    return len(both.drop_duplicates()) > len(both[cols].drop_duplicates())


def _verdict(base: np.ndarray, new: np.ndarray, higher: bool, metric: str) -> Difference:
    if not len(base) or not len(new):
        return Difference(math.nan, math.nan, math.nan, math.nan, f"no raw samples of {metric} to test")
    return compare_samples(base, new, higher_is_better=higher)


def _scaling(out: pd.DataFrame, keys: list[str], metric: str, count: str, rows: pd.DataFrame) -> pd.DataFrame:
    """Speedup S(n) and efficiency E(n) = S(n) / n within each group of the other keys, and
    ``scaling_note``: why an efficiency above 100 % is suspect, where one is (``_above_linear``)."""
    others = ["measurement", *(k for k in keys if k not in (count, "model_digest"))]
    out = out.copy()
    out[count] = pd.to_numeric(out[count])
    keyed = _point_keys(out, others)
    measured = keyed.assign(_n=out[count], _v=out[metric], _i=out.index)[out[count].notna()]  # null: "auto"
    # Each group's reference: its smallest count measured (S(n) is scaled linearly to one device).
    ref = (
        measured.sort_values("_n", kind="stable")
        .groupby(others, sort=False, dropna=False)
        .agg(ref_n=("_n", "first"), ref_v=("_v", "first"), points=("_n", "size"), _ref_row=("_i", "first"))
        .reset_index()
    )
    refs = keyed.assign(_row=out.index).merge(ref, on=others, how="left").set_index("_row").reindex(out.index)
    speedup = out[metric] / refs["ref_v"] * refs["ref_n"]
    alone = (refs["points"] == 1) & (refs["ref_n"] > 1)  # nothing to scale against: never a made-up 1.0
    out["speedup"] = speedup.mask(out[count].isna() | refs["ref_n"].isna() | alone)
    out["efficiency"] = out["speedup"] / out[count]
    out["scaling_note"] = [
        _above_linear(row, out.loc[ref] if pd.notna(ref) else None, count)
        for (_, row), ref in zip(out.iterrows(), refs["_ref_row"])
    ]
    if metric == "items_per_s":
        out["per_device_items_per_s"] = out[metric] / out[count]
    if "cfg.trainer.scaling" in rows:
        out["scaling"] = rows["cfg.trainer.scaling"].astype("string").iloc[0]
    return out


def _above_linear(row: pd.Series, ref: pd.Series | None, count: str) -> str | None:
    """Why a point's efficiency above 100 % (faster than linear in its devices) is suspect, its
    likely cause first: devices of other threads than the reference's (not like with like), a
    busy machine under either point, else a cache effect or one run's noise. None at or below 100 %."""
    e = row.get("efficiency")
    if ref is None or pd.isna(e) or e <= 1:
        return None
    n, ref_n = f"{row[count]:g}", f"{ref[count]:g}"
    head = f"efficiency {e:.0%} above 100 % on {n} devices"
    if row.get("_threads") and ref.get("_threads") and row["_threads"] != ref["_threads"]:
        return (
            f"{head}: each device ran {row['_threads']} thread(s) where the {ref_n}-device point's ran "
            f"{ref['_threads']}: not like with like (devices.threads sets them, the same at every count)"
        )
    if ref.get("_busy") or row.get("_busy"):
        which = f"the {ref_n}-device point" if ref.get("_busy") else "this point"
        return f"{head}: {which} was measured on a busy machine (its suspect says why): measure both where it is quiet"
    return (
        f"{head}: faster than linear: more of the work fits each device's cache, or one run's noise "
        "(bench.processes=3 measures it)"
    )


# --- two trees ----------------------------------------------------------------------------------


def ab(
    base: str | Path,
    new: str | Path,
    *,
    metric: str | None = None,
    experiment: str | None = None,
    where: Sequence[str] = (),
    any_device: bool = False,
    gate_pct: float = DEFAULT_GATE_PCT,
    alpha: float = ALPHA,
    allow_mixed: bool = False,
    process_cv: float | None = None,
    looks: int = 1,
    differ: Sequence[str] = (),
    explained: Collection[str] = (),
    busy: str = "undecided",
    paired: bool = False,
) -> pd.DataFrame:
    """Every point of ``new`` against the same point (config, and device unless ``any_device``)
    of ``base``, with one verdict each (``perflab.analysis.verdicts``): PASS, FAIL, INCONCLUSIVE (with the
    repeats that would do), INCOMPARABLE (the machine identity fields that differ; judged anyway
    with ``allow_mixed``). ``gate_pct``: the slowdown a FAIL must exceed; ``alpha``: the false
    discovery rate over all points (Benjamini-Hochberg); ``process_cv``: the between-process
    variation assumed where a side has one process (None: as the trees measured it,
    ``perflab.analysis.floor``); ``looks``: how often ``perflab ab`` has
    looked at these trees (a Bonferroni correction over them); ``differ``: config keys the two
    sides set apart on purpose (``perflab ab --base K=V --new K=W``), left out of what matches a
    point; ``explained``: machine identity fields the sides differ in on purpose (``perflab ab``'s
    another environment or interpreter: ``Side.explains``), said, not INCOMPARABLE; ``busy``:
    what rows flagged busy do (``busy_rows``: wall times a busy machine made are never judged):
    where every row of the point carries the CPU time of its threads (``cpu_median_s``), that is
    judged instead, and the point's ``judged`` says so; else ``undecided``, the point is
    INCONCLUSIVE with the cause (compare), or ``left_out``, those rows are left out, said, and
    the point judged by its other processes (``perflab ab``, which measures more of them), or
    ``alike`` with ``paired``, judged as pairs all the same (``perflab ab``'s rounds of one
    process measuring both sides in turns, sample by sample: the machine's state fell on both);
    ``paired``: the sides' processes of the same number ran side by side (``perflab ab``), judged
    as pairs (``replicates.change``). Points in one tree only are rows too, ``change`` saying which.
    ``df.attrs["notes"]`` holds the lines worth showing."""
    read = {"BASE": Reading(base), "NEW": Reading(new)}  # each side's rows, then their samples: walked once
    a = select(read["BASE"].rows(), experiment, where, metric, tree=f"BASE ({base})")
    b = select(read["NEW"].rows(), experiment, where, metric, tree=f"NEW ({new})")
    if busy == "left_out":  # a busy row with no CPU time to judge instead: measured again
        unjudgeable = {side: busy_rows(x) & ~_cpu_timed(x) for side, x in (("base", a), ("new", b))}
        left_busy = {side: int(x.sum()) for side, x in unjudgeable.items()}
        a, b = a[~unjudgeable["base"]], b[~unjudgeable["new"]]
    said = {"BASE": Notes(), "NEW": Notes()}  # samples left out when read, by row id
    samples = {  # only the rows compared: a tree's index reads no other samples
        **samples_by_row([base], said["BASE"], row_ids=a["row_id"], reading=read["BASE"]),
        **samples_by_row([new], said["NEW"], row_ids=b["row_id"], reading=read["NEW"]),
    }
    entries, notes = [], []
    pooled: list[tuple[dict[str, Any], verdicts.ComparedPoint]] = []  # the points in both trees, to judge
    apart = {config_column(k) for k in differ}  # set apart on purpose: not what matches a point
    of_a, of_b = a["experiment"].astype("string"), b["experiment"].astype("string")  # once, not per experiment
    for name in sorted(set(of_a.unique()) | set(of_b.unique())):
        pa = summary_rows(name, a[of_a == name])
        pb = summary_rows(name, b[of_b == name])
        pa, pb = _own_keys(pa, pb)
        both = pd.concat([pa, pb])
        m, note = metric_for(name, both, metric)
        notes += [note] if note else []
        counted = [c for c in sorted(EXACT - {m}) if all(c in x and x[c].notna().any() for x in (pa, pb))]
        notes += [f"{name}: both trees count {c}: --metric {c} judges them, exactly" for c in counted]
        key_cols = sorted((set(identity_columns(pa)) | set(identity_columns(pb))) - apart)
        match_on = ["measurement", *key_cols, *([] if any_device else ["device"])]
        ga, gb = _points(pa, match_on), _points(pb, match_on)
        va_, vb_ = _Cells(pa), _Cells(pb)
        varying = [c for c in key_cols if _texts_differ(both[c])]
        points = sorted(set(ga) | set(gb))
        in_both = [point for point in points if point in ga and point in gb]
        frames = m in EXACT  # only an exact metric's verdict reads a side's rows back (its *_spread_pct)
        measured_a = dict(zip(in_both, measured_each(pa, [ga[x] for x in in_both], m, samples, said["BASE"], frames)))
        measured_b = dict(zip(in_both, measured_each(pb, [gb[x] for x in in_both], m, samples, said["NEW"], frames)))
        differing: list[str] = []  # points whose model folder's contents differ between the sides
        cells = {id(x): {k: _column(x, k) for k in varying} for x in (pa, pb)}  # read once, not per point
        ids_a, ids_b = (x["row_id"].astype(str).to_numpy() for x in (pa, pb))  # as text once, not a column a point
        for point in points:
            label = dict(zip(match_on, point))
            rows, at = (pa, ga[point]) if point in ga else (pb, gb[point])
            entry: dict[str, Any] = {
                "experiment": name,
                "measurement": label["measurement"],
                **{k: _native(v[at]) for k, v in cells[id(rows)].items()},
                "metric": m,
                "_name": dashboard_name(name, label, varying),
            }
            if not any_device:
                entry["device"] = label["device"]
            if point not in ga or point not in gb:
                entry["change"] = "only in " + ("new" if point not in ga else "base")
                entries.append(entry)
                continue
            ia, ib = ga[point], gb[point]
            sides = {"BASE": measured_a[point], "NEW": measured_b[point]}
            busy_sides = [side for side, c, i in (("base", va_, ia), ("new", vb_, ib)) if c.busy[i].any()]
            judged = m
            if busy_sides and m not in EXACT and _cpu_timed(pa.iloc[ia]).all() and _cpu_timed(pb.iloc[ib]).all():
                # a neighbour's share is in the wall time, not in the CPU time of our own threads
                judged, busy_sides = CPU_TIME, []
                sides = {"BASE": measured(pa.iloc[ia], judged, {}), "NEW": measured(pb.iloc[ib], judged, {})}
                entry.update(metric=judged, judged=f"{CPU_TIME}: {m} was measured on a busy machine")
            elif busy_sides and busy == "alike" and paired:
                # both sides in one process each round, sample by sample: the machine fell on a pair alike
                busy_sides = []
                entry.update(judged=f"{m}: busy, as pairs measured in turns in one process")
            va, vb = (_geomean(x.figures) for x in sides.values())
            mismatch, unknown = _differences(va_.identity(ia), vb_.identity(ib))
            on_purpose = [d for d in mismatch if d.partition(":")[0] in explained]
            mismatch = [d for d in mismatch if d not in on_purpose]
            if on_purpose:
                notes.append(f"{name}: the sides differ on purpose in {'; '.join(on_purpose)} (the change under test)")
            contents = va_.contents(ia), vb_.contents(ib)
            if all(contents) and contents[0] != contents[1]:
                differing.append(entry["_name"])
            left = "; ".join(f"in {side}: {', '.join(x.left_out)}" for side, x in sides.items() if x.left_out)
            entry.update(
                base=va,
                new=vb,
                identity="; ".join(mismatch),
                base_processes=sides["BASE"].n_processes,
                new_processes=sides["NEW"].n_processes,
                _samples=sides["NEW"].samples,
                _base_ids=ids_a[ia].tolist(),  # the point's rows: its operators (attribution)
                _new_ids=ids_b[ib].tolist(),
            )
            flagged = {"base": va_.suspects(ia), "new": vb_.suspects(ib)}
            entry["suspect"] = " | ".join(f"{side}: {why}" for side, why in flagged.items() if why)
            if unknown:
                notes.append(f"{name} {label['measurement']}: identity not checked for {', '.join(unknown)}")
            if left:
                entry["left_out"] = left
                notes.append(f"{entry['_name']}: left out {left}")
            entries.append(entry)
            compared = verdicts.ComparedPoint(
                name,
                entry["_name"],
                judged,
                sides["BASE"],
                sides["NEW"],
                higher=higher_is_better(judged),
                identity=entry["identity"],
                busy=tuple(busy_sides),
                suspect=entry["suspect"],
                left_out=left,
            )
            if verdicts.empty(compared):  # nothing of this point to judge on a side: said, never a pass
                decision = verdicts.decide(compared, None, verdicts.Gate(gate_pct, alpha, allow_mixed))
                entry.update(verdict=decision.verdict.value, why=decision.why)
                continue
            pooled.append((entry, compared))
        if differing:  # said once per experiment, not once per point
            some = ", ".join(differing[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
            notes.append(f"{name} ({some}): {MODEL_CONTENTS_DIFFER}")
    results = verdicts.judge([p for _, p in pooled], gate_pct, alpha, allow_mixed, process_cv, looks, paired)
    shared, whys = verdicts.said_once([decision for _, decision in results])
    notes += shared
    for (entry, compared), (stats, decision), why in zip(pooled, results, whys):
        entry.update(stats.columns(compared.metric) if stats else {})
        entry.update(verdict=decision.verdict.value, why=why)
    if busy == "left_out" and any(left_busy.values()):
        notes.append(
            "left out rows measured on a busy machine, to be measured again: "
            + ", ".join(f"{n} of {side}" for side, n in left_busy.items() if n)
            + " (with no CPU time of their threads to judge instead: one thread, or OMP_WAIT_POLICY=passive, "
            "records it)"
        )
    out = pd.DataFrame(entries)
    first = [c for c in AB_FIRST if c in out] + [c for c in out if c.startswith("cfg.")]
    out = out[first + [c for c in out if c not in first]]
    if out.empty or "verdict" not in out:
        others = "" if any_device else " (points matched on device too: --any-device compares across devices)"
        notes.append(f"no point is in both trees{others}")
    out.attrs["notes"] = list(dict.fromkeys(notes))
    out.attrs["gate_pct"], out.attrs["alpha"] = gate_pct, alpha
    out.attrs["left_busy"] = sum(left_busy.values()) if busy == "left_out" else 0
    return out


AB_FIRST = (
    *("experiment", "measurement", "device", "metric", "base", "new", "change_pct", "verdict", "why"),
    *("base_processes", "new_processes", "change", "judged"),
)
# (the suspect column follows: a verdict on measurements taken on a busy machine says so)


def _geomean(figures: np.ndarray) -> float:
    """A side's figure: the geometric mean of its processes' (their median with one)."""
    return float(np.exp(np.log(figures).mean())) if len(figures) else math.nan


def _column(df: pd.DataFrame, key: str) -> np.ndarray:
    """``df``'s cells of ``key`` as objects; all empty where it lacks the key (one side sets a
    config key the other does not: ``+model.inject=...`` on one side only)."""
    return df[key].to_numpy(object) if key in df else np.full(len(df), None, dtype=object)


def _native(values: np.ndarray) -> object:
    """A key's value as the rows hold it (an integer stays one), for the table: its first cell
    that is not empty, or None."""
    v = next((x for x in values.tolist() if not pd.isna(x)), None)
    if v is None:
        return None
    return int(v) if isinstance(v, float) and v.is_integer() else v.item() if hasattr(v, "item") else v


def dashboard_name(experiment: str, label: dict[str, str], varying: list[str]) -> str:
    """A point's stable name for a dashboard: the experiment's own keys always (so a point's
    name does not change when another point joins), other keys where they vary, the device."""
    keys = [k for k in label if k.startswith("cfg.experiment.") or k in varying]
    parts = [experiment, label["measurement"], *(f"{k.removeprefix('cfg.')}={label[k]}" for k in keys)]
    return " / ".join(parts + ([label["device"]] if label.get("device") else []))


# Two trees' rows of one model folder whose contents differ (rewritten weights or config): paired
# as the same config, as a user comparing old and new weights wants, and said.
MODEL_CONTENTS_DIFFER = (
    "the model's contents differ between the sides (model_digest: its folder's config or weights were "
    "rewritten, or copied without their modification times): compared as the same config"
)


def _differences(base: dict[str, set[str]], new: dict[str, set[str]]) -> tuple[list[str], list[str]]:
    """(``field: base vs new`` for each machine identity field (``environment.IDENTITY``) whose
    values (``_Cells.identity``) differ between the two sides; fields one side did not record, unchecked)."""
    from perflab.measure.environment import IDENTITY

    differ, unknown = [], []
    for field in IDENTITY:
        va, vb = base.get(field, set()), new.get(field, set())
        if not va and not vb:
            continue
        if not va or not vb:
            unknown.append(field)
        elif va != vb:
            differ.append(f"{field}: {', '.join(sorted(va))} vs {', '.join(sorted(vb))}")
    return differ, unknown


class _Cells:
    """One side's rows of an experiment with the cells a point's checks read (its machine
    identity, its suspect reasons) made text once per distinct value, read by row positions:
    a frame per point, and a Python set over each of its cells, were most of a compare of two
    100k-row trees."""

    def __init__(self, rows: pd.DataFrame) -> None:
        from perflab.measure.environment import IDENTITY

        self.rows = rows
        self.plain = {f: _texts(rows[f], plain_text) for f in IDENTITY if f in rows}
        self.suspect = _texts(rows["suspect"], str) if "suspect" in rows else None
        self.busy = busy_rows(rows).to_numpy()
        self.digest = _texts(rows["model_digest"], plain_text) if "model_digest" in rows else None

    def identity(self, at: np.ndarray | slice = slice(None)) -> dict[str, set[str]]:
        """Each identity field's values (as ``plain_text``) in the rows at ``at``."""
        return {f: set(t[at].tolist()) - {None, ""} for f, t in self.plain.items()}

    def contents(self, at: np.ndarray) -> set[str]:
        """The model folder digests (``model_digest``) of the rows at ``at``."""
        return set(self.digest[at].tolist()) - {None, ""} if self.digest is not None else set()

    def suspects(self, at: np.ndarray) -> str:
        """The distinct suspect reasons of the rows at ``at`` ("" if none)."""
        found = set(self.suspect[at].tolist()) - {None} if self.suspect is not None else set()
        return "; ".join(sorted(s for s in found if s.strip()))


def _texts(column: pd.Series, fn: Callable[[Any], Any], empty: str | None = None) -> np.ndarray:
    """``fn`` of each cell of ``column``, ``empty`` where it is empty; ``fn`` runs once per distinct value."""
    codes, uniques = pd.factorize(column)
    return np.array([*map(fn, uniques), empty], dtype=object)[codes]


def _texts_differ(column: pd.Series) -> bool:
    """Whether ``column`` holds more than one value as text (an empty cell one of them): its
    distinct values made text, not every cell (a compare of 100k rows spent 0.1 s here)."""
    return pd.Series(column.unique()).astype("string").nunique(dropna=False) > 1


def _own_keys(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One experiment's rows of both sides without the config keys neither side's rows set
    (other experiments' keys, empty here): an empty key matches an empty one, so they judge
    nothing, but matching points on a hundred empty keys took most of a large compare."""
    empty = [c for c in a if c.startswith("cfg.") and a[c].isna().all() and (c not in b or b[c].isna().all())]
    empty += [c for c in b if c.startswith("cfg.") and c not in a and b[c].isna().all()]
    return a.drop(columns=empty, errors="ignore"), b.drop(columns=empty, errors="ignore")


def _points(df: pd.DataFrame, columns: list[str]) -> dict[tuple, np.ndarray]:
    """Each point's row positions in ``df``, by its values in ``columns`` as text (an empty cell
    matches an empty one; a column ``df`` lacks is empty; ``device``: the device's family), in one
    grouping: a frame per point was most of a large compare."""
    derived = {"device": _device(df["device_name"])} if "device_name" in df else {}
    if not any(c in df or c in derived for c in columns) or df.empty:
        return {}
    keys = pd.DataFrame({c: derived[c] if c in derived else df.get(c, np.nan) for c in columns}, index=df.index)
    codes = keys.groupby(columns, dropna=False, sort=True).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
    firsts = keys.iloc[[g[0] for g in groups]].itertuples(index=False, name=None)
    return {tuple(plain_text(v) if not pd.isna(v) else "" for v in k): g for k, g in zip(firsts, groups)}


def _device(names: pd.Series) -> pd.Series:
    """``names.map(device_family)``, the family made once per distinct name (an empty name maps
    as map maps it: its text)."""
    empty = names[names.isna()]
    out = _texts(names, device_family, device_family(empty.iloc[0]) if len(empty) else None)
    return pd.Series(out, index=names.index, dtype=object)
