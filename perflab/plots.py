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
