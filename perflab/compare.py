"""Compare results: within one tree, or two trees A/B.

    python -m perflab.compare PATH [--by KEY ...] [--baseline KEY=VALUE] [--plot DIR]
    python -m perflab.compare BASE NEW [--fail-if-slower PCT]

One tree: one line per (experiment, measurement, config keys: by default the keys that vary),
each experiment with its own metric (training: images/s of its summary row; matmul: TFLOP/s;
others: median time) unless ``--metric`` says otherwise. Nothing is dropped: an experiment
without the asked metric keeps its own, and says so. Rows of different configs that land in
one line are said to be pooled (and which keys differ). ``--baseline KEY=VALUE`` adds the
speedup over that point and a significance test on the raw samples; a device count among the
keys adds S(n) = throughput(n) / throughput(1 device) and E(n) = S(n) / n.

Two trees: points matched by config and device; per point the change and its significance.
``--fail-if-slower PCT`` exits 1 when any point is significantly slower by more than PCT %:
a regression gate for CI.

Ratio, speedup and the significance words all come from the same metric in its own
direction: higher is better for rates (tested on per-sample rates), lower for times.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from perflab import registry, schema
from perflab.results import load
from perflab.stats import Verdict, compare_samples

RATES = {"items_per_s", "per_device_items_per_s", "tflops", "gbps", "bus_gbps"}  # work / median time
HIGHER_IS_BETTER = RATES | {
    "test_acc",
    "train_acc",
    "concurrency",
    "overlap_speedup",
    "speedup_vs_eager",
    "mfu",
    "pct_of_peak",
    "peak_tflops",
}
COUNT_KEYS = ("cfg.devices.count", "n_devices")
SUPERLINEAR = 1.1  # efficiency above this is physically suspect
NOISY_BETWEEN_RUNS = 0.10  # run-to-run coefficient of variation above this: say so
UNITS = {
    "items_per_s": "items/s",
    "per_device_items_per_s": "items/s per device",
    "tflops": "TFLOP/s",
    "gbps": "GB/s",
    "bus_gbps": "GB/s",
    "median_s": "s",
    "mean_s": "s",
    "min_s": "s",
}


class CompareError(ValueError):
    """A user mistake in a comparison: one line."""


def config_column(key: str) -> str:
    """``trainer.batch_size`` -> ``cfg.trainer.batch_size``; plain row columns stay as they are."""
    return key if key.startswith("cfg.") or "." not in key else f"cfg.{key}"


def higher_is_better(metric: str) -> bool:
    return metric in HIGHER_IS_BETTER or metric.endswith("_per_s")


def identity_columns(df: pd.DataFrame) -> list[str]:
    """The cfg.* columns that say what was measured (not where results were kept)."""
    volatile = tuple(f"cfg.{k}" for k in schema.volatile_keys())
    return [c for c in df.columns if c.startswith("cfg.") and not c.startswith(volatile) and c != "cfg.experiment.name"]


def select(
    df: pd.DataFrame,
    experiment: str | None = None,
    where: Sequence[str] = (),
    metric: str | None = None,
    tree: str = "",
) -> pd.DataFrame:
    """The ok rows, of one experiment, with ``KEY=VALUE`` filters; refuses a ``metric`` no row
    has (``tree``: which of two trees, for the message)."""
    if df.empty:
        raise CompareError("no rows to compare")
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
        df = df[df[column].astype("string") == value]
    if df.empty:
        raise CompareError("no ok rows left after the filters")
    if metric is not None and (metric not in df or pd.to_numeric(df[metric], errors="coerce").isna().all()):
        known = sorted(c for c in HIGHER_IS_BETTER | set(UNITS) if c in df and df[c].notna().any())
        raise CompareError(
            f"--metric {metric}: no row{' of ' + tree if tree else ''} has a value of it; "
            f"allowed: a numeric column, e.g. {', '.join(known)}"
        )
    return df.copy()  # one block per dtype again: a loaded tree is fragmented


def module_of(rows: pd.DataFrame) -> registry.Experiment | None:
    """The experiment module behind rows of a preset (lenet_scratch -> train): cfg.experiment.name,
    else the experiment column itself."""
    for column in ("cfg.experiment.name", "experiment"):
        names = rows[column].dropna().astype("string").unique() if column in rows else []
        if len(names) == 1 and names[0] in registry.names():
            return registry.get(str(names[0]))
    return None


def device_family(name: object) -> str:
    """A device without a CPU worker's thread count: 'CPU (1 thread)' and 'CPU (2 threads)' are
    the same hardware split differently, not different hardware."""
    return re.sub(r" \(\d+ threads?\)", "", str(name))


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
    keep = getattr(module.module, "SUMMARY_ROWS", None) if module else None
    return rows[rows["measurement"].astype("string").isin(keep)] if keep else rows


def sample_values(samples: dict[str, np.ndarray], row: pd.Series, metric: str) -> np.ndarray:
    """A row's raw samples as values of ``metric``: seconds for times; for rates, the rate each
    sample implies (metric x median / sample seconds)."""
    if not samples or metric not in RATES | {"median_s", "mean_s", "min_s"}:
        return np.array([])
    seconds = samples.get(str(row["row_id"]))
    if seconds is None or not len(seconds):
        return np.array([])
    if metric in RATES:
        return float(row[metric]) * float(row["median_s"]) / seconds
    return seconds


def samples_by_row(paths: Sequence[str | Path]) -> dict[str, np.ndarray]:
    """Every row's raw sample seconds (not its warm-up) under ``paths``, by row id."""
    try:
        s = load(*paths, samples=True)
    except FileNotFoundError:
        return {}
    if s.empty:
        return {}
    s = s[s["phase"].astype("string") == "sample"]
    return {str(k): g["seconds"].to_numpy(float) for k, g in s.groupby("row_id", observed=True)}


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
    df = select(load(*paths) if rows is None else rows, experiment, where, metric)
    if baseline and config_column(baseline.partition("=")[0]) not in df:
        varying = [c for c in identity_columns(df) if df[c].astype("string").nunique(dropna=False) > 1]
        known = ", ".join(sorted(c.removeprefix("cfg.") for c in varying)) or "none (no key varies here)"
        raise CompareError(f"--baseline {baseline}: not a key of these results; allowed: a key that varies: {known}")
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
    beside = getattr(module.module, "BESIDE", ()) if module else ()
    notes = [note] if note else []
    identity = identity_columns(df)
    if by:
        keys = [config_column(k) for k in by]
        missing = [k for k in keys if k not in df]
        if missing:
            raise CompareError(f"--by {', '.join(missing)}: not in the results of {name}")
    else:
        keys = [c for c in identity if df[c].astype("string").nunique(dropna=False) > 1]
    if "device_name" in df:
        df = df.assign(device=df["device_name"].map(device_family))
        if df["device"].nunique() > 1 and "device" not in keys:
            keys.append("device")  # different hardware is never pooled
    group = ["measurement", *keys]
    entries = []
    for values, part in df.groupby(group, dropna=False, sort=True, observed=True):
        values = values if isinstance(values, tuple) else (values,)
        entry: dict[str, Any] = {"experiment": name, **dict(zip(group, values)), "metric": metric}
        per_run = pd.to_numeric(part[metric], errors="coerce")
        entry[metric] = float(per_run.median())
        entry["runs"] = int(part["run_id"].nunique())
        if entry["runs"] > 1 and per_run.mean():
            cv = float(per_run.std(ddof=1) / per_run.mean())
            entry["cv_between_runs"] = cv
            if cv > NOISY_BETWEEN_RUNS:
                notes.append(f"{name} {values}: {metric} varies {cv:.0%} between runs ({entry['runs']} runs)")
        values_per_sample = [sample_values(samples, r, metric) for _, r in part.iterrows()]
        pooled_samples = np.concatenate(values_per_sample) if values_per_sample else np.array([])
        entry["_samples"] = pooled_samples
        seconds = [samples.get(str(r["row_id"]), np.array([])) for _, r in part.iterrows()] if samples else []
        pooled_seconds = np.concatenate(seconds) if seconds else np.array([])
        if len(pooled_seconds) >= 3:  # of the times, as the job's table and bench.noise_threshold
            q1, q3 = np.percentile(pooled_seconds, [25, 75])
            entry["iqr_pct"] = 100 * float(q3 - q1) / float(np.median(pooled_seconds))
        for column in beside:  # what the experiment wants seen next to speed (training: test_acc)
            if column in part and column != metric:
                entry[column] = float(pd.to_numeric(part[column], errors="coerce").median())
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
        out = _against_baseline(out, keys, metric, baseline, name)
    count = next((k for k in keys if k in COUNT_KEYS), None)
    if count and higher_is_better(metric):
        out = _scaling(out, keys, metric, count, df)
        for i, row in out[out["efficiency"] > SUPERLINEAR].iterrows():
            why = f"efficiency {row['efficiency']:.2f} > {SUPERLINEAR}: faster than linear is suspect"
            out.loc[i, "suspect"] = "; ".join(x for x in (str(row.get("suspect") or ""), why) if x)
            notes.append(f"{name} {row['measurement']} at {count.removeprefix('cfg.')}={row[count]}: {why}")
    return out, notes


