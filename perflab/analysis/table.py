"""Terminal output: one line per row as it is recorded, the job's table at the end, the sweep's
table of points, compare's markdown table. One format per column, its column's
(:func:`shown`, ``columns.Column.format``): seconds as s/ms/us/ns, TFLOP/s, GB/s (a tiny rate
in a smaller prefix: MFLOP/s, MB/s), 46,676 <items>/s.
Notes and errors are never cut: they wrap, under the table, each printed once."""

from __future__ import annotations

import shutil
import textwrap
from typing import Any, Callable, Iterable, Mapping, Sequence

from perflab.store import columns
from perflab.store.rows import number

Row = Mapping[str, Any]


def human_time(s: Any) -> str:
    """Seconds as a short string in s, ms, us or ns ("" for an empty cell)."""
    s = number(s)
    if s is None:
        return ""
    if s == 0:
        return "0 s"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale * 0.9995:  # 999.6 us reads "1 ms", never "1e+03 us"
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def human_bytes(n: float) -> str:
    """Bytes as a short string in B, KiB, MiB or GiB (4096 -> "4 KiB")."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:.3g} {unit}"


PREFIXES = {"T": 1e12, "G": 1e9, "M": 1e6, "k": 1e3, "": 1.0}
SMALL = 0.01  # below this many of its unit a rate reads in a smaller one: 25.1 MFLOP/s, never 2.51e-05 TFLOP/s


def in_unit(v: float, unit: str) -> str:
    """A rate with its unit (TFLOP/s, GB/s ...); one below ``SMALL`` of it in the prefix that
    makes it a number of 1 or more (GFLOP/s, MFLOP/s, MB/s ...)."""
    prefix = next(
        (p for p in PREFIXES if p and unit.startswith(p) and unit[len(p) :].startswith(("FLOP/s", "B/s"))), ""
    )
    if prefix and 0 < abs(v) < SMALL:
        base = v * PREFIXES[prefix]
        smaller = next((p for p, scale in PREFIXES.items() if abs(base) >= scale * 0.9995), "")
        return f"{base / PREFIXES[smaller]:.3g} {smaller}{unit[len(prefix) :]}"
    return f"{v:.3g} {unit}"


def per_s(v: float, unit: str) -> str:
    """A count per second in its unit: 181,063 images/s, never 1.811e+05 (tables and headlines alike)."""
    return f"{plain(v)} {unit}"


def plain(v: float) -> str:
    """A number of no particular format: 4 significant digits, and a large one whole with its
    thousands separated (46,676, never 4.668e+04)."""
    return f"{v:,.0f}" if 1e4 <= abs(v) < 1e15 else f"{v:.4g}"


def shown(value: Any, column: str, items: str = "items") -> str:
    """A cell of ``column`` as every table writes it, by the column's format ("" when empty;
    item rates in the rows' own items: tokens/s)."""
    v = number(value)
    if v is None:
        return ""
    format = columns.format_of(column)
    if format == "time":
        return human_time(v)
    if format == "rate":
        return in_unit(v, columns.unit_of(column, items))
    if format == "count":
        return per_s(v, columns.unit_of(column, items) or column.removesuffix("_per_s") + "/s")
    return plain(v)


RATE_ORDER = ("tflops", "gbps", "bus_gbps", "items_per_s")  # a row's headline rate, by preference


def rate(r: Row, metric: str = "") -> str:
    """A row's headline rate: its experiment's metric if it is a rate, else TFLOP/s, GB/s,
    <items>/s, in that order of preference."""
    for col in ([metric] if metric in columns.RATES else []) + list(RATE_ORDER):
        if number(r.get(col)) is not None:
            return shown(r.get(col), col, str(r.get("items_unit") or "items"))
    return ""


def figure(r: Row, metric: str) -> str:
    """A row's value of its experiment's metric, with its unit ("" if it has none)."""
    if metric in columns.RATES:
        return rate(r, metric)
    value = number(r.get(metric))
    if value is None:
        return ""
    return human_time(value) if metric.endswith("_s") else f"{plain(value)} {metric}"


