"""Compare results: within one tree, or two trees A/B.

    perflab compare PATH [--by KEY ...] [--baseline KEY=VALUE] [--plot DIR]
    perflab compare BASE NEW [--fail-if-slower PCT]

One tree: one line per (experiment, measurement, config keys: by default the keys that vary),
each experiment with its own metric (training: items/s of its summary row; matmul: TFLOP/s;
others: median time) unless ``--metric`` says otherwise. Nothing is dropped: an experiment
without the asked metric keeps its own, and says so. Rows of different configs that land in
one line are said to be pooled (and which keys differ). ``--baseline KEY=VALUE`` adds the
speedup over that point and a significance test on the raw samples; a device count among the
keys adds S(n) = throughput(n) / throughput(1 device) and E(n) = S(n) / n.

Two trees: points matched by config and device; per point the change, its significance (false
discovery rate over all points: ``--alpha``) and one verdict of ``perflab.analysis.verdicts``: PASS,
FAIL, INCONCLUSIVE (how many more repeats would do) or INCOMPARABLE (which machine identity
fields differ; ``--allow-mixed`` judges them anyway). ``--fail-if-slower PCT`` sets the gate
(default 10 %). Exit codes: 0 pass, 1 fail, 2 usage error, 3 could not judge (a crash too:
one line, the traceback with ``PERFLAB_DEBUG=1``). A row whose metric, or a sample whose
time, is NaN, not a number or <= 0 is left out of its point and said; a point left with
nothing to judge is INCONCLUSIVE.

Ratio, speedup and the significance words all come from the same metric in its own
direction: higher is better for rates (tested on per-sample rates), lower for times.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from perflab.analysis.frames import config_column, device_family, identity_columns, sample_values
from perflab.analysis.stats import (
    ALPHA,
    Difference,
    compare_samples,
    detectable_change,
    fdr,
    repeats_needed,
    usable,
)
from perflab.analysis.verdicts import (
    DEFAULT_GATE_PCT,
    PASS_EXIT,
    UNJUDGED_EXIT,
    USAGE_EXIT,
    Verdict,
    could_not_judge,
    exit_code,
    meaning,
)
from perflab.config import registry
from perflab.errors import ConfigError, OneLineParser
from perflab.results import load
from perflab.store import files
from perflab.store.columns import JUDGED, RATES, higher_is_better, unit_of
from perflab.store.rows import Notes

COUNT_KEYS = ("cfg.devices.count", "n_devices")
SUPERLINEAR = 1.1  # efficiency above this is physically suspect
NOISY_BETWEEN_RUNS = 0.10  # run-to-run coefficient of variation above this: say so
UNIT_COLUMNS = ("items_unit", "batch_unit")  # what a row's counts count (images, tokens, sequences ...)


class CompareError(ValueError):
    """A user mistake in a comparison: one line."""


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
        key, sep, value = item.partition("=")
        column = config_column(key)
        if not sep or column not in df:
            raise CompareError(f"--where {item}: allowed: KEY=VALUE with KEY one of the rows' columns")
        kept = df[is_value(df[column], value)]
        if kept.empty:
            have = ", ".join(sorted({str(v) for v in df[column].dropna()}, key=_natural)[:12]) or "none"
            raise CompareError(f"--where {item}: no ok row has it; allowed: {key}= one of {have}")
        df = kept
    if metric is not None and (metric not in df or pd.to_numeric(df[metric], errors="coerce").isna().all()):
        known = sorted(c for c in JUDGED if c in df and df[c].notna().any())
        raise CompareError(
            f"--metric {metric}: no row{' of ' + tree if tree else ''} has a value of it; "
            f"allowed: a numeric column, e.g. {', '.join(known)}"
        )
    return df.copy()  # one block per dtype again: a loaded tree is fragmented


def module_of(rows: pd.DataFrame) -> registry.Experiment | None:
    """The experiment behind rows of a preset (lenet_scratch -> train); see registry.of_rows."""
    return registry.of_rows(rows)


def figures(rows: pd.DataFrame, samples: dict[str, np.ndarray]) -> list[tuple[str, Any]]:
    """(experiment, figure) for every figure the experiments' report hooks draw from these rows:
    ``--plot`` writes the figures the HTML report shows."""
    out = []
    for name, part in rows.groupby(rows["experiment"].astype("string"), sort=True, observed=True):
        experiment = registry.of_rows(part)
        if experiment is not None:
            out += [(str(name), f) for f in experiment.section(part, samples).figures]
    return out


def metric_for(experiment: str, rows: pd.DataFrame, asked: str | None) -> tuple[str, str]:
    """(metric, note): the asked one if the experiment's rows have it, else the experiment's own."""
    module = module_of(rows)
    own = module.metric if module else "median_s"
    if asked and asked in rows and rows[asked].notna().any():
        return asked, ""
    if own not in rows or rows[own].isna().all():
        own = "median_s"
    note = f"{experiment} has no {asked} values: compared by {own}" if asked else ""
    return own, note


def summary_rows(experiment: str, rows: pd.DataFrame) -> pd.DataFrame:
    """The rows an experiment compares by default (training: its summary row, not every epoch)."""
    module = module_of(rows)
    keep = module.summary_rows if module else None
    return rows[rows["measurement"].astype("string").isin(keep)] if keep else rows


UNUSABLE_SAMPLES = "left out {n} unusable sample{s} (NaN, not a number, or <= 0 s) of the rows"


def samples_by_row(paths: Sequence[str | Path], notes: Notes | None = None) -> dict[str, np.ndarray]:
    """Every row's raw sample seconds (not its warm-up) under ``paths``, by row id; a sample
    that is no time (NaN, not a number, <= 0) is left out and said: in ``notes`` by row id
    (kind ``UNUSABLE_SAMPLES``), else as a warning."""
    try:
        s = load(*paths, samples=True)
    except FileNotFoundError:
        return {}
    if s.empty:
        return {}
    s = s[s["phase"].astype("string") == "sample"]
    own = notes if notes is not None else Notes()
    out = {}
    for k, g in s.groupby("row_id", observed=True):
        seconds = pd.to_numeric(g["seconds"], errors="coerce").to_numpy(float)
        kept = usable(seconds)
        if len(kept) < len(seconds):
            own.add(UNUSABLE_SAMPLES, k, count=len(seconds) - len(kept))
        out[str(k)] = kept
    if notes is None:
        own.say()
    return out


def compare(
    *paths: str | Path,
    by: Sequence[str] | None = None,
    baseline: str | None = None,
    metric: str | None = None,
    experiment: str | None = None,
    where: Sequence[str] = (),
    rows: pd.DataFrame | None = None,
    samples: dict[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """The comparison table of one tree as a DataFrame (see the module docstring).

    ``rows``: a DataFrame from ``load()`` to use instead of ``paths``; ``samples``: their raw
    sample seconds by row id (``samples_by_row``), for significance tests and error bars.
    ``df.attrs["notes"]`` holds the lines worth showing (pooled configs, differing metrics,
    suspect figures). Each line's raw values of its metric are in its ``_samples`` column.
    """
    tree = ", ".join(map(str, paths)) if rows is None else ""
    df = select(load(*paths) if rows is None else rows, experiment, where, metric, tree=tree)
    if baseline:
        _check_baseline(df, baseline)
    if samples is None:
        samples = samples_by_row(paths) if rows is None else {}
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
    samples: dict[str, np.ndarray],
) -> tuple[pd.DataFrame, list[str]]:
    metric, note = metric_for(name, df, asked)
    module = module_of(df)
    beside = module.beside if module else ()
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
    if "device_name" in df:
        df = df.assign(device=df["device_name"].map(device_family))
        if df["device"].nunique() > 1 and "device" not in keys:
            keys.append("device")  # different hardware is never pooled
    group = list(dict.fromkeys(["measurement", *keys]))
    entries = []
    for values, part in df.groupby(group, dropna=False, sort=True, observed=True):
        values = values if isinstance(values, tuple) else (values,)
        entry: dict[str, Any] = {"experiment": name, **dict(zip(group, values)), "metric": metric}
        usable_part = measured(part, metric, samples)
        per_run = pd.to_numeric(usable_part.rows[metric], errors="coerce")
        entry[metric] = usable_part.value
        entry["runs"] = int(part["run_id"].nunique())
        if usable_part.left_out:
            entry["left_out"] = ", ".join(usable_part.left_out)
            notes.append(f"{name} {entry['measurement']}: left out {entry['left_out']}")
        if entry["runs"] > 1 and per_run.mean():
            cv = float(per_run.std(ddof=1) / per_run.mean())
            entry["cv_between_runs"] = cv
            if cv > NOISY_BETWEEN_RUNS:
                point = ", ".join(f"{k.removeprefix('cfg.')}={v}" for k, v in zip(group, values))
                notes.append(f"{name} {point}: {metric} varies {cv:.0%} between runs ({entry['runs']} runs)")
        entry["_samples"] = usable_part.samples
        seconds = [samples.get(str(r), np.array([])) for r in part["row_id"]] if samples else []
        pooled_seconds = np.concatenate(seconds) if seconds else np.array([])
        if len(pooled_seconds) >= 3:  # of the times, as the job's table and bench.noise_threshold
            q1, q3 = np.percentile(pooled_seconds, [25, 75])
            entry["iqr_pct"] = 100 * float(q3 - q1) / float(np.median(pooled_seconds))
        for column in beside:  # what the experiment wants seen next to speed (training: test_acc)
            if column in part and column != metric:
                entry[column] = float(pd.to_numeric(part[column], errors="coerce").median())
        for column in UNIT_COLUMNS:  # each point keeps its rows' units: a table may mix images and tokens
            if column in part and part[column].notna().any():
                entry[column] = str(part[column].dropna().iloc[0])
        differ = [c for c in identity if c not in keys and part[c].astype("string").nunique(dropna=False) > 1]
        if differ:
            entry["pooled"] = ", ".join(c.removeprefix("cfg.") for c in differ)
            notes.append(
                f"{name} {entry['measurement']}: {entry['runs']} runs pooled although they differ in "
                f"{entry['pooled']} (add --by to separate them)"
            )
        suspects = sorted({str(s) for s in part.get("suspect", pd.Series(dtype=str)).dropna() if str(s)})
        entry["suspect"] = "; ".join(suspects)
        entries.append(entry)
    out = pd.DataFrame(entries)
    if baseline:
        out = _against_baseline(out, keys, metric, baseline, name, notes)
    count = next((k for k in keys if k in COUNT_KEYS), None)
    if count and higher_is_better(metric):
        out = _scaling(out, keys, metric, count, df)
        for i, row in out[out["efficiency"] > SUPERLINEAR].iterrows():
            why = f"efficiency {row['efficiency']:.2f} > {SUPERLINEAR}: faster than linear is suspect"
            out.loc[i, "suspect"] = "; ".join(x for x in (str(row.get("suspect") or ""), why) if x)
            notes.append(f"{name} {row['measurement']} at {count.removeprefix('cfg.')}={row[count]}: {why}")
    return out, notes


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
    others = ["measurement", *(k for k in keys if k != key)]
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


def _verdict(base: np.ndarray, new: np.ndarray, higher: bool, metric: str) -> Difference:
    if not len(base) or not len(new):
        return Difference(math.nan, math.nan, math.nan, math.nan, f"no raw samples of {metric} to test")
    return compare_samples(base, new, higher_is_better=higher)


def _scaling(out: pd.DataFrame, keys: list[str], metric: str, count: str, rows: pd.DataFrame) -> pd.DataFrame:
    """Speedup S(n) and efficiency E(n) = S(n) / n within each group of the other keys."""
    others = ["measurement", *(k for k in keys if k != count)]
    out = out.copy()
    out[count] = pd.to_numeric(out[count])
    keyed = _point_keys(out, others)
    measured = keyed.assign(_n=out[count], _v=out[metric])[out[count].notna()]  # null: "auto", unknown here
    # Each group's reference: its smallest count measured (S(n) is scaled linearly to one device).
    ref = (
        measured.sort_values("_n", kind="stable")
        .groupby(others, sort=False, dropna=False)
        .agg(ref_n=("_n", "first"), ref_v=("_v", "first"), points=("_n", "size"))
        .reset_index()
    )
    refs = keyed.assign(_row=out.index).merge(ref, on=others, how="left").set_index("_row").reindex(out.index)
    speedup = out[metric] / refs["ref_v"] * refs["ref_n"]
    alone = (refs["points"] == 1) & (refs["ref_n"] > 1)  # nothing to scale against: never a made-up 1.0
    out["speedup"] = speedup.mask(out[count].isna() | refs["ref_n"].isna() | alone)
    out["efficiency"] = out["speedup"] / out[count]
    if metric == "items_per_s":
        out["per_device_items_per_s"] = out[metric] / out[count]
    if "cfg.trainer.scaling" in rows:
        out["scaling"] = rows["cfg.trainer.scaling"].astype("string").iloc[0]
    return out


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
) -> pd.DataFrame:
    """Every point of ``new`` against the same point (config, and device unless ``any_device``)
    of ``base``, with one verdict each (``perflab.analysis.verdicts``): PASS, FAIL, INCONCLUSIVE (with the
    repeats that would do), INCOMPARABLE (the machine identity fields that differ; judged anyway
    with ``allow_mixed``). ``gate_pct``: the slowdown a FAIL must exceed; ``alpha``: the false
    discovery rate over all points (Benjamini-Hochberg). Points in one tree only are rows too,
    ``change`` saying which. ``df.attrs["notes"]`` holds the lines worth showing."""
    a = select(load(base), experiment, where, metric, tree=f"BASE ({base})")
    b = select(load(new), experiment, where, metric, tree=f"NEW ({new})")
    said = {"BASE": Notes(), "NEW": Notes()}  # samples left out when read, by row id
    samples = {**samples_by_row([base], said["BASE"]), **samples_by_row([new], said["NEW"])}
    entries, notes, pooled = [], [], []
    for name in sorted(set(a["experiment"].astype("string")) | set(b["experiment"].astype("string"))):
        pa = summary_rows(name, a[a["experiment"].astype("string") == name])
        pb = summary_rows(name, b[b["experiment"].astype("string") == name])
        both = pd.concat([pa, pb])
        m, note = metric_for(name, both, metric)
        notes += [note] if note else []
        key_cols = sorted(set(identity_columns(pa)) | set(identity_columns(pb)))
        match_on = ["measurement", *key_cols, *([] if any_device else ["device"])]
        ga, gb = _points(pa, match_on), _points(pb, match_on)
        varying = [c for c in key_cols if both[c].astype("string").nunique(dropna=False) > 1]
        for point in sorted(set(ga) | set(gb)):
            label = dict(zip(match_on, point))
            rows = ga.get(point, gb.get(point))
            assert rows is not None
            entry: dict[str, Any] = {
                "experiment": name,
                "measurement": label["measurement"],
                **{k: _native(rows[k]) for k in varying},
                "metric": m,
                "_name": dashboard_name(name, label, varying),
            }
            if not any_device:
                entry["device"] = label["device"]
            if point not in ga or point not in gb:
                entry["change"] = "only in " + ("new" if point not in ga else "base")
                entries.append(entry)
                continue
            ra, rb = ga[point], gb[point]
            sides = {"BASE": measured(ra, m, samples, said["BASE"]), "NEW": measured(rb, m, samples, said["NEW"])}
            va, vb = sides["BASE"].value, sides["NEW"].value
            higher = higher_is_better(m)
            speedup = (vb / va) if higher else (va / vb)
            differ, unknown = identity_differences(ra, rb)
            sa, sb = sides["BASE"].samples, sides["NEW"].samples
            test = _verdict(sa, sb, higher, m)
            left = "; ".join(f"in {side}: {', '.join(x.left_out)}" for side, x in sides.items() if x.left_out)
            entry.update(
                base=va,
                new=vb,
                speedup=speedup,
                change_pct=100 * (speedup - 1),
                p_value=test.p_value,
                identity="; ".join(differ),
                _base_samples=sa,
                _new_samples=sb,
                _samples=sb,
                _test=test,
            )
            flagged = {side: _suspects(r) for side, r in (("base", ra), ("new", rb))}
            entry["suspect"] = " | ".join(f"{side}: {why}" for side, why in flagged.items() if why)
            if unknown:
                notes.append(f"{name} {label['measurement']}: identity not checked for {', '.join(unknown)}")
            if left:
                entry["left_out"] = left
                notes.append(f"{entry['_name']}: left out {left}")
            entries.append(entry)
            empty = [side for side, x in sides.items() if math.isnan(x.value)]
            if empty:  # nothing of this point to judge on a side: said, never a pass
                entry["verdict"] = Verdict.INCONCLUSIVE.value
                entry["why"] = f"no usable {m} in {' and '.join(empty)} (left out {left})"
                entry["significance"] = test.words
                continue
            pooled.append(entry)
    judge(pooled, gate_pct, alpha, allow_mixed)
    out = pd.DataFrame(entries)
    first = [c for c in AB_FIRST if c in out] + [c for c in out if c.startswith("cfg.")]
    out = out[first + [c for c in out if c not in first]]
    if out.empty or "verdict" not in out:
        others = "" if any_device else " (points matched on device too: --any-device compares across devices)"
        notes.append(f"no point is in both trees{others}")
    out.attrs["notes"] = list(dict.fromkeys(notes))
    out.attrs["gate_pct"], out.attrs["alpha"] = gate_pct, alpha
    return out


AB_FIRST = ("experiment", "measurement", "device", "metric", "base", "new", "change_pct", "verdict", "why", "change")
# (the suspect column follows: a verdict on measurements taken on a busy machine says so)


def _suspects(rows: pd.DataFrame) -> str:
    """The distinct suspect reasons of a point's rows ("" if none)."""
    found = rows.get("suspect", pd.Series(dtype="string")).dropna().astype(str)
    return "; ".join(sorted({s for s in found if s.strip()}))


def _native(column: pd.Series) -> object:
    """A key's value as the rows hold it (an integer stays one), for the table."""
    values = column.dropna()
    if values.empty:
        return None
    v = values.iloc[0]
    return int(v) if isinstance(v, float) and v.is_integer() else v.item() if hasattr(v, "item") else v


def dashboard_name(experiment: str, label: dict[str, str], varying: list[str]) -> str:
    """A point's stable name for a dashboard: the experiment's own keys always (so a point's
    name does not change when another point joins), other keys where they vary, the device."""
    keys = [k for k in label if k.startswith("cfg.experiment.") or k in varying]
    parts = [experiment, label["measurement"], *(f"{k.removeprefix('cfg.')}={label[k]}" for k in keys)]
    return " / ".join(parts + ([label["device"]] if label.get("device") else []))


def identity_differences(base: pd.DataFrame, new: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(``field: base vs new`` for each machine identity field (``environment.IDENTITY``) whose
    values differ between the two sides' rows; fields one side did not record, unchecked)."""
    from perflab.measure.environment import IDENTITY

    differ, unknown = [], []
    for field in IDENTITY:
        va, vb = _values(base, field), _values(new, field)
        if not va and not vb:
            continue
        if not va or not vb:
            unknown.append(field)
        elif va != vb:
            differ.append(f"{field}: {', '.join(sorted(va))} vs {', '.join(sorted(vb))}")
    return differ, unknown


def _values(rows: pd.DataFrame, column: str) -> set[str]:
    if column not in rows:
        return set()
    return {_plain_text(v) for v in rows[column].dropna() if _plain_text(v)}


def _plain_text(v: object) -> str:
    """A cell as text, integers without '.0' (a column read as float in one tree, int in the other)."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip()


def judge(points: list[dict[str, Any]], gate_pct: float, alpha: float, allow_mixed: bool) -> None:
    """Each matched point's verdict, in place (see perflab.analysis.verdicts): significance adjusted over
    every judged point (Benjamini-Hochberg); detectability at the level a lone changed point must
    meet under that adjustment, alpha / (number of points judged)."""
    judged = [p for p in points if allow_mixed or not p["identity"]]
    adjusted = fdr([p["p_value"] for p in judged])
    level = alpha / max(1, len(judged))
    for p, p_adj in zip(judged, adjusted):
        test: Difference = p["_test"]
        a, b = p["_base_samples"], p["_new_samples"]
        p["p_adjusted"] = p_adj
        p["detectable_pct"] = detectable_change(a, b, alpha=level) if len(a) and len(b) else math.inf
        significant = not math.isnan(p_adj) and p_adj < alpha
        p["significant"] = significant
        size = _size(p["speedup"])
        if math.isnan(p_adj):
            p["significance"] = test.words
        elif significant:
            p["significance"] = f"significant: {size} than the base (adjusted p={p_adj:.2g})"
        else:
            p["significance"] = f"no significant difference (adjusted p={p_adj:.2g})"
        if significant and p["change_pct"] < -gate_pct:
            verdict, why = Verdict.FAIL, f"{size}: beyond the {gate_pct:g} % gate (adjusted p={p_adj:.2g})"
        elif p["detectable_pct"] <= gate_pct or (significant and p["speedup"] >= 1):
            verdict = Verdict.PASS  # a change of the gate's size was detectable, or it got significantly faster
            seen = size if significant else "no significant change"
            why = f"{seen}; a {p['detectable_pct']:.2g} % change was detectable"
            if p["detectable_pct"] > gate_pct:
                why = f"{size}, significantly (adjusted p={p_adj:.2g})"
        else:
            verdict, why = Verdict.INCONCLUSIVE, _inconclusive(p, gate_pct, level)
        if p["identity"]:
            why += f"; compared across identities on purpose (--allow-mixed): {p['identity']}"
        if p.get("suspect"):
            why += " (its measurements were flagged suspect: see suspect)"
        p["verdict"], p["why"] = verdict.value, why
    for p in points:
        if not (allow_mixed or not p["identity"]):
            p["verdict"], p["why"] = Verdict.INCOMPARABLE.value, f"machine identity differs: {p['identity']}"
            p["significance"] = p["_test"].words
    for p in points:
        for key in ("_base_samples", "_new_samples", "_test"):
            p.pop(key, None)


def _size(speedup: float) -> str:
    if math.isnan(speedup):
        return "change unknown"
    return f"{speedup:.3g}x faster" if speedup >= 1 else f"{1 / speedup:.3g}x slower"


def _inconclusive(p: dict[str, Any], gate_pct: float, level: float) -> str:
    a, b = p["_base_samples"], p["_new_samples"]
    if (not len(a) or not len(b)) and p.get("left_out"):
        return f"too few usable samples of {p['metric']} to test (left out {p['left_out']})"
    if not len(a) or not len(b):
        return f"no raw samples of {p['metric']} to test (results.samples=false?)"
    have = f"have {len(a)} and {len(b)}"
    need = repeats_needed(a, b, gate_pct, alpha=level)
    if math.isinf(need):
        return f"no number of samples shows a change of {gate_pct:g} % ({have})"
    shown = p["detectable_pct"]
    could = "no change at all" if math.isinf(shown) else f"only changes above {shown:.2g} %"
    more = max(0, int(need) - min(len(a), len(b)))
    return (
        f"these samples could show {could}, not {gate_pct:g} % ({have}): about {int(need)} a side would do "
        f"({more} more repeats, bench.repeats={int(need)})"
    )


def _points(df: pd.DataFrame, columns: list[str]) -> dict[tuple, pd.DataFrame]:
    frame = df.assign(device=df["device_name"].map(device_family)) if "device_name" in df else df
    present = [c for c in columns if c in frame]
    frame = frame.reindex(columns=list(dict.fromkeys([*frame.columns, *columns])))
    return (
        {
            tuple(_plain_text(v) if not pd.isna(v) else "" for v in (k if isinstance(k, tuple) else (k,))): g
            for k, g in frame.groupby(columns, dropna=False, sort=True)
        }
        if present
        else {}
    )


@dataclass
class Measured:
    """What a point's rows give to judge it by: the rows whose metric is usable, the median of
    it, their usable raw samples as values of the metric, and what was left out, in words."""

    rows: pd.DataFrame
    value: float
    samples: np.ndarray
    left_out: list[str]


def measured(rows: pd.DataFrame, metric: str, samples: dict[str, np.ndarray], said: Notes | None = None) -> Measured:
    """A point's usable values: a row whose metric is NaN or not a number -- or, for a time or a
    rate, <= 0 (an accuracy of 0 is a value) -- is left out with its samples, and so is a sample
    that implies no positive value (``said``: the notes of ``samples_by_row``, for the samples
    left out when they were read). Nothing usable: value NaN, no samples."""
    values = pd.to_numeric(rows[metric], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    timed = metric in RATES or unit_of(metric) == "s" or metric.endswith("_per_s")
    good = np.isfinite(values) & ((values > 0) if timed else True)
    kept = rows[good]
    parts = [sample_values(samples, r, metric) for r in _cells(kept, "row_id", metric, "median_s")] if samples else []
    pooled = np.concatenate(parts) if parts else np.array([])
    clean = usable(pooled)
    at_read = sum(said.of(r).get(UNUSABLE_SAMPLES, 0) for r in kept["row_id"].astype(str)) if said else 0
    left = []
    if not good.all():
        n = int((~good).sum())
        why = "NaN, not a number or <= 0" if timed else "NaN or not a number"
        left.append(f"{n} row{'s' if n != 1 else ''} whose {metric} is {why}")
    if at_read + len(pooled) - len(clean):
        n = at_read + len(pooled) - len(clean)
        left.append(f"{n} sample{'s' if n != 1 else ''} that give no positive {metric} (NaN, not a number, <= 0)")
    return Measured(kept, float(np.median(values[good])) if good.any() else math.nan, clean, left)


def _cells(rows: pd.DataFrame, *columns: str) -> list[dict[str, Any]]:
    """Each row as a dict of the ``columns`` it has: what a per-row loop reads, without building
    a Series per row (iterrows took most of a compare of two 100k-row trees)."""
    return rows[[c for c in dict.fromkeys(columns) if c in rows]].to_dict("records")


def regressions(table: pd.DataFrame, pct: float | None = None) -> pd.DataFrame:
    """The points judged FAIL (significantly slower than the base by more than the gate)."""
    if table.empty or "verdict" not in table:
        return table.iloc[:0]
    return table[table["verdict"] == Verdict.FAIL.value]


def verdict_of(table: pd.DataFrame) -> int:
    """The exit code of an A/B table: its points' verdicts, and any point the new tree lost."""
    verdicts = [Verdict(v) for v in table.get("verdict", pd.Series(dtype=str)).dropna()]
    code = exit_code(verdicts)
    lost = "change" in table and (table["change"] == "only in base").any()
    return UNJUDGED_EXIT if code == PASS_EXIT and lost else code


# --- output -------------------------------------------------------------------------------------


def to_markdown(df: pd.DataFrame) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.4g}"
        return str(v)

    visible = [c for c in df.columns if not c.startswith("_")]
    lines = [
        "| " + " | ".join(c.removeprefix("cfg.") for c in visible) + " |",
        "|" + "|".join("---" for _ in visible) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df[visible].itertuples(index=False)]
    return "\n".join(lines)


def percent(text: str) -> float:
    """A finite percentage >= 0 (nan would quietly turn a CI gate off)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a number >= 0 (percent)")
    return value


def probability(text: str) -> float:
    """A level strictly between 0 and 1 (``--alpha``)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a number between 0 and 1, e.g. 0.05")
    return value


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
    judged = [r for r in records if "verdict" in r]
    gate_pct, alpha = table.attrs.get("gate_pct", DEFAULT_GATE_PCT), table.attrs.get("alpha", ALPHA)
    exit_ = verdict_of(table) if code is None else code
    out = {
        "verdict": {0: "PASS", 1: "FAIL"}.get(exit_, "COULD NOT JUDGE"),
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
    samples; ``extra`` the verdict and why, for two trees."""
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
            parts += [f"{c.removeprefix('cfg.')}={_plain_text(r[c])}" for c in table.columns if c.startswith("cfg.")]
            name = " / ".join(parts)
        entry: dict[str, Any] = {"name": name, "unit": unit_of(metric) or metric, "value": float(value)}
        samples = r.get("_samples")
        if isinstance(samples, np.ndarray) and len(samples) >= 3:
            q1, q3 = np.percentile(samples, [25, 75])
            entry["range"] = f"{q1:.4g} to {q3:.4g}"
        if "verdict" in table and isinstance(r.get("verdict"), str):
            entry["extra"] = f"{r['verdict']}: {r.get('why', '')}"
        out["customBiggerIsBetter" if higher_is_better(metric) else "customSmallerIsBetter"].append(entry)
    return json.dumps(out, indent=1)


PROG = "perflab compare"  # how its lines start (``python -m perflab.compare`` is the same command)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit codes are perflab.analysis.verdicts' (0 pass, 1 fail, 2 usage, 3 not
    judged): a crash is 3 in one line, never 1, which means FAIL."""
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away: the perflab command ends quietly
        raise
    except Exception as err:  # damage no reader foresaw, or a bug
        return could_not_judge(PROG, err)


def _main(argv: Sequence[str] | None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="one results tree (or run/sweep dir, or CSV), or BASE NEW")
    parser.add_argument("--by", nargs="+", help="config keys to compare over (default: the ones that vary)")
    parser.add_argument("--baseline", help="KEY=VALUE the others are compared with, e.g. devices.count=1")
    parser.add_argument("--metric", help="column to compare (default: each experiment's own)")
    parser.add_argument("--experiment", help="only this experiment")
    parser.add_argument("--where", action="append", default=[], help="KEY=VALUE: only these rows (repeatable)")
    parser.add_argument(
        "--fail-if-slower",
        type=percent,
        metavar="PCT",
        help=f"BASE NEW: the gate: FAIL beyond PCT %% slower (default {DEFAULT_GATE_PCT:g})",
    )
    parser.add_argument("--alpha", type=probability, default=ALPHA, help="BASE NEW: false discovery rate (0.05)")
    parser.add_argument("--any-device", action="store_true", help="BASE NEW: match points across devices")
    parser.add_argument(
        "--allow-mixed", action="store_true", help="BASE NEW: judge points whose machine identity differs"
    )
    parser.add_argument("--plot", type=Path, help="write PNG plots into this folder")
    parser.add_argument("--format", choices=("md", "csv", "json", "github"), default="md")
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
            )
        else:
            for flag, given in (
                ("--fail-if-slower", args.fail_if_slower is not None),
                ("--allow-mixed", args.allow_mixed),
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
    if args.format == "json":
        print(to_json(table, two_trees=two, code=code, gate=args.fail_if_slower is not None))
    elif args.format == "github":
        print(to_github(table))
    else:
        print(
            to_markdown(table)
            if args.format == "md"
            else table.drop(columns=[c for c in table.columns if c.startswith("_")]).to_csv(index=False),
            end="\n",
        )
        for note in table.attrs.get("notes", []):
            print(f"note: {note}")
    if args.plot:
        from perflab.analysis import plots

        rows = select(load(args.paths[-1]), args.experiment, args.where)
        try:
            written = plots.write(figures(rows, samples_by_row(args.paths[-1:])), rows, args.plot)
        except ConfigError as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return USAGE_EXIT
        for line in written:
            print(line, file=sys.stderr if args.format in ("json", "github") else sys.stdout)
    if two:
        say = sys.stderr if args.format in ("json", "github", "csv") else sys.stdout
        print(meaning(gate, args.alpha, args.fail_if_slower is not None), file=say)
        print(f"{PROG}: {summary(table)} -> exit {code}", file=sys.stderr)
        slow = regressions(table)
        if len(slow):
            print(
                f"{PROG}: {len(slow)} point(s) significantly slower than the base by more than {gate:g}%",
                file=sys.stderr,
            )
    return code


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