def _matches(out: pd.DataFrame, row: pd.Series, columns: list[str]) -> pd.Series:
    return (out[columns].astype("string") == row[columns].astype("string")).all(axis=1)


def _against_baseline(out: pd.DataFrame, keys: list[str], metric: str, baseline: str, name: str) -> pd.DataFrame:
    key, sep, value = baseline.partition("=")
    key = config_column(key)
    if not sep:
        raise CompareError(f"--baseline {baseline}: allowed: KEY=VALUE, e.g. devices.count=1")
    if key not in out:
        out = out.assign(speedup_vs_baseline=math.nan, significance=f"no baseline: {key} is not among the keys")
        return out
    others = ["measurement", *(k for k in keys if k != key)]
    is_base = out[key].astype("string") == value
    if not is_base.any():
        raise CompareError(f"--baseline {baseline}: no {name} results with {key}={value}")
    higher = higher_is_better(metric)
    speedups, words = [], []
    for _, row in out.iterrows():
        match = out[is_base & _matches(out, row, others)]
        if match.empty:
            speedups.append(math.nan)
            words.append("no baseline")
            continue
        base = match.iloc[0]
        ratio = row[metric] / base[metric]
        speedups.append(ratio if higher else 1 / ratio)
        if base.name == row.name:
            words.append("baseline")
        else:
            words.append(_verdict(base["_samples"], row["_samples"], higher, metric).words)
    return out.assign(speedup_vs_baseline=speedups, significance=words)


