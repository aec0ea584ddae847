"""Figures a person reads: titled, axes with units, integer device counts, the ideal line on
top, error bars from the raw samples (interquartile range). Used by ``compare --plot`` (PNG)
and by the HTML report (inline SVG). Each builder returns a matplotlib Figure, or None when
the results hold nothing it could draw."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

MISSING_MATPLOTLIB = "plots: matplotlib is not installed (pip install 'perflab[compare]'): no plots written"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(keys: list[str], values: object) -> str:
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(f"{k.removeprefix('cfg.')}={v}" for k, v in zip(keys, values)) or "all"


def _groups(df: pd.DataFrame, exclude: set[str]) -> list[tuple[str, pd.DataFrame]]:
    rest = [c for c in df.columns if c.startswith("cfg.") and c not in exclude and df[c].astype("string").nunique() > 1]
    rest += [c for c in ("measurement", "device_name") if c in df and df[c].astype("string").nunique() > 1]
    if not rest:
        return [("", df)]
    return [(_label(rest, k), g) for k, g in df.groupby(rest, dropna=False, sort=True)]


def _iqr_bars(part: pd.DataFrame, value: pd.Series) -> np.ndarray | None:
    """Asymmetric error bars (IQR of the raw samples, scaled to ``value``), or None."""
    if "_samples" not in part:
        return None
    lows, highs = [], []
    for samples, v in zip(part["_samples"], value):
        if not isinstance(samples, np.ndarray) or len(samples) < 3:
            lows.append(0.0)
            highs.append(0.0)
            continue
        q1, med, q3 = np.percentile(samples, [25, 50, 75])
        lows.append(v * (1 - q1 / med))
        highs.append(v * (q3 / med - 1))
    return np.abs(np.array([lows, highs]))


def scaling(table: pd.DataFrame) -> Any:
    """S(n) against the device count, per group of the other keys, with the ideal line."""
    count = next((k for k in ("cfg.devices.count", "n_devices") if k in table and "speedup" in table), None)
    if count is None:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for label, part in _groups(table.dropna(subset=["speedup"]), {count}):
        part = part.sort_values(count)
        ax.errorbar(
            part[count],
            part["speedup"],
            yerr=_iqr_bars(part, part["speedup"]),
            fmt="o-",
            capsize=3,
            label=label or "measured",
        )
    n = np.sort(pd.to_numeric(table[count]).unique())
    ax.plot(n, n, "--", color="black", linewidth=1.5, zorder=10, label="ideal (linear)")
    ax.set_xticks(n, [str(int(v)) for v in n])
    ax.minorticks_off()
    ax.set(
        xlabel="devices",
        ylabel="speedup S(n) over one device (x)",
        title="Scaling: throughput(n) / throughput(1 device)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def batch_size(table: pd.DataFrame) -> Any:
    """Speed and final test accuracy against the batch size (training)."""
    batch = "cfg.trainer.batch_size"
    if batch not in table or table[batch].nunique() < 2:
        return None
    metric = str(table["metric"].iloc[0]) if "metric" in table else "items_per_s"
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for label, part in _groups(table, {batch}):
        part = part.sort_values(batch)
        left.errorbar(
            part[batch],
            part[metric],
            yerr=_iqr_bars(part, part[metric]),
            fmt="o-",
            capsize=3,
            label=label or "measured",
        )
        if "test_acc" in part:
            right.plot(part[batch], part["test_acc"], "o-", label=label or "measured")
    sizes = sorted(int(b) for b in table[batch].unique())
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
    unit = {"items_per_s": "images/s", "median_s": "s"}.get(metric, metric)
    left.set(xlabel="global batch size (images)", ylabel=f"{metric} ({unit})", title="Speed vs batch size")
    right.set(
        xlabel="global batch size (images)", ylabel="final test accuracy (fraction)", title="Accuracy vs batch size"
    )
    left.legend(fontsize=7)
    fig.tight_layout()
    return fig


def roofline(rows: pd.DataFrame) -> Any:
    """Each measured op or training step at its (estimated) arithmetic intensity, under the
    roofs ``+experiment=hardware`` measured on its device: memory bandwidth x intensity, and
    the peak matmul TFLOP/s."""
    if rows.empty or "intensity" not in rows or "tflops" not in rows:
        return None
    roofs = _roofs(rows)
    points = rows.dropna(subset=["intensity", "tflops"])
    points = points[(points["status"].astype("string") == "ok") & points["device_name"].isin(roofs)]
    if points.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    lo = max(1e-2, float(points["intensity"].min()) / 4)
    hi = float(points["intensity"].max()) * 4
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    for device, (gbps, peak) in roofs.items():
        ax.plot(x, np.minimum(peak, gbps * x / 1e3), "-", linewidth=2, label=f"roof: {device}")
        on = points[points["device_name"] == device]
        for label, part in _groups(on, set()):
            ax.scatter(
                part["intensity"], part["tflops"], s=25, zorder=5, label=f"{part['experiment'].iloc[0]} {label}".strip()
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP/byte, estimated)",
        ylabel="achieved TFLOP/s",
        title="Roofline: measured bandwidth and peak of each device",
    )
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def _roofs(rows: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per device: (memory bandwidth GB/s, peak TFLOP/s), from the hardware experiment's rows."""
    hw = rows[(rows["experiment"].astype("string") == "hardware") & (rows["status"].astype("string") == "ok")]
    roofs = {}
    for device, part in hw.groupby("device_name"):
        copy = part[part["measurement"].astype("string").str.contains("memory copy")]
        peak = part["peak_tflops"] if "peak_tflops" in part else pd.Series(dtype=float)
        if len(copy) and peak.notna().any():
            roofs[str(device)] = (float(copy["gbps"].max()), float(peak.max()))
    return roofs


