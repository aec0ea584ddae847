"""Compare results: ``python -m perflab.compare PATH... [--by KEY ...] [--baseline KEY=VALUE]
[--metric NAME] [--plot DIR] [--format md|csv]``, or ``compare(...)`` for a DataFrame.

One line per (experiment, measurement, config keys): the metric (median over runs), its ratio
to the baseline with a significance test on the raw samples, and, when the keys include a
device count, speedup S(n) = throughput(n) / throughput(smallest n) and efficiency E(n) = S(n)/n.
For training, final test accuracy stands beside speed, so "faster but worse" shows.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from perflab.results import load
from perflab.stats import compare_samples

HIGHER_IS_BETTER = {"items_per_s", "per_device_items_per_s", "tflops", "gbps", "test_acc", "train_acc",
                    "concurrency", "overlap_speedup"}
COUNT_KEYS = ("cfg.devices.count", "n_devices")
NOT_A_KEY = ("cfg.results.", "cfg.hydra", "cfg.trainer.resume", "cfg.trainer.checkpoint_dir")


def config_column(key: str) -> str:
    """``trainer.batch_size`` -> ``cfg.trainer.batch_size``; plain row columns stay as they are."""
    return key if key.startswith("cfg.") or "." not in key else f"cfg.{key}"


def compare(*paths: str | Path, by: Sequence[str] | None = None, baseline: str | None = None,
            metric: str | None = None, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The comparison table as a DataFrame (see the module docstring).

    ``rows``: a DataFrame from ``load()`` to use instead of ``paths`` (then without raw
    samples, so without significance tests).
    """
    df = load(*paths) if rows is None else rows
    if df.empty:
        raise ValueError("no rows to compare")
    df = df[df["status"] == "ok"]
    training = "measurement" in df and (df["measurement"] == "train").any()
    if training:
        df = df[df["measurement"] == "train"]  # training: one summary row per run, not every epoch
    metric = metric or ("items_per_s" if training else "median_s")
    if metric not in df:
        raise ValueError(f"--metric {metric}: no such column; try median_s, items_per_s, tflops, test_acc")
    keys = [config_column(k) for k in by] if by else _varying_keys(df)
    missing = [k for k in keys if k not in df]
    if missing:
        raise ValueError(f"--by {', '.join(missing)}: not in the results")
    group = list(dict.fromkeys(["experiment", "measurement", *keys]))
    samples = load(*paths, samples=True) if rows is None else pd.DataFrame()
    table = []
    for values, part in df.groupby(group, dropna=False, sort=True, observed=True):
        entry = dict(zip(group, values))
        entry.update(runs=len(part), **{metric: float(part[metric].median())})
        if "test_acc" in part and metric != "test_acc":
            entry["test_acc"] = float(part["test_acc"].median())
        entry["noisy"] = bool(part["noisy"].fillna(False).any()) if "noisy" in part else False
        entry["_row_ids"] = list(part["row_id"])
        table.append(entry)
    out = pd.DataFrame(table)
    if baseline:
        out = _against_baseline(out, keys, metric, baseline, samples)
    count = next((k for k in keys if k in COUNT_KEYS), None)
    if count and metric in HIGHER_IS_BETTER:
        out = _scaling(out, keys, metric, count, df)
    return out.drop(columns=["_row_ids"])


def _varying_keys(df: pd.DataFrame) -> list[str]:
    cols = [c for c in df.columns if c.startswith("cfg.") and not c.startswith(NOT_A_KEY)]
    return [c for c in cols if df[c].astype("string").nunique(dropna=False) > 1]


def _against_baseline(out: pd.DataFrame, keys: list[str], metric: str, baseline: str,
                      samples: pd.DataFrame) -> pd.DataFrame:
    key, _, value = baseline.partition("=")
    key = config_column(key)
    if key not in out:
        raise ValueError(f"--baseline {baseline}: {key} is not one of the compared keys ({', '.join(keys)})")
    others = ["experiment", "measurement", *(k for k in keys if k != key)]
    is_base = out[key].astype("string") == value
    if not is_base.any():
        raise ValueError(f"--baseline {baseline}: no results with {key}={value}")
    higher = metric in HIGHER_IS_BETTER
    ratios, verdicts = [], []
    for _, row in out.iterrows():
        match = out[is_base & (out[others].astype("string") == row[others].astype("string")).all(axis=1)]
        if match.empty:
            ratios.append(math.nan)
            verdicts.append("no baseline")
            continue
        base = match.iloc[0]
        ratios.append(row[metric] / base[metric] if higher else base[metric] / row[metric])
        verdicts.append("baseline" if base.name == row.name else _verdict(samples, base["_row_ids"], row["_row_ids"]))
    return out.assign(speedup_vs_baseline=ratios, significance=verdicts)