def _verdict(base: np.ndarray, new: np.ndarray, higher: bool, metric: str) -> Verdict:
    if not len(base) or not len(new):
        return Verdict(math.nan, math.nan, math.nan, math.nan, f"no raw samples of {metric} to test")
    return compare_samples(base, new, higher_is_better=higher)


def _scaling(out: pd.DataFrame, keys: list[str], metric: str, count: str, rows: pd.DataFrame) -> pd.DataFrame:
    """Speedup S(n) and efficiency E(n) = S(n) / n within each group of the other keys."""
    others = ["measurement", *(k for k in keys if k != count)]
    out = out.copy()
    out[count] = pd.to_numeric(out[count])
    speedups = []
    for _, row in out.iterrows():
        same = out[_matches(out, row, others) & out[count].notna()]  # count null: "auto", unknown here
        if pd.isna(row[count]) or same.empty:
            speedups.append(math.nan)
            continue
        ref = same.loc[same[count].idxmin()]
        if len(same) == 1 and ref[count] > 1:
            speedups.append(math.nan)  # nothing to scale against: never a made-up 1.0 efficiency
            continue
        # S(n) relative to one device (from the smallest count measured, scaled linearly to one)
        speedups.append(row[metric] / ref[metric] * ref[count])
    out["speedup"] = speedups
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
) -> pd.DataFrame:
    """Every point of ``new`` against the same point (config, and device unless ``any_device``)
    of ``base``: metric, change, significance. ``df.attrs["notes"]`` lists unmatched points."""
    a = select(load(base), experiment, where, metric, tree=f"BASE ({base})")
    b = select(load(new), experiment, where, metric, tree=f"NEW ({new})")
    samples = {**samples_by_row([base]), **samples_by_row([new])}
    entries, notes = [], []
    for name in sorted(set(a["experiment"].astype("string")) | set(b["experiment"].astype("string"))):
        pa = summary_rows(name, a[a["experiment"].astype("string") == name])
        pb = summary_rows(name, b[b["experiment"].astype("string") == name])
        m, note = metric_for(name, pd.concat([pa, pb]), metric)
        notes += [note] if note else []
        key_cols = sorted(set(identity_columns(pa)) | set(identity_columns(pb)))
        match_on = ["measurement", *key_cols, *([] if any_device else ["device_name"])]
        ga, gb = _points(pa, match_on), _points(pb, match_on)
        varying = [c for c in key_cols if pd.concat([pa, pb])[c].astype("string").nunique(dropna=False) > 1]
        for point in sorted(set(ga) | set(gb)):
            label = dict(zip(match_on, point))
            entry: dict[str, Any] = {
                "experiment": name,
                "measurement": label["measurement"],
                **{k: label[k] for k in varying},
                "metric": m,
            }
            if not any_device:
                entry["device_name"] = label["device_name"]
            if point not in ga or point not in gb:
                entry["change"] = "only in " + ("new" if point not in ga else "base")
                entries.append(entry)
                continue
            ra, rb = ga[point], gb[point]
            va, vb = float(pd.to_numeric(ra[m]).median()), float(pd.to_numeric(rb[m]).median())
            higher = higher_is_better(m)
            entry.update(base=va, new=vb)
            verdict = _verdict(_pool(samples, ra, m), _pool(samples, rb, m), higher, m)
            speedup = (vb / va) if higher else (va / vb)
            entry.update(
                speedup=speedup,
                change_pct=100 * (speedup - 1),
                p_value=verdict.p_value,
                significance=verdict.words,
                significant=verdict.significant,
            )
            entries.append(entry)
    out = pd.DataFrame(entries)
    if not out.empty and "base" not in out:
        others = "" if any_device else " (points matched on device too: --any-device compares across devices)"
        notes.append(f"no point is in both trees{others}")
    out.attrs["notes"] = notes
    return out