def allreduce(rows: pd.DataFrame) -> Any:
    """Bus bandwidth against message size (comm experiment)."""
    if rows.empty or "bus_gbps" not in rows:
        return None
    part = rows.dropna(subset=["bus_gbps", "bytes_per_rank"])
    if part.empty:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, g in _groups(part, {"cfg.experiment.min_bytes", "cfg.experiment.max_bytes"}):
        g = g.sort_values("bytes_per_rank")
        ax.plot(g["bytes_per_rank"], g["bus_gbps"], "o-", label=label or "measured")
    ax.set(
        xscale="log",
        xlabel="message size per rank (bytes)",
        ylabel="bus bandwidth (GB/s)",
        title="Allreduce bandwidth vs message size",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_all(table: pd.DataFrame, out_dir: Path, rows: pd.DataFrame | None = None) -> list[str]:
    """PNG files for what the results allow; returns the lines to print (what was written, or why not)."""
    try:
        plt = _plt()
    except ImportError:
        return [MISSING_MATPLOTLIB]
    figures = {"scaling.png": scaling(table), "batch_size.png": batch_size(table)}
    if rows is not None:
        figures["roofline.png"] = roofline(rows)
        figures["allreduce.png"] = allreduce(rows)
    lines = []
    for name, fig in figures.items():
        if fig is None:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        lines.append(f"plot: {out_dir / name}")
    if not lines:
        lines.append(
            "plots: nothing to plot here (scaling needs a device count among the compared keys, "
            "batch_size a sweep over trainer.batch_size, roofline hardware rows and ops with an intensity)"
        )
    return lines


def svg(fig: Any) -> str:
    """A figure as inline SVG text (for the self-contained HTML report)."""
    plt = _plt()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


# --- builders for the HTML report (perflab.report) -------------------------------------------


def _runs(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The rows one run each (one point of a sweep), labelled by the config keys that vary
    between runs, and by the device where runs differ in it (a run's own mix of devices is in
    its measurement names); repeats of one point get #2, #3 ..."""
    if "run_id" not in rows or rows["run_id"].nunique() <= 1:
        return [("", rows)]
    keys = [
        c
        for c in rows.columns
        if c.startswith("cfg.") and not c.startswith("cfg.results.") and rows[c].astype("string").nunique() > 1
    ]
    parts = [g for _, g in rows.groupby("run_id", sort=False, observed=True)]
    devices = [tuple(g["device_name"].astype("string").unique()) if "device_name" in g else () for g in parts]
    by_device = len(set(devices)) > 1 and all(len(d) == 1 for d in devices)
    labelled: dict[str, list[pd.DataFrame]] = {}
    order: dict[str, tuple] = {}
    for part, device in zip(parts, devices):
        first = part.iloc[0]
        words = [f"{k.removeprefix('cfg.')}={_plain(first[k])}" for k in keys]
        words += [str(device[0])] if by_device else []
        label = ", ".join(words)
        labelled.setdefault(label, []).append(part)
        order[label] = tuple(_order(first[k]) for k in keys) + ((str(device[0]),) if by_device else ())
    out = []
    for label in sorted(labelled, key=lambda x: order[x]):
        found = labelled[label]
        out += [(label + (f" #{i + 1}" if len(found) > 1 else ""), part) for i, part in enumerate(found)]
    return out


def _order(v: object) -> tuple[int, float, str]:
    """Numbers in numeric order, before text."""
    try:
        return (0, float(v), "")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def _plain(v: object) -> str:
    """A config value as typed (32, not the 32.0 a column with empty cells reads back as)."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _cell(row: pd.Series, column: str) -> float:
    """A row's number in ``column`` (NaN when it has none)."""
    try:
        return float(row[column]) if column in row and pd.notna(row[column]) else math.nan
    except (TypeError, ValueError):
        return math.nan


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["status"].astype("string") == "ok"] if "status" in rows else rows


def compile_break_even(rows: pd.DataFrame) -> Any:
    """Compilers (13.1): per mode, the cumulative time of k calls, first_call_s + (k-1) x
    median_s, against eager's k x median_s; the call at which compiling has paid for itself
    (break_even_calls) marked. Log-log: a first call of seconds beside calls of microseconds."""
    if rows.empty or not {"measurement", "median_s", "first_call_s"} <= set(rows.columns):
        return None
    ok = _ok(rows).dropna(subset=["median_s", "first_call_s"])
    curves = []  # (label, eager median, [(mode, first, median, break_even)])
    for label, run in _runs(ok):
        names = run["measurement"].astype("string")
        eager = run[names == "eager"]
        modes = run[names != "eager"]
        if eager.empty or modes.empty:
            continue
        found = []
        for _, r in modes.iterrows():
            found.append(
                (str(r["measurement"]), float(r["first_call_s"]), float(r["median_s"]), _cell(r, "break_even_calls"))
            )
        curves.append((label, float(eager["median_s"].iloc[0]), found))
    if not curves:
        return None
    finite = [be for _, _, found in curves for *_, be in found if math.isfinite(be)]
    catch_up = [first / e for _, e, found in curves for _, first, _, _ in found if e > 0]
    k_max = min(1e9, max([100.0, *(10 * be for be in finite), *(3 * c for c in catch_up)]))
    k = np.unique(np.round(np.logspace(0, math.log10(k_max), 300)))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, e, found in curves:
        prefix = f"{label}: " if label else ""
        ax.plot(k, k * e, "--", color="black", linewidth=1.2, label=f"{prefix}eager (k x {e:.3g} s)")
        for mode, first, s, be in found:
            (line,) = ax.plot(k, first + (k - 1) * s, "-", linewidth=1.8)
            if math.isfinite(be):
                ax.plot([be], [first + (be - 1) * s], "o", color=line.get_color(), markersize=7, zorder=5)
                line.set_label(f"{prefix}{mode}: pays off after {be:.0f} calls")
            else:
                line.set_label(f"{prefix}{mode}: never pays off")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="calls k (count)",
        ylabel="cumulative time of k calls (s)",
        title="Compile break-even: first call + (k-1) x median vs eager",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def alone_together(rows: pd.DataFrame) -> Any:
    """Automatic parallelism (13.3): each "... alone" and "... together" measurement as a bar
    (TFLOP/s where the rows have it, else the median time), the together bar with its achieved
    concurrency and, as a black tick, where it would be at the ideal concurrency (one per device)."""
    if rows.empty or "measurement" not in rows:
        return None
    names = rows["measurement"].astype("string")
    part = _ok(rows[names.str.endswith(" alone") | names.str.endswith(" together")])
    if part.empty:
        return None
    rate = "tflops" in part and bool(part["tflops"].notna().all())
    metric = "tflops" if rate else "median_s"
    labels, values, errors, ideals, notes = [], [], [], [], []
    for label, run in _runs(part):
        together = run["measurement"].astype("string").str.endswith(" together")
        run = pd.concat([run[~together], run[together]])
        bars = run[metric].astype(float)
        err = _iqr_bars(run, bars)
        for i, (_, r) in enumerate(run.iterrows()):
            labels.append(f"{label}: {r['measurement']}" if label else str(r["measurement"]))
            values.append(float(r[metric]))
            errors.append(err[:, i] if err is not None else (0.0, 0.0))
            c, n = _cell(r, "concurrency"), _cell(r, "ideal_concurrency")
            if c > 0 and n > 0:
                ideals.append(float(r[metric]) * (n / c if rate else c / n))
                notes.append(f"concurrency {c:.2f} of an ideal {n:g}")
            else:
                ideals.append(math.nan)
                notes.append("")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.45 * len(labels)))
    y = np.arange(len(labels))[::-1]
    ax.barh(y, values, xerr=np.array(errors).T, capsize=3, color="#4c72b0")
    ax.set_yticks(y, labels, fontsize=8)
    marks = [(ideal, yi) for yi, ideal in zip(y, ideals) if math.isfinite(ideal)]
    if marks:
        ax.plot(*zip(*marks), "|", color="black", markersize=18, mew=2, label="ideal concurrency")
    for yi, v, note in zip(y, values, notes):
        if note:
            ax.annotate(note, (v, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_xlim(0, max(v for v in [*values, *(i for i in ideals if math.isfinite(i))]) * 1.45)
    ax.set(
        xlabel="achieved TFLOP/s (higher is better)" if rate else "median time per call (s, lower is better)",
        title="Each device alone, then all devices together",
    )
    if marks:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def timings(rows: pd.DataFrame, title: str) -> Any:
    """Median time per call of each ok measurement (error bars: IQR of the raw samples);
    a log axis when the times span more than 100x."""
    if rows.empty or "median_s" not in rows:
        return None
    part = _ok(rows).dropna(subset=["median_s"])
    if part.empty:
        return None
    labels, values, errors = [], [], []
    for label, run in _runs(part):
        med = run["median_s"].astype(float)
        err = _iqr_bars(run, med)
        for i, (_, r) in enumerate(run.iterrows()):
            labels.append(f"{label}: {r['measurement']}" if label else str(r["measurement"]))
            values.append(float(r["median_s"]))
            errors.append(err[:, i] if err is not None else (0.0, 0.0))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.4 * len(labels)))
    y = np.arange(len(labels))[::-1]
    ax.barh(y, values, xerr=np.array(errors).T, capsize=3, color="#55a868")
    ax.set_yticks(y, labels, fontsize=8)
    if min(values) > 0 and max(values) / min(values) > 100:
        ax.set_xscale("log")
    ax.set(xlabel="median time per call (s)", title=title)
    fig.tight_layout()
    return fig


