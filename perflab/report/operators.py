"""The report's "Where the time went" section: the operators of the profiled measurements
(``bench.profile=true``), and, for a report of two trees (BASE NEW), each FAIL's moved
operators under its point with a side-by-side bar of the top ones (``perflab.analysis.attribution``).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import pandas as pd

from perflab.report.html import Figures, bullet_list, esc, table_html

TOP = 8  # operators shown a measurement, and bars a figure


def section(sources: Sequence[str], figures: Figures) -> str:
    """The section's HTML; "" where no source holds an operators.csv."""
    from perflab.results import load_operators

    try:
        ops = load_operators(*sources)
    except FileNotFoundError:  # a CSV file given as a source: no run dirs, no operators
        return ""
    if ops.empty:
        return ""
    parts = [
        '<section id="operators"><h2>Where the time went</h2>',
        "<p>Each profiled measurement's operators (bench.profile=true: a pass under torch.profiler after "
        "the timed samples): self time per measured call, the median over its processes; a range "
        "(record_function, a compiled region) holds its children's time.</p>",
    ]
    if len(sources) == 2:
        parts.append(_moved(sources, figures))
    for (experiment, measurement), lines in ops.groupby(["experiment", "measurement"], sort=True):
        per_op = lines.groupby(["operator", "kind"], as_index=False)[["calls", "self_s", "share"]].median()
        top = per_op.sort_values("self_s", ascending=False).head(TOP)
        cost = (lines["profiled_s"] / lines["median_s"]).median()
        rows = [
            [esc(r.operator), esc(r.kind), f"{r.calls:g}", f"{1e6 * r.self_s:.4g}", f"{100 * r.share:.1f}"]
            for r in top.itertuples()
        ]
        parts.append(
            f"<h3>{esc(experiment)}: {esc(measurement)}</h3>"
            f"<p>{lines['row_id'].nunique()} profiled process(es); a profiled call took {cost:.2g}x a timed one.</p>"
            + table_html(["operator", "kind", "calls", "self µs / call", "share %"], rows, "operators")
        )
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _moved(sources: Sequence[str], figures: Figures) -> str:
    """Each FAIL (or faster) point of BASE NEW with its moved operators and a bar of them."""
    from perflab.analysis import attribution, comparison

    try:
        table = comparison.ab(*sources)
    except Exception as err:  # the trees cannot be compared: said, the rest of the report stands
        return f"<p>BASE against NEW not compared: {esc(f'{type(err).__name__}: {err}')}</p>"
    table = attribution.explain(table, sources[0], sources[1])
    if "why_moved" not in table or table["why_moved"].isna().all():
        return "<p>BASE against NEW: no point FAILed or got significantly faster.</p>"
    out = []
    for _, point in table[table["why_moved"].notna()].iterrows():
        found = point["_moved"]
        title = f"{point['_name']}: {point['verdict']} ({point.get('change_pct', float('nan')):+.1f} %)"
        out.append(f"<h3>{esc(title)}</h3>" + bullet_list([point["why_moved"]], "moved"))
        if found is not None and not found.moved.empty:
            out.append(figures.figure("operators", functools.partial(_bars, found.moved, title), ""))
    return "\n".join(out)


def _bars(moved: pd.DataFrame, title: str) -> Any:
    """The top moved operators' self time per call, BASE beside NEW (horizontal bars, µs)."""
    import matplotlib.pyplot as plt
    import numpy as np

    top = moved.head(TOP)
    y = np.arange(len(top))
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(top) + 1.5))
    ax.barh(y - 0.2, 1e6 * top["base_s"].fillna(0), 0.4, label="BASE")
    ax.barh(y + 0.2, 1e6 * top["new_s"].fillna(0), 0.4, label="NEW")
    ax.set_yticks(y, [f"{o} ({v})" for o, v in zip(top["operator"], top["verdict"])])
    ax.invert_yaxis()
    ax.set_xlabel("self time per measured call (µs)")
    ax.set_title(f"Operators that moved: {title}")
    ax.legend()
    fig.tight_layout()
    return fig