def _verdict(samples: pd.DataFrame, base_ids: list[str], ids: list[str]) -> str:
    if samples.empty:
        return "no raw samples"
    timed = samples[samples["phase"] == "sample"]
    a = timed[timed["row_id"].isin(base_ids)]["seconds"].to_numpy()
    b = timed[timed["row_id"].isin(ids)]["seconds"].to_numpy()
    return compare_samples(a, b).words


def _scaling(out: pd.DataFrame, keys: list[str], metric: str, count: str, rows: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency over the device count, within each group of the other keys."""
    others = ["experiment", "measurement", *(k for k in keys if k != count)]
    out = out.copy()
    out[count] = pd.to_numeric(out[count])
    speedups = []
    for _, row in out.iterrows():
        same = out[(out[others].astype("string") == row[others].astype("string")).all(axis=1)]
        ref = same.loc[same[count].idxmin()]
        speedups.append(row[metric] / ref[metric] * ref[count])  # S(n) relative to one device
    out["speedup"] = speedups
    out["efficiency"] = out["speedup"] / out[count]
    if "per_device_items_per_s" not in out and metric == "items_per_s":
        out["per_device_items_per_s"] = out[metric] / out[count]
    scaling = "cfg.trainer.scaling"
    if scaling in rows and scaling not in out:
        out["scaling"] = rows[scaling].iloc[0]
    return out


def to_markdown(df: pd.DataFrame) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.4g}"
        return str(v)

    cols = [c.removeprefix("cfg.") for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def plot(df: pd.DataFrame, out_dir: Path, metric: str) -> list[Path]:
    """PNG files: the scaling curve with the ideal line; time and accuracy vs batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    count = next((k for k in COUNT_KEYS if k in df and "speedup" in df), None)
    if count:
        fig, ax = plt.subplots(figsize=(5, 4))
        n = np.sort(df[count].unique())
        ax.plot(n, n, "k--", label="ideal")
        rest = [c for c in df.columns if c.startswith("cfg.") and c != count]
        for label, part in (df.groupby(rest, dropna=False) if rest else [("", df)]):
            part = part.sort_values(count)
            ax.plot(part[count], part["speedup"], "o-", label=_label(rest, label))
        ax.set(xlabel=count.removeprefix("cfg."), ylabel="speedup S(n)", title="scaling")
        ax.legend(fontsize=7)
        written.append(_save(fig, out_dir / "scaling.png"))
    batch = "cfg.trainer.batch_size"
    if batch in df:
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
        rest = [c for c in df.columns if c.startswith("cfg.") and c != batch]
        for label, part in (df.groupby(rest, dropna=False) if rest else [("", df)]):
            part = part.sort_values(batch)
            left.plot(part[batch], part[metric], "o-", label=_label(rest, label))
            if "test_acc" in part:
                right.plot(part[batch], part["test_acc"], "o-", label=_label(rest, label))
        sizes = sorted(int(b) for b in df[batch].unique())
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [str(b) for b in sizes])
            ax.minorticks_off()
        left.set(xlabel="batch size", ylabel=metric, title="speed vs batch size")
        right.set(xlabel="batch size", ylabel="final test accuracy", title="accuracy vs batch size")
        left.legend(fontsize=7)
        written.append(_save(fig, out_dir / "batch_size.png"))
    return written


def _label(keys: list[str], values: object) -> str:
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(f"{k.removeprefix('cfg.')}={v}" for k, v in zip(keys, values)) or "all"


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perflab.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="results CSV files, run or sweep dirs, or an outputs tree")
    parser.add_argument("--by", nargs="+", help="config keys to compare over (default: the ones that vary)")
    parser.add_argument("--baseline", help="KEY=VALUE the others are compared with, e.g. devices.count=1")
    parser.add_argument("--metric", help="column to compare (default: items_per_s for training, else median_s)")
    parser.add_argument("--plot", type=Path, help="write PNG plots into this folder")
    parser.add_argument("--format", choices=("md", "csv"), default="md")
    args = parser.parse_args(argv)
    try:
        table = compare(*args.paths, by=args.by, baseline=args.baseline, metric=args.metric)
    except (ValueError, FileNotFoundError) as err:
        print(f"perflab.compare: error: {err}", file=sys.stderr)
        return 2
    print(to_markdown(table) if args.format == "md" else table.to_csv(index=False), end="\n")
    if args.plot:
        metric = args.metric or next(c for c in ("items_per_s", "median_s") if c in table)
        for path in plot(table, args.plot, metric):
            print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