def spread(r: Row, few: int = columns.FEW_FOR_SPREAD) -> str:
    """IQR / median: the one spread perflab shows everywhere (terminal, report, compare's
    ``iqr_pct``) and the one ``bench.noise_threshold`` judges; "?" (unknown) from fewer than
    ``few`` samples."""
    iqr, median, n = number(r.get("iqr_s")), number(r.get("median_s")), number(r.get("n"))
    if median is None:
        return ""
    if iqr is None or (n is not None and n < few):
        return "?"
    return f"{iqr / median:.1%}" if median else ""


def flags(r: Row) -> str:
    """ "noisy" (IQR above the threshold) and/or "suspect" (a reason not to trust the figure)."""
    suspect = isinstance(r.get("suspect"), str) and bool(r.get("suspect"))  # NaN when read from a CSV
    return ", ".join(f for f, on in (("noisy", str(r.get("noisy")) == "True"), ("suspect", suspect)) if on)


def progress_line(row: Row, metric: str = "") -> str:
    """The line logged as each row is recorded."""
    status, name = row.get("status"), row.get("measurement")
    if status != "ok" or number(row.get("median_s")) is None:
        detail = row.get("error") or row.get("note") or ""
        return f"{name}: {status}{': ' + str(detail) if detail and status != 'ok' else ''}"
    text = f"{name}: median {human_time(row['median_s'])} (IQR {spread(row)}, n={row.get('n')}, {row.get('timer')})"
    if rate(row, metric):
        text += f", {rate(row, metric)}"
    if row.get("suspect"):
        text += "  [suspect]"
    return text


def job_table(
    rows: Sequence[Row], headline: Iterable[str] = (), metric: str = "", label: Callable[[Row], str] | None = None
) -> str:
    """The end-of-job table: one line per row (``label(row)`` names it; default: its
    measurement), then the notes and warnings, then the headline."""
    header = ["measurement", "status", "n", "median", "IQR", "rate", "flags"]
    lines = [header]
    notes: dict[str, list[str]] = {}
    for r in rows:
        ok = r.get("status") == "ok" and number(r.get("median_s")) is not None
        name = label(r) if label else str(r.get("measurement", ""))
        lines.append(
            [
                name,
                str(r.get("status", "")),
                str(r.get("n", "")) if ok else "",
                human_time(r.get("median_s")) if ok else "",
                spread(r) if ok else "",
                rate(r, metric),
                flags(r),
            ]
        )
        for text in (r.get("error"), r.get("suspect"), r.get("note")):
            if text and isinstance(text, str):
                notes.setdefault(text, []).append(name)
    if not any(line[-1] for line in lines[1:]):
        lines = [line[:-1] for line in lines]
    out = [_columns(lines)]
    if notes:
        width = max(60, min(120, shutil.get_terminal_size((100, 20)).columns))
        out.append("")
        for text, labels in notes.items():
            who = labels[0] if len(labels) == 1 else f"{labels[0]} (+{len(labels) - 1} more)"
            out.append(textwrap.fill(f"{who}: {text}", width=width, subsequent_indent="    "))
    headline = [h for h in headline if h]
    if headline:
        out += ["", *headline]
    return "\n".join(out)


def _columns(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths).rstrip())
    return "\n".join(text)


def points_table(points: Sequence[Mapping[str, str]]) -> str:
    """A sweep's points: one line each (job, its keys, outcome, headline)."""
    if not points:
        return ""
    header = list(points[0])
    return _columns([header] + [[str(p.get(h, "")) for h in header] for p in points])


# compare's table as a reader reads it: the point (its keys: cfg.*), what is judged, the verdict
# and why; every other column is behind ``--all-columns`` (and in --format csv and json).
READER_COLUMNS = (
    *("experiment", "measurement", "device", "subject", "metric", "runs", "iqr_pct", "speedup_vs_baseline"),
    *("speedup", "efficiency", "base", "new", "change_pct", "ci_low", "ci_high", "verdict", "why", "suspect"),
)
# One tree's judgements, which a verdict says (why) where there is one.
WITHOUT_VERDICT = ("speedup", "significance")