# --- history (perflab.history) ----------------------------------------------------------------

CHANGE_COLORS = {"regression": "tab:red", "improvement": "tab:green", "suspicious": "tab:orange"}
MAX_TRENDS = 8  # series in one figure; more would hide each other


def trend(series: list[Any], changes: list[Any]) -> Any:
    """Each series' metric against the subject (the code under test, in order), its change points
    marked between the two subjects that bracket them, coloured by label; one panel per metric."""
    from perflab.compare import UNITS

    plt = _plt()
    shown = series[:MAX_TRENDS]
    metrics = list(dict.fromkeys(s.metric for s in shown))
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3.2 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics):
        names: list[str] = []
        for s in (s for s in shown if s.metric == metric):
            for sub in s.subjects:
                if sub.name not in names:
                    names.append(sub.name)
        for s in (s for s in shown if s.metric == metric):
            x = [names.index(sub.name) for sub in s.subjects]
            ax.plot(x, [sub.value for sub in s.subjects], marker="o", label=s.label)
            for c in (c for c in changes if c.series is s):
                where = (names.index(s.subjects[c.at - 1].name) + names.index(s.subjects[c.at].name)) / 2
                color = CHANGE_COLORS.get(c.label, "tab:gray")
                ax.axvline(where, color=color, linestyle="--", zorder=3)
                ax.annotate(
                    f"{c.label} {c.change_pct:+.0f} %",
                    (where, 1.0),
                    xycoords=("data", "axes fraction"),
                    color=color,
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
        unit = UNITS.get(metric, "")
        ax.set_ylabel(f"{metric} ({unit})" if unit else metric)
        ax.set_xticks(range(len(names)), [n[:14] for n in names], rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("subject (results.subject: the code under test, in order)")
        ax.set_title(f"Trend of {metric} over the code under test", pad=16)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig
