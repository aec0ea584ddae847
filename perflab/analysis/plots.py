"""Figures a person reads: titled, axes with units, integer device counts, the ideal line on
top and matching what is drawn, error bars from the raw samples (interquartile range), runs
named by what differs between them ("4 devices, batch 512"), and legends beside the axes where
they never cover a point. Each builder takes rows (or a comparison table) and returns a
matplotlib Figure, or None when the rows hold nothing it could draw.

Which figures an experiment has is its own business (its ``report`` hook lists them, with
their rows); the HTML report inlines them as SVG (:func:`svg`) and ``compare --plot`` writes
them as PNG (:func:`write`). This module names no experiment."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from perflab.analysis import frames
from perflab.analysis.table import human_bytes
from perflab.store import files
from perflab.store.columns import unit_of

if TYPE_CHECKING:
    from perflab.config.contract import Figure

SOFTWARE = "perflab plots"  # in each PNG's metadata: what says a file is one of ours


def is_plot(path: Path) -> bool:
    return files.holds(path, [SOFTWARE.encode()])


MISSING_MATPLOTLIB = "plots: matplotlib is not installed (pip install 'perflab[compare]'): no plots written"
COUNT_KEYS = ("cfg.devices.count", "n_devices")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Any, Any]:
    """A figure whose layout makes room for a legend outside its axes (constrained layout)."""
    return _plt().subplots(1, ncols, figsize=(width, height), layout="constrained")


def _legend(fig: Any, ax: Any) -> None:
    """The legend outside the axes, never over the data: to their right, or under them when its
    labels are long. None when nothing is labelled."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles or labels == ["measured"]:  # one series needs no key
        return
    long = max(map(len, labels)) > 32
    where = "outside lower center" if long else "outside right upper"
    fig.legend(handles, labels, loc=where, fontsize=7, frameon=False, ncols=1)


def _groups(df: pd.DataFrame, exclude: set[str]) -> list[tuple[str, pd.DataFrame]]:
    """The rows by the config keys (and device, measurement) that vary, except ``exclude``,
    each named by their values."""
    keys = [c for c in df.columns if c.startswith("cfg.") and c not in exclude and df[c].astype("string").nunique() > 1]
    keys += [c for c in ("measurement", "device") if c in df and df[c].astype("string").nunique() > 1]
    if not keys:
        return [("", df)]
    out = []
    for _, g in df.groupby(keys, dropna=False, sort=True):
        first = g.iloc[0]
        named = [frames.label([k], first) if k.startswith("cfg.") else frames.text(first[k]) for k in keys]
        out.append((", ".join(n for n in named if n), g))
    return out


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


# --- comparison tables (perflab.compare) ---------------------------------------------------------


def scaling(table: pd.DataFrame) -> Any:
    """S(n) against the device count, per group of the other keys, under the ideal S(n) = n over
    the counts drawn."""
    count = next((k for k in COUNT_KEYS if k in table and "speedup" in table), None)
    if count is None:
        return None
    drawn = table.dropna(subset=["speedup", count])  # not the rows of experiments without a device count
    if drawn.empty:
        return None
    fig, ax = _figure(6.5, 4.2)
    for label, part in _groups(drawn, {count}):
        part = part.sort_values(count)
        ax.errorbar(
            part[count],
            part["speedup"],
            yerr=_iqr_bars(part, part["speedup"]),
            fmt="o-",
            capsize=3,
            label=label or "measured",
        )
    above = drawn[pd.to_numeric(drawn["efficiency"], errors="coerce") > 1] if "efficiency" in drawn else drawn.iloc[:0]
    if len(above):  # never a point above linear without its flag: the cause is in the table's suspect
        ax.scatter(
            above[count],
            above["speedup"],
            s=160,
            facecolors="none",
            edgecolors="red",
            zorder=11,
            label="suspect: above linear (see suspect)",
        )
    n = np.sort(pd.to_numeric(drawn[count]).unique())
    ax.plot(n, n, "--", color="black", linewidth=1.5, zorder=10, label="ideal (linear)")
    ax.set_xticks(n, [str(int(v)) for v in n])
    ax.minorticks_off()
    ax.set(
        xlabel="devices",
        ylabel="speedup S(n) over one device (x)",
        title="Scaling: throughput(n) / throughput(1 device)",
    )
    _legend(fig, ax)
    return fig


def batch_size(table: pd.DataFrame) -> Any:
    """Speed and final test accuracy against the batch size (training)."""
    batch = "cfg.trainer.batch_size"
    if batch not in table or table[batch].nunique() < 2:
        return None
    metric = str(table["metric"].iloc[0]) if "metric" in table else "items_per_s"
    unit = frames.unit(table)  # what throughput counts: images, tokens ...
    counted = frames.unit(table, "batch_unit", default=unit)  # what a batch counts: images, sequences ...
    fig, (left, right) = _figure(10, 4.2, ncols=2)
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
    sizes = sorted(int(b) for b in table[batch].dropna().unique())
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
    words = {"items_per_s": f"throughput ({unit}/s)", "median_s": "median time (s)"}.get(metric, metric)
    left.set(xlabel=f"global batch size ({counted})", ylabel=words, title="Speed vs batch size")
    right.set(
        xlabel=f"global batch size ({counted})", ylabel="final test accuracy (fraction)", title="Accuracy vs batch size"
    )
    _legend(fig, right)
    return fig


# --- rows ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roof:
    """A device's ceilings for one precision: memory bandwidth and peak, and where they come from."""

    device: str  # the rows' device_name
    dtype: str  # the precision whose points it bounds: float32, bfloat16, tf32 ...
    gbps: float
    tflops: float
    source: str = "measured"


def point_dtype(rows: pd.DataFrame) -> pd.Series:
    """The precision that bounds each row's FLOPs: ``flops_dtype``, else its ``precision``
    (bf16-mixed -> bfloat16), else float32 (torch's default)."""
    from perflab.measure.flops import PRECISION_DTYPE

    found = pd.Series("float32", index=rows.index, dtype="string")
    if "precision" in rows:
        mapped = rows["precision"].astype("string").map(lambda p: PRECISION_DTYPE.get(str(p), pd.NA))
        found = mapped.fillna(found).astype("string")
    if "flops_dtype" in rows:
        found = rows["flops_dtype"].astype("string").fillna(found)
    return found


def roofline(rows: pd.DataFrame, roofs: Sequence[Roof]) -> Any:
    """Each measured op or training step at its (estimated) arithmetic intensity, under the roof
    of its own device *and precision* (bandwidth x intensity, capped by the peak); a colour per
    experiment, and only the roofs some point is drawn under."""
    if rows.empty or not {"intensity", "tflops", "device_name"} <= set(rows.columns) or not roofs:
        return None
    points = frames.ok(rows).dropna(subset=["intensity", "tflops"])
    dtypes = point_dtype(points)
    by: dict[tuple[str, str], list[Roof]] = {}
    for r in roofs:  # a device and precision may have a measured roof and a datasheet one
        by.setdefault((r.device, r.dtype), []).append(r)
    under = [(str(d), str(t)) in by for d, t in zip(points["device_name"], dtypes)]
    points, dtypes = points[under], dtypes[under]
    if points.empty:
        return None
    fig, ax = _figure(7, 5)
    used = sorted({(str(d), str(t)) for d, t in zip(points["device_name"], dtypes)})
    # Wide enough for the points and for each drawn roof's ridge (where bandwidth meets the peak):
    # a roof cut off before its ridge would hide the peak it stands for.
    ridges = [1e3 * r.tflops / r.gbps for key in used for r in by[key] if r.gbps > 0]
    lo = max(1e-2, float(points["intensity"].min()) / 4)
    hi = max([float(points["intensity"].max()) * 4, *(2 * ridge for ridge in ridges)])
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    precisions = sorted({t for _, t in used})  # a line style and a marker each: roofs that coincide stay apart
    style = {t: ("-", "--", ":", "-.")[i % 4] for i, t in enumerate(precisions)}
    marker = {t: "o^sD"[i % 4] for i, t in enumerate(precisions)}
    for r in (r for key in used for r in by[key]):
        measured = r.source == "measured"  # the datasheet's: thin and grey beside it
        ax.plot(
            x,
            np.minimum(r.tflops, r.gbps * x / 1e3),
            style[r.dtype],
            linewidth=2 if measured else 1,
            color=("black" if len(used) == 1 else None) if measured else "grey",
            label=f"{r.source} roof, {r.device} {r.dtype}: {r.gbps:.3g} GB/s, {r.tflops:.3g} TFLOP/s",
        )
    names = points["experiment"].astype("string").fillna("?") if "experiment" in points else pd.Series("rows")
    for (name, dtype), part in points.groupby([names, dtypes], sort=True):
        words = f"{name}, {dtype}" if len(precisions) > 1 else str(name)
        ax.scatter(
            part["intensity"], part["tflops"], s=28, zorder=5, marker=marker[str(dtype)], label=f"{words} ({len(part)})"
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP/byte, estimated)",
        ylabel="achieved TFLOP/s",
        title="Roofline: each point under its device's roof for its precision",
    )
    _legend(fig, ax)
    return fig