def markdown(df: Any, every: bool = False) -> str:
    """compare's table as markdown: the reader's columns (``every``: all), none that is empty in
    every row, each number in its column's format (base and new in their row's metric's), and
    a suspect row's first reason by its head ("the machine was busy ..."; csv has them whole)."""
    metrics = set(df["metric"].dropna().astype(str).unique().tolist()) if "metric" in df else set()
    visible = [
        c
        for c in df.columns
        if not c.startswith("_")
        and (every or c in READER_COLUMNS or c.startswith("cfg.") or c in metrics or c in WITHOUT_VERDICT)
        and (every or c not in WITHOUT_VERDICT or "verdict" not in df)
    ]
    if not every:  # the point, then what is judged, then the verdict
        visible.sort(key=lambda c: _place(c, metrics))
    read = df[list(dict.fromkeys([*visible, *(c for c in ("metric", "items_unit") if c in df)]))]
    # column by column (a dict a row, and a call a cell, were most of a table of 46k lines)
    values = {c: read[c].astype(object).where(read[c].notna(), None).tolist() for c in read.columns}
    nothing = [None] * len(read)
    metric, items = values.get("metric", nothing), values.get("items_unit", nothing)
    cells = [_cells(c, values[c], metric, items) for c in visible]  # a column each
    kept = [i for i, column in enumerate(cells) if any(column)] if len(read) else list(range(len(visible)))
    lines = [
        "| " + " | ".join(visible[i].removeprefix("cfg.") for i in kept) + " |",
        "|" + "|".join("---" for _ in kept) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*(cells[i] for i in kept))]
    return "\n".join(lines)


def _place(column: str, metrics: set[str]) -> float:
    """Where a reader's column stands: its keys after the point's names, a metric's own
    column (one tree) after ``metric``, a baseline's judgement last."""
    if column.startswith("cfg."):
        return READER_COLUMNS.index("subject") + 0.5
    if column in metrics:
        return READER_COLUMNS.index("metric") + 0.5
    return READER_COLUMNS.index(column) if column in READER_COLUMNS else len(READER_COLUMNS)


def _cells(column: str, values: list[Any], metrics: list[Any], items: list[Any]) -> list[str]:
    """A column's cells in its format, as :func:`shown` writes them (base and new in their row's
    metric's, each row's metric and items unit beside; a suspect row's reason by its head)."""
    judged = column in ("base", "new")  # in their row's metric's format
    format = columns.format_of(column)
    out = []
    made: dict[tuple, str] = {}  # an integer's cell, written once (a column of counts or keys repeats a few)
    for v, metric, unit in zip(values, metrics, items):
        if v is None:
            out.append("")
        elif isinstance(v, str):
            out.append(_head(v) if column == "suspect" and v else v)
        elif type(v) is int:
            key = (v, metric, unit)
            if key not in made:
                made[key] = _number(v, column, format, judged, metric, unit)
            out.append(made[key])
        else:
            out.append(_number(v, column, format, judged, metric, unit))
    return out


def _number(v: Any, column: str, format: str, judged: bool, metric: Any, unit: Any) -> str:
    """A cell of a value that is no text (:func:`_cells`)."""
    if (x := number(v)) is None or (type(v) is not float and str(v) in ("True", "False")):
        return str(v)
    if judged and metric:
        return shown(x, str(metric), str(unit or "items"))
    if format == "time":
        return human_time(x)
    if format == "":
        return plain(x)
    return shown(x, column, str(unit or "items"))


def _head(reason: str) -> str:
    """A suspect row's first reason by its head ("the machine was busy ..."; csv has them whole)."""
    head = reason.split(":")[0].split("; ")[0]
    return head + (" ..." if len(head) < len(reason) else "")