def _points(df: pd.DataFrame, columns: list[str]) -> dict[tuple, pd.DataFrame]:
    present = [c for c in columns if c in df]
    frame = df.reindex(columns=list(dict.fromkeys([*df.columns, *columns])))
    return (
        {
            tuple(str(v) for v in (k if isinstance(k, tuple) else (k,))): g
            for k, g in frame.groupby(columns, dropna=False, sort=True)
        }
        if present
        else {}
    )


def _pool(samples: dict[str, np.ndarray], rows: pd.DataFrame, metric: str) -> np.ndarray:
    parts = [sample_values(samples, r, metric) for _, r in rows.iterrows()]
    return np.concatenate(parts) if parts else np.array([])


def regressions(table: pd.DataFrame, pct: float) -> pd.DataFrame:
    """The points significantly slower than the base by more than ``pct`` percent."""
    if table.empty or "significant" not in table:
        return table.iloc[:0]
    slower = table["significant"].fillna(False).astype(bool) & (table["change_pct"] < -pct)
    return table[slower]


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perflab.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="one results tree (or run/sweep dir, or CSV), or BASE NEW")
    parser.add_argument("--by", nargs="+", help="config keys to compare over (default: the ones that vary)")
    parser.add_argument("--baseline", help="KEY=VALUE the others are compared with, e.g. devices.count=1")
    parser.add_argument("--metric", help="column to compare (default: each experiment's own)")
    parser.add_argument("--experiment", help="only this experiment")
    parser.add_argument("--where", action="append", default=[], help="KEY=VALUE: only these rows (repeatable)")
    parser.add_argument("--fail-if-slower", type=percent, metavar="PCT", help="BASE NEW: exit 1 on a regression")
    parser.add_argument("--any-device", action="store_true", help="BASE NEW: match points across devices")
    parser.add_argument("--plot", type=Path, help="write PNG plots into this folder")
    parser.add_argument("--format", choices=("md", "csv"), default="md")
    args = parser.parse_args(argv)
    if len(args.paths) > 2:
        parser.error("give one results tree, or two (BASE NEW)")
    try:
        if len(args.paths) == 2:
            table = ab(
                *args.paths,
                metric=args.metric,
                experiment=args.experiment,
                where=args.where,
                any_device=args.any_device,
            )
        else:
            if args.fail_if_slower is not None:
                raise CompareError("--fail-if-slower compares two trees: BASE NEW")
            table = compare(
                args.paths[0],
                by=args.by,
                baseline=args.baseline,
                metric=args.metric,
                experiment=args.experiment,
                where=args.where,
            )
    except (CompareError, FileNotFoundError) as err:
        print(f"perflab.compare: error: {err}", file=sys.stderr)
        return 2
    print(
        to_markdown(table)
        if args.format == "md"
        else table.drop(columns=[c for c in table.columns if c.startswith("_")]).to_csv(index=False),
        end="\n",
    )
    for note in table.attrs.get("notes", []):
        print(f"note: {note}")
    if args.plot:
        from perflab import plots

        for line in plots.write_all(table, args.plot, rows=load(args.paths[-1])):
            print(line)
    if args.fail_if_slower is not None:
        slow = regressions(table, args.fail_if_slower)
        if len(slow):
            print(
                f"perflab.compare: {len(slow)} point(s) significantly slower than the base by more than "
                f"{args.fail_if_slower:g}%",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