def allreduce(rows: pd.DataFrame) -> Any:
    """Bus bandwidth against message size, one line per configuration."""
    if rows.empty or "bus_gbps" not in rows:
        return None
    part = rows.dropna(subset=["bus_gbps", "bytes_per_rank"])
    if part.empty:
        return None
    fig, ax = _figure(6.5, 4)
    for label, g in _groups(part.drop(columns=["measurement"]), set()):  # a message size each: one line
        g = g.sort_values("bytes_per_rank")
        ax.plot(g["bytes_per_rank"], g["bus_gbps"], "o-", label=label or "measured")
    sizes = sorted(int(b) for b in part["bytes_per_rank"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [human_bytes(b) for b in sizes])
    ax.minorticks_off()
    ax.set(
        xlabel="message size per rank",
        ylabel="bus bandwidth (GB/s)",
        title="Allreduce bandwidth vs message size",
    )
    _legend(fig, ax)
    return fig


def _cell(row: pd.Series, column: str) -> float:
    """A row's number in ``column`` (NaN when it has none)."""
    try:
        return float(row[column]) if column in row and pd.notna(row[column]) else math.nan
    except (TypeError, ValueError):
        return math.nan


def compile_break_even(rows: pd.DataFrame) -> Any:
    """Per mode, the cumulative time of k calls, first_call_s + (k-1) x median_s, against
    eager's k x median_s; the call at which compiling has paid for itself (break_even_calls)
    marked. Log-log: a first call of seconds beside calls of microseconds."""
    if rows.empty or not {"measurement", "median_s", "first_call_s"} <= set(rows.columns):
        return None
    ok = frames.ok(rows).dropna(subset=["median_s", "first_call_s"])
    curves = []  # (label, eager median, [(mode, first, median, break_even)])
    for label, run in frames.runs(ok):
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
    fig, ax = _figure(7, 5)
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
    _legend(fig, ax)
    return fig


def alone_together(rows: pd.DataFrame) -> Any:
    """Each "... alone" and "... together" measurement as a bar (TFLOP/s where the rows have it,
    else the median time), the together bar with its achieved concurrency and, as a black tick,
    where it would be at the ideal concurrency (one per device)."""
    if rows.empty or "measurement" not in rows:
        return None
    part = pd.concat([frames.measured(rows, suffix=" alone"), frames.measured(rows, suffix=" together")])
    if part.empty:
        return None
    rate = "tflops" in part and bool(part["tflops"].notna().all())
    metric = "tflops" if rate else "median_s"
    labels, values, errors, ideals, notes = [], [], [], [], []
    for label, run in frames.runs(part.sort_index()):
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
    fig, ax = _figure(7.5, 1.6 + 0.45 * len(labels))
    y = np.arange(len(labels))[::-1]
    ax.barh(y, values, xerr=np.array(errors).T, capsize=3, color="#4c72b0")
    ax.set_yticks(y, labels, fontsize=8)
    marks = [(ideal, yi) for yi, ideal in zip(y, ideals) if math.isfinite(ideal)]
    if marks:
        ax.plot(*zip(*marks), "|", color="black", markersize=18, mew=2, label="at the ideal concurrency")
    for yi, v, note in zip(y, values, notes):
        if note:
            ax.annotate(note, (v, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_xlim(0, max(v for v in [*values, *(i for i in ideals if math.isfinite(i))]) * 1.45)
    ax.set(
        xlabel="achieved TFLOP/s (higher is better)" if rate else "median time per call (s, lower is better)",
        title=_alone_together_title(part, len(frames.runs(part))),
    )
    _legend(fig, ax)
    return fig


def _alone_together_title(part: pd.DataFrame, runs: int) -> str:
    """What the bars are: devices alone and together, or (a sweep of one device, say) alone only."""
    together = part["measurement"].astype("string").str.endswith(" together").any()
    title = "Each device alone, then all devices together" if together else "Each device alone (nothing run together)"
    return title + (f", in each of {runs} runs" if runs > 1 else "")


def timings(rows: pd.DataFrame, title: str = "Median time per call") -> Any:
    """Median time per call of each ok measurement (error bars: IQR of the raw samples);
    a log axis when the times span more than 100x."""
    if rows.empty or "median_s" not in rows:
        return None
    part = frames.ok(rows).dropna(subset=["median_s"])
    if part.empty:
        return None
    labels, values, errors = [], [], []
    for label, run in frames.runs(part):
        med = run["median_s"].astype(float)
        err = _iqr_bars(run, med)
        for i, (_, r) in enumerate(run.iterrows()):
            labels.append(f"{label}: {r['measurement']}" if label else str(r["measurement"]))
            values.append(float(r["median_s"]))
            errors.append(err[:, i] if err is not None else (0.0, 0.0))
    fig, ax = _figure(7.5, 1.6 + 0.4 * len(labels))
    y = np.arange(len(labels))[::-1]
    ax.barh(y, values, xerr=np.array(errors).T, capsize=3, color="#55a868")
    ax.set_yticks(y, labels, fontsize=8)
    if min(values) > 0 and max(values) / min(values) > 100:
        ax.set_xscale("log")
    ax.set(xlabel="median time per call (s)", title=title)
    return fig


# --- history (perflab.history) ----------------------------------------------------------------

CHANGE_COLORS = {"regression": "tab:red", "improvement": "tab:green", "suspicious": "tab:orange"}
MAX_TRENDS = 8  # series in one figure; more would hide each other
# A long history's figure keeps its size (the report's, in KB) whatever the subjects: past this
# many a series draws the median of each run of them (a step stays a step; its change point is
# marked where it is), and the axis names at most MAX_TICKS of them.
MAX_POINTS = 300
MAX_TICKS = 40


def trend(series: list[Any], changes: list[Any]) -> Any:
    """Each series' metric against the subject (the code under test, in order), its change points
    marked between the two subjects that bracket them, coloured by label, its suspect subjects
    (every row flagged) as crosses; one panel per metric."""
    plt = _plt()
    shown = series[:MAX_TRENDS]
    metrics = list(dict.fromkeys(s.metric for s in shown))
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3.2 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics):
        names: list[str] = []
        for s in (s for s in shown if s.metric == metric):
            names += s.names
        names = list(dict.fromkeys(names))
        at = {name: i for i, name in enumerate(names)}
        for s in (s for s in shown if s.metric == metric):
            x = np.array([at[name] for name in s.names], dtype=float)
            y = np.array(s.values, dtype=float)
            if len(x) > MAX_POINTS:  # the median of each run of subjects
                runs = np.array_split(np.arange(len(x)), MAX_POINTS)
                x, y = np.array([x[r].mean() for r in runs]), np.array([np.median(y[r]) for r in runs])
            (line,) = ax.plot(x, y, marker="o" if len(s.names) <= MAX_POINTS else None, label=s.label)
            flagged = [i for i, why in enumerate(s.suspect) if why]
            if flagged:  # each suspect subject as itself (at most MAX_POINTS of them: evenly spread)
                flagged = [
                    flagged[i] for i in np.linspace(0, len(flagged) - 1, min(len(flagged), MAX_POINTS)).astype(int)
                ]
                ax.plot(
                    [at[s.names[i]] for i in flagged],
                    [s.values[i] for i in flagged],
                    linestyle="none",
                    marker="x",
                    color=line.get_color(),
                    label=f"{s.label}: suspect (flagged)",
                    zorder=4,
                )
            for c in (c for c in changes if c.series is s):
                where = (at[s.names[c.at - 1]] + at[s.names[c.at]]) / 2
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
        shown_unit = unit_of(metric)
        ax.set_ylabel(f"{metric} ({shown_unit})" if shown_unit else metric)
        ticks = range(0, len(names), -(-len(names) // MAX_TICKS))
        ax.set_xticks(list(ticks), [names[i][:14] for i in ticks], rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("subject (results.subject: the code under test, in order)")
        ax.set_title(f"Trend of {metric} over the code under test", pad=16)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


# --- output --------------------------------------------------------------------------------------


def svg(fig: Any) -> str:
    """A figure as inline SVG text (for the self-contained HTML report)."""
    plt = _plt()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def write(figures: Sequence[tuple[str, Figure]], everything: pd.DataFrame, out_dir: Path) -> list[str]:
    """``compare --plot``: each (experiment, figure) that draws as ``NAME.png`` (``EXPERIMENT-NAME.png``
    where two experiments draw a figure of one name); a figure without rows of its own draws from
    ``everything``. Returns the lines to print: what was written, or why nothing was."""
    try:
        plt = _plt()
    except ImportError:
        return [MISSING_MATPLOTLIB]
    drawn, why = [], []
    for experiment, f in figures:
        fig = f.plot(everything if f.rows is None else f.rows)
        if fig is None:
            why.append(f.why_none or f"{f.name}: nothing to draw")
        else:
            drawn.append((experiment, f.name, fig))
    names = pd.Series([name for _, name, _ in drawn], dtype="string").value_counts()
    images = {}
    for experiment, name, fig in drawn:
        path = out_dir / (f"{name}.png" if names[name] == 1 else f"{experiment}-{name}.png")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight", metadata={"Software": SOFTWARE})
        plt.close(fig)
        images[path] = buf.getvalue()
    allowed = "a folder for perflab's plots (a new file, or a plot perflab wrote, at each name)"
    for path in images:  # all checked before any is written: a refusal leaves nothing half done
        files.check_replace("--plot", path, is_plot, allowed)
    lines = []
    for path, data in images.items():
        files.write_atomic(path, data)
        lines.append(f"plot: {path}")
    if not lines:
        lines.append("plots: nothing to plot here" + (f" ({'; '.join(dict.fromkeys(why))})" if why else ""))
    return lines
