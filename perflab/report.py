"""One self-contained HTML report of any results tree: ``python -m perflab.report PATH... -o report.html``.

A section per experiment, in the order of the book's chapter 13 (13.1 compilers ... 13.7
parameter servers): its headline, the book's reference numbers beside ours where the book has
them (and on which hardware they were measured), its plots and a table of its rows. Then the
machines the rows came from, and every warning: noisy or suspect figures, CPU fall-backs,
skipped parts and why, errors.

Plots: matplotlib figures inlined as SVG (``plots.svg``). No JavaScript library and no network:
the file opens anywhere, offline, forever (a CDN-loaded plotting library would not); vector
figures stay crisp at any zoom and in print; and matplotlib is already what ``compare --plot``
draws with (the ``compare``/``report`` extras), so the figures here and there are the same
builders. Without matplotlib the report still renders (headlines, tables, warnings) and says
that plots need it. The one inline script only counts what rendered (sections, drawn plots,
script errors, fetched resources) into ``data-*`` attributes of ``<body>``, for the tests.
"""

from __future__ import annotations

import argparse
import html
import math
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from perflab import files, registry
from perflab.history import report_section as trend_section  # the trend over subjects, where there is a history
from perflab.rows import number
from perflab.table import flags, human_time, rate, spread

# Experiment (the rows' ``experiment`` column: the preset's name) -> (book section, title).
CHAPTERS: dict[str, tuple[str, str]] = {
    "compile": ("13.1", "Compilers"),
    "async_compute": ("13.2", "Asynchronous computation"),
    "auto_parallel": ("13.3", "Automatic parallelism"),
    "matmul": ("13.3", "Automatic parallelism"),
    "hardware": ("13.4", "Hardware"),
    "train": ("13.5", "Training on multiple GPUs"),
    "lenet_scratch": ("13.5", "Training on multiple GPUs"),
    "resnet18_concise": ("13.6", "Concise multi-GPU"),
    "comm": ("13.7", "Parameter servers"),
}
TRAINING = "train"  # the module behind train, lenet_scratch, resnet18_concise (and any training preset)

# The book's setups (Dive into Deep Learning, chapter 13, PyTorch), only where we are sure of
# them: (what, the book's, the row column that holds ours). Its printed *timings* for 13.1,
# 13.2, 13.5 and 13.6 are outputs of the book's own build: they differ between its editions
# and the machine is not printed beside them, so none are quoted (no number we cannot vouch
# for). 13.4's figures come with the hardware rows (book_reference, book_note), 13.7's with the
# comm rows (book_s).
BOOK_SETUPS: dict[str, list[tuple[str, str, str]]] = {
    "compile": [("network", "MLP 512-256-128-2, one input of 512 values per call", "_compile_setup")],
    "async_compute": [
        ("work per timed block", "10 x (a random 1000 x 1000 matrix, multiplied by itself)", "_async_setup"),
        ("where", "NumPy on the CPU vs PyTorch on a GPU, without and with a sync", "_devices"),
    ],
    "auto_parallel": [("work per device", "50 matmuls of 4000 x 4000 on each of 2 GPUs", "_auto_parallel_setup")],
    "lenet_scratch": [
        ("model", "LeNet, data parallelism from scratch", "model"),
        ("devices", "1 GPU, then 2 GPUs", "n_devices"),
        ("global batch", "256 on 1 and on 2 GPUs", "global_batch"),
        ("learning rate", "0.2", "lr"),
        ("epochs", "10", "epochs"),
    ],
    "resnet18_concise": [
        ("model", "ResNet-18 (the book's small-input variant), nn.DataParallel", "model"),
        ("devices", "1 GPU, then 2 GPUs", "n_devices"),
        ("global batch", "256 on 1 GPU, 512 on 2", "global_batch"),
        ("learning rate", "0.1 on 1 GPU, 0.2 on 2", "lr"),
        ("epochs", "10", "epochs"),
    ],
}
BOOK_SETUPS["train"] = BOOK_SETUPS["lenet_scratch"]
BOOK_WORDS = {
    "compile": "Book 13.1's setup",
    "async_compute": "Book 13.2's setup",
    "auto_parallel": "Book 13.3's setup",
    "lenet_scratch": "Book 13.5's setup",
    "train": "Book 13.5's setup (this preset is the generic trainer: compare the settings before the figures)",
    "resnet18_concise": "Book 13.6's setup",
}

MAX_TABLE_ROWS = 500  # per section; the CSV holds every row
MAX_WARNINGS = 200  # per kind of warning
MAX_HEADLINE_RUNS = 50  # headlines of the first runs of a big sweep
MATPLOTLIB_LINE = "Plots need matplotlib, which is not installed here: pip install 'perflab[report]'."
ENV_COLUMNS = ("hostname", "torch", "cuda", "python", "cpu", "git_sha", "perflab_version")
ENV_DETAILS = (
    "device_name",
    "devices",
    "num_threads",
    "cpus",
    "cuda_available",
    "load_before",
    "load_after",
    "others_cpu_pct",
    "slurm_job_id",
    "slurm_node",
    "slurm_nodes",
)
FAILED = ("error", "oom", "timeout", "cancelled")


class ReportError(ValueError):
    """A path or output the report cannot use: one line."""


# --- rows -------------------------------------------------------------------------------------


def _missing(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    try:
        return isinstance(v, float) and math.isnan(v)
    except TypeError:
        return False


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts the way the experiments' headline() reads them: an empty cell is absent,
    a whole number is an int (a column with empty cells reads back as floats: 1.0 graphs)."""
    return [{k: _whole(v) for k, v in r.items() if not _missing(v)} for r in df.to_dict("records")]


def _whole(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**53 else v


def text(v: Any) -> str:
    return "" if _missing(v) else str(v)


def module_of(name: str, rows: pd.DataFrame) -> str:
    """The experiment module behind a preset (``lenet_scratch`` -> ``train``)."""
    if "cfg.experiment.name" in rows:
        found = rows["cfg.experiment.name"].dropna().astype("string")
        if len(found):
            return str(found.iloc[0])
    return name


def section_order(experiments: Mapping[str, str]) -> list[str]:
    """Presets in the chapter's order; unknown presets after the known ones of their module's chapter."""
    order = list(CHAPTERS)

    def key(name: str) -> tuple[int, int, str]:
        if name in CHAPTERS:
            return (order.index(name), 0, name)
        module = experiments[name]
        return (order.index(module) if module in CHAPTERS else len(order), 1, name)

    return sorted(experiments, key=key)


def varying(rows: pd.DataFrame) -> list[str]:
    """The config keys that differ between these rows (what a sweep swept)."""
    from perflab.compare import identity_columns

    return [c for c in identity_columns(rows) if rows[c].astype("string").nunique(dropna=False) > 1]


def _sort_value(v: Any) -> tuple[int, float, str]:
    x = number(v)
    return (0, x, "") if x is not None else (1, 0.0, text(v))


def runs(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Rows run by run (sweep point by point, in the order of the keys swept), each labelled by
    the keys that vary (``devices.count=2``); "" when there is one run."""
    if "run_id" not in rows or rows["run_id"].nunique(dropna=False) <= 1:
        return [("", rows)]
    keys = varying(rows)
    found = []
    for _, part in rows.groupby("run_id", sort=False, dropna=False, observed=True):
        first = part.iloc[0]
        label = ", ".join(f"{k.removeprefix('cfg.')}={text(_whole(first[k]))}" for k in keys)
        found.append((tuple(_sort_value(first[k]) for k in keys), label or f"run {text(first['run_id'])}", part))
    found.sort(key=lambda t: t[0])
    return [(label, part) for _, label, part in found]


# --- samples (error bars) ---------------------------------------------------------------------


def load_samples(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Each row's raw sample seconds (not its warm-up), by row_id."""
    from perflab.compare import samples_by_row
    from perflab.rows import RESULTS, SAMPLES

    places = []
    for p in map(Path, paths):
        if p.is_dir():
            places.append(p)
        elif p.name == RESULTS and (p.parent / SAMPLES).is_file():
            places.append(p.parent / SAMPLES)  # a run's rows given as its CSV file: its samples beside it
    return samples_by_row(places) if places else {}


def with_samples(rows: pd.DataFrame, samples: dict[str, Any], metric: str) -> pd.DataFrame:
    """``rows`` with ``_samples``: each row's samples as values of ``metric`` (for error bars)."""
    from perflab.compare import sample_values

    if not samples or rows.empty:
        return rows
    values = [sample_values(samples, r, metric) for _, r in rows.iterrows()]
    out = rows.copy()  # one block per column type again (a loaded tree is fragmented)
    out["_samples"] = values
    return out


# --- html pieces ------------------------------------------------------------------------------


def esc(v: Any) -> str:
    return html.escape(text(v))


def table_html(
    header: Sequence[str], body: Iterable[Sequence[Any]], cls: str = "", row_attrs: Sequence[str] = ()
) -> str:
    attrs = list(row_attrs)
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    lines = []
    for i, cells in enumerate(body):
        extra = f" {attrs[i]}" if i < len(attrs) and attrs[i] else ""
        lines.append(f"<tr{extra}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table>'


def bullet_list(lines: Iterable[str], cls: str) -> str:
    items = "".join(f"<li>{esc(line)}</li>" for line in lines if line)
    return f'<ul class="{cls}">{items}</ul>' if items else ""


class Figures:
    """Builds figures into inline SVG, each with ids of its own (several SVGs share one document)."""

    def __init__(self) -> None:
        self.count = 0
        self.problems: list[str] = []
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.available = False
        else:
            self.available = True

    def figure(self, kind: str, build: Callable[[], Any], why_none: str, caption: str = "") -> str:
        """A ``<figure>`` with the plot, or one line saying why there is none."""
        if not self.available:
            return f'<p class="noplot" data-plot="{esc(kind)}">{esc(MATPLOTLIB_LINE)}</p>'
        from perflab import plots

        fig = None
        try:
            fig = build()
            if fig is None:
                return f'<p class="noplot" data-plot="{esc(kind)}">{esc(why_none)}</p>' if why_none else ""
            titles = [t for ax in fig.axes if (t := ax.get_title())]
            drawn = plots.svg(fig)
        except Exception as err:  # one plot's failure must not cost the whole report
            line = f"{kind} plot failed: {type(err).__name__}: {err}"
            self.problems.append(line)
            if fig is not None:
                import matplotlib.pyplot as plt

                plt.close(fig)
            return f'<p class="noplot failed" data-plot="{esc(kind)}">{esc(line)}</p>'
        self.count += 1
        svg = scoped_ids(strip_metadata(drawn), f"f{self.count}-")
        title = "; ".join(titles)
        svg = svg.replace("<svg ", f'<svg role="img" aria-label="{esc(title)}" ', 1)
        words = f"{title}. {caption}" if caption else title
        return f'<figure class="plot" data-plot="{esc(kind)}">{svg}<figcaption>{esc(words)}</figcaption></figure>'


def strip_metadata(svg: str) -> str:
    """Without matplotlib's <metadata> (a creator URL and a date: nothing to show)."""
    return re.sub(r"<metadata>.*?</metadata>\s*", "", svg, count=1, flags=re.S)


def scoped_ids(svg: str, prefix: str) -> str:
    """Every id in one SVG, and every reference to one, prefixed: unique across the document."""
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r'((?:xlink:)?href)="#([^"]+)"', lambda m: f'{m.group(1)}="#{prefix}{m.group(2)}"', svg)
    return re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", svg)


# --- the report -------------------------------------------------------------------------------


class Report:
    """The page for a set of rows: ``Report(df, sources, samples).render()`` -> HTML text."""

    def __init__(self, df: pd.DataFrame, sources: Sequence[str], samples: Mapping[str, Any] | None = None) -> None:
        self.df = df
        self.sources = [str(s) for s in sources]
        self.samples = dict(samples or {})
        self.figures = Figures()
        self.notes: list[tuple[str, str, str]] = []  # (section, what, detail): the report's own warnings

    # one section per experiment ---------------------------------------------------------------

    def experiments(self) -> dict[str, str]:
        if "experiment" not in self.df:
            return {"(unnamed)": "(unnamed)"} if len(self.df) else {}
        names = self.df["experiment"].astype("string").fillna("(unnamed)")
        return {str(n): module_of(str(n), self.df[names == n]) for n in names.unique()}

    def rows_of(self, name: str) -> pd.DataFrame:
        if "experiment" not in self.df:
            return self.df
        return self.df[self.df["experiment"].astype("string").fillna("(unnamed)") == name]

    def section(self, name: str, module: str) -> str:
        rows = self.rows_of(name)
        chapter = (CHAPTERS.get(name) or CHAPTERS.get(module) or ("", ""))[0]
        try:
            metric = registry.get(module).metric if module in registry.names() else "median_s"
        except (ImportError, TypeError):
            metric = "median_s"
        parts = [
            f'<section class="experiment" id="{section_id(name)}" data-experiment="{esc(name)}" '
            f'data-chapter="{esc(chapter)}">',
            f"<h2>{esc(heading(name, module))} <small>{esc(name)}</small></h2>",
            f'<p class="about">{self.about(rows)}</p>',
        ]
        headline = self.headline(name, module, rows)
        if headline:
            parts.append(f'<div class="headline"><h3>Headline</h3>{headline}</div>')
        book = self.book(name, module, rows)
        if book:
            parts.append(f'<div class="book"><h3>The book beside this tree</h3>{book}</div>')
        if module == TRAINING:
            parts.append(self.training_plots(name, rows))
        elif plots_html := self.plots(name, module, rows, metric):
            parts.append(f'<div class="plots">{plots_html}</div>')
        parts.append("<h3>Rows</h3>" + self.rows_table(rows, metric))
        parts.append("</section>")
        return "\n".join(parts)

    def about(self, rows: pd.DataFrame) -> str:
        n_runs = rows["run_id"].nunique() if "run_id" in rows else 1
        counts = rows["status"].astype("string").value_counts() if "status" in rows else pd.Series(dtype=int)
        status = ", ".join(f"{n} {s}" for s, n in counts.items())
        keys = [k.removeprefix("cfg.") for k in varying(rows)]
        devices = sorted({text(d) for d in rows.get("device_name", pd.Series(dtype="string")).dropna()})
        words = f"{len(rows)} rows ({status}) from {n_runs} run{'s' if n_runs != 1 else ''}"
        if keys:
            words += f"; swept: {', '.join(keys)}"
        if devices:
            words += f"; on {', '.join(devices)}"
        return esc(words)

    def headline(self, name: str, module: str, rows: pd.DataFrame) -> str:
        if module not in registry.names():
            return ""
        lines = []
        labelled = runs(rows)
        for label, part in labelled[:MAX_HEADLINE_RUNS]:
            try:
                found = registry.get(module).headline(records(part))
            except Exception as err:  # an experiment's headline must not cost the report
                self.notes.append((name, "headline failed", f"{type(err).__name__}: {err}"))
                continue
            lines += [f"{label}: {line}" if label else line for line in found if line]
        if len(labelled) > MAX_HEADLINE_RUNS:
            lines.append(f"... and {len(labelled) - MAX_HEADLINE_RUNS} more runs (python -m perflab.results)")
        return bullet_list(lines, "headline")

    # the book ----------------------------------------------------------------------------------

    def book(self, name: str, module: str, rows: pd.DataFrame) -> str:
        out = []
        if module == "hardware":
            out.append(self.book_hardware(rows))
        if module == "comm":
            out.append(self.book_comm(rows))
        setup = BOOK_SETUPS.get(name) or (BOOK_SETUPS.get(module) if module != TRAINING else None)
        if setup:
            out.append(self.book_setup(name, module, setup, rows))
        return "".join(x for x in out if x)

    def book_hardware(self, rows: pd.DataFrame) -> str:
        if "book_reference" not in rows:
            return ""
        lines, body = [], []
        for r in records(_ok(rows)):
            ref = number(r.get("book_reference"))
            value, unit = number(r.get("gbps")), "GB/s"
            if value is None or "latency" in str(r.get("measurement")):
                value, unit = number(r.get("latency_us")), "us"
            if ref is None or value is None:
                continue
            where = text(r.get("device_name")) or "this machine"
            note = text(r.get("book_note"))
            lines.append(f"{r['measurement']}: this machine ({where}) says {value:.3g} {unit}; {note}")
            body.append(
                [esc(r["measurement"]), esc(where), esc(f"{value:.3g} {unit}"), esc(f"{ref:g} {unit}"), esc(note)]
            )
        if not body:
            return ""
        head = ["measurement", "this machine", "here", "the book", "the book's hardware and where it says so"]
        return bullet_list(lines, "beside") + table_html(head, body, "book")

    def book_comm(self, rows: pd.DataFrame) -> str:
        out = []
        names = rows["measurement"].astype("string") if "measurement" in rows else pd.Series(dtype="string")
        models = records(rows[names.str.startswith("model: ").fillna(False)])
        seen = set()
        body = []
        for r in models:
            key = (r.get("measurement"), r.get("model_s"), r.get("book_s"))
            if key in seen:
                continue
            seen.add(key)
            model, book = number(r.get("model_s")), number(r.get("book_s"))
            body.append(
                [esc(str(r["measurement"]).removeprefix("model: ")), esc(human_time(book)), esc(human_time(model))]
            )
        if body:
            out.append(
                "<p>Book 13.7's worked example (160 MB of gradients; PCIe at 16 GB/s; NVLink at 18 GB/s a link, "
                "V100s): its figures beside the cost model's.</p>"
                + table_html(["case", "the book", "the cost model"], body, "book")
            )
        measured = records(_ok(rows[names.str.startswith("allreduce ").fillna(False)]))
        body = []
        for r in measured:
            if number(r.get("model_ring_s")) is None:
                continue
            link = text(r.get("cfg.experiment.link_gbps"))
            body.append(
                [
                    esc(r["measurement"]),
                    esc(f"{r.get('world_size', '')} x {r.get('backend', '')}"),
                    esc(human_time(r.get("median_s"))),
                    esc(human_time(r.get("model_ring_s")) + (f" at {link} GB/s" if link else "")),
                ]
            )
        if body:
            out.append(
                "<p>Measured here beside the ring model at the configured link (experiment.link_gbps):</p>"
                + table_html(["allreduce", "workers", "measured (median)", "ring model"], body, "book")
            )
        return "".join(out)

    def book_setup(self, name: str, module: str, setup: list[tuple[str, str, str]], rows: pd.DataFrame) -> str:
        body = []
        for what, theirs, column in setup:
            body.append([esc(what), esc(theirs), esc(self.ours(column, rows))])
        words = BOOK_WORDS.get(name) or BOOK_WORDS.get(module) or "The book's setup"
        intro = (
            f"<p>{esc(words)}. The book's printed timings for this section are not quoted: they come out of "
            "its own build, differ between its editions, and name no machine.</p>"
        )
        return intro + table_html(["", "the book", "this tree"], body, "book")

    def ours(self, column: str, rows: pd.DataFrame) -> str:
        """This tree's value of a setup line, run by run."""
        if not column:
            return ""
        values = []
        for label, part in runs(rows):
            r = records(part[part["measurement"].astype("string") == "train"] if column in TRAIN_COLUMNS else part)
            if not r:
                continue
            first = r[-1]
            if column == "_compile_setup":
                value = f"{first.get('cfg.experiment.model', '?')}, batch {first.get('cfg.experiment.batch', '?')}"
            elif column == "_async_setup":
                n = first.get("cfg.experiment.size", "?")
                value = f"{first.get('cfg.experiment.steps', '?')} x ({n} x {n})"
            elif column == "_devices":
                value = ", ".join(sorted({text(x.get("device_name")) for x in r if x.get("device_name")}))
            elif column == "_auto_parallel_setup":
                devices = {text(x.get("devices")) for x in r if str(x.get("measurement", "")).endswith(" alone")}
                big = all(str(d).startswith("cuda") for d in devices) and devices
                n, k = ("size", "matmuls") if big else ("cpu_size", "cpu_matmuls")
                size = first.get(f"cfg.experiment.{n}", "?")
                value = (
                    f"{first.get(f'cfg.experiment.{k}', '?')} matmuls of {size} x {size} "
                    f"on each of {len(devices)} device(s)"
                )
            else:
                v = first.get(column)
                value = "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
            if value:
                values.append(f"{label}: {value}" if label else value)
        return "; ".join(dict.fromkeys(values))

    # plots -------------------------------------------------------------------------------------

    def plots(self, name: str, module: str, rows: pd.DataFrame, metric: str) -> str:
        from perflab import plots

        f = self.figures
        out = []
        if module == "compile":
            timed = with_samples(rows, self.samples, "median_s")
            out.append(
                f.figure(
                    "compile_break_even",
                    lambda: plots.compile_break_even(timed),
                    "compile break-even: needs an ok eager row and a compiled mode with its first call",
                    "Dots: the call after which compiling has paid for itself.",
                )
            )
        elif module == "async_compute":
            timed = with_samples(rows, self.samples, "median_s")
            out.append(
                f.figure(
                    "timings",
                    lambda: plots.timings(timed, "Host dispatch vs device time"),
                    "timings: no ok rows",
                    "Error bars: interquartile range of the raw samples.",
                )
            )
        elif module in ("matmul", "auto_parallel"):
            metric_rows = with_samples(rows, self.samples, "tflops" if "tflops" in rows else "median_s")
            out.append(
                f.figure(
                    "alone_together",
                    lambda: plots.alone_together(metric_rows),
                    "alone vs together: no ok alone/together rows",
                    "Error bars: interquartile range of the raw samples.",
                )
            )
            if not self.has_hardware():
                out.append(
                    '<p class="noplot" data-plot="roofline">A roofline of these points needs the hardware '
                    "experiment's rows on the same device in the tree (perflab +experiment=hardware).</p>"
                )
        elif module == "hardware":
            out.append(
                f.figure(
                    "roofline",
                    lambda: plots.roofline(self.roofline_rows()),
                    "roofline: no ok rows with an arithmetic intensity on a device the hardware rows measured",
                    "Every measured op or training step of the tree on a device with measured roofs.",
                )
            )
        elif module == "comm":
            out.append(
                f.figure(
                    "allreduce",
                    lambda: plots.allreduce(self.allreduce_rows(rows)),
                    "allreduce: no ok allreduce rows (it needs 2 or more workers: devices.count=2)",
                )
            )
        return "".join(out)

    def roofline_rows(self) -> pd.DataFrame:
        """The tree's rows for plots.roofline, without their config columns (its legend would name
        every key that differs anywhere in the tree); a sweep's points named by what they swept."""
        parts = []
        for name in self.experiments():
            rows = self.rows_of(name)
            if name != "hardware" and "intensity" in rows:  # only the points it can draw name its runs
                rows = _ok(rows).dropna(subset=["intensity"])
            for label, part in runs(rows):
                part = part.drop(columns=[c for c in part.columns if c.startswith("cfg.")])
                if label:
                    part = part.assign(measurement=label + ": " + part["measurement"].astype("string"))
                parts.append(part)
        return pd.concat(parts, ignore_index=True) if parts else self.df

    @staticmethod
    def allreduce_rows(rows: pd.DataFrame) -> pd.DataFrame:
        """The ok allreduce rows as one series per config (the message size is the x axis)."""
        found = _ok(rows)
        found = found[found["measurement"].astype("string").str.startswith("allreduce ").fillna(False)]
        return found.assign(measurement="allreduce")

    def has_hardware(self) -> bool:
        return "experiment" in self.df and bool((self.df["experiment"].astype("string") == "hardware").any())

    def training_plots(self, name: str, rows: pd.DataFrame) -> str:
        """compare()'s table of the points, then the scaling and batch-size plots."""
        from perflab import plots

        table, notes = self.training_table(name, rows)
        out = [self.scaling_table(table)] if table is not None else []
        for note in notes:
            self.notes.append((name, "compare", note))
        if notes:
            out.append('<p class="note">' + "<br>".join(esc(n) for n in notes) + "</p>")
        if table is None:
            return "".join(out)
        figures = [
            self.figures.figure(
                "scaling",
                lambda: plots.scaling(table),
                "scaling: needs runs over devices.count (a sweep: devices.count=1,2)",
                "Dashed: ideal linear scaling. Error bars (3 or more timed epochs): interquartile range "
                "of the epoch rates.",
            ),
            self.figures.figure(
                "batch_size",
                lambda: plots.batch_size(table),
                "speed and accuracy vs batch size: needs runs over trainer.batch_size",
            ),
        ]
        return "".join(out) + f'<div class="plots">{"".join(figures)}</div>'

    def training_table(self, name: str, rows: pd.DataFrame) -> tuple[pd.DataFrame | None, list[str]]:
        """compare()'s table of the training runs (S(n), E(n) when the device count varies),
        with each point's raw values for error bars."""
        from perflab import compare

        ok = _ok(rows)
        if ok.empty:
            return None, []
        try:
            table = compare.compare(rows=ok, samples=self.samples)
        except compare.CompareError as err:
            return None, [str(err)]
        if table.empty:
            return None, list(table.attrs.get("notes", []))
        return table, list(table.attrs.get("notes", []))

    def scaling_table(self, table: pd.DataFrame) -> str:
        count = next((c for c in ("cfg.devices.count", "n_devices") if c in table), None)
        keys = [c for c in table.columns if c.startswith("cfg.") and c != count]
        metric = str(table["metric"].iloc[0])
        header = ["point", "devices", f"{metric}", "per device", "S(n)", "E(n)", "test acc", "runs", "suspect"]
        body = []
        for _, e in table.iterrows():
            point = ", ".join(f"{k.removeprefix('cfg.')}={text(e[k])}" for k in keys) or text(e.get("measurement"))
            n = number(e.get(count)) if count else None
            body.append(
                [
                    esc(point),
                    esc(f"{n:g}" if n is not None else ""),
                    esc(_fmt(e.get(metric))),
                    esc(_fmt(e.get("per_device_items_per_s"))),
                    esc(_fmt(e.get("speedup"), "{:.2f}x")),
                    esc(_fmt(e.get("efficiency"), "{:.0%}")),
                    esc(_fmt(e.get("test_acc"), "{:.3f}")),
                    esc(text(e.get("runs"))),
                    esc(text(e.get("suspect"))),
                ]
            )
        return "<p>Compared point by point (python -m perflab.compare):</p>" + table_html(header, body, "compare")

    # rows --------------------------------------------------------------------------------------

    def rows_table(self, rows: pd.DataFrame, metric: str) -> str:
        labelled = runs(rows)
        show_run = len(labelled) > 1
        header = (["run"] if show_run else []) + [
            "measurement",
            "status",
            "n",
            "median",
            "IQR",
            "rate",
            "flags",
            "notes",
        ]
        body, attrs = [], []
        shown = 0
        for label, part in labelled:
            for r in records(part.iloc[: max(0, MAX_TABLE_ROWS - shown)]):
                shown += 1
                status = text(r.get("status"))
                ok = status == "ok" and number(r.get("median_s")) is not None
                name = text(r.get("measurement"))
                if number(r.get("epoch")) is not None:
                    name += f" {int(number(r.get('epoch')) or 0)}"
                flagged = flags(r)
                notes = [text(r.get(c)) for c in ("error", "suspect", "note") if text(r.get(c))]
                cells = [
                    esc(name),
                    f'<span class="status {esc(status)}">{esc(status)}</span>',
                    esc(r.get("n")) if ok else "",
                    esc(human_time(r.get("median_s"))) if ok else "",
                    esc(spread(r)) if ok else "",
                    esc(rate(r, metric)),
                    esc(flagged),
                    esc(" · ".join(dict.fromkeys(notes))),
                ]
                body.append(([esc(label)] if show_run else []) + cells)
                attrs.append(f'class="{esc(status)}{" flagged" if flagged else ""}"')
        more = len(rows) - shown
        tail = f'<p class="note">{more} more rows not shown here: the CSV files hold every row.</p>' if more > 0 else ""
        return table_html(header, body, "rows", attrs) + tail

    # environment and warnings ------------------------------------------------------------------

    def environment(self) -> str:
        df = self.df
        keys = [c for c in ENV_COLUMNS if c in df]
        if not keys or df.empty:
            return (
                '<section id="environment"><h2>Environment</h2><p>No environment columns in these rows.</p></section>'
            )
        blocks = []
        for values, part in df.groupby(keys, dropna=False, sort=True, observed=True):
            values = values if isinstance(values, tuple) else (values,)
            body = [[esc(k), esc(v)] for k, v in zip(keys, values)]
            body.append(["experiments", esc(", ".join(sorted({text(x) for x in part.get("experiment", [])})))])
            body.append(["runs, rows", esc(f"{part['run_id'].nunique() if 'run_id' in part else 1}, {len(part)}")])
            for col in ENV_DETAILS:
                if col not in part or part[col].isna().all():
                    continue
                body.append([esc(col), esc(_summary(part[col], col))])
            if "fallback" in part:
                why = sorted({text(x) for x in part["fallback"].dropna() if text(x)})
                if why:
                    body.append(["fallback", esc(" | ".join(why))])
            if "timestamp" in part and part["timestamp"].notna().any():
                t = pd.to_datetime(part["timestamp"], utc=True, errors="coerce").dropna()
                if len(t):
                    body.append(["measured", esc(f"{t.min():%Y-%m-%d %H:%M} to {t.max():%Y-%m-%d %H:%M} UTC")])
            blocks.append(table_html(["", ""], body, "env"))
        return (
            '<section id="environment"><h2>Environment</h2>'
            "<p>Each machine and software set the rows came from (load: the 1-minute load average before "
            "a measurement; others_cpu_pct: CPU share other processes used while it ran).</p>"
            + "".join(blocks)
            + "</section>"
        )

    def warnings(self) -> tuple[str, dict[str, int]]:
        df = self.df
        kinds: dict[str, list[list[str]]] = {}

        def add(kind: str, r: Mapping[str, Any], detail: str) -> None:
            kinds.setdefault(kind, []).append(
                [esc(r.get("experiment")), esc(r.get("measurement")), esc(r.get("run_id")), esc(detail)]
            )

        flagged = pd.Series(False, index=df.index)
        if "status" in df:
            flagged |= df["status"].astype("string").fillna("") != "ok"
        for column, flag in (("suspect", ""), ("noisy", "False")):
            if column in df:
                flagged |= ~df[column].astype("string").fillna(flag).isin([flag, ""])
        for r in records(df[flagged]):
            status = text(r.get("status"))
            if status in FAILED:
                add("error", r, f"{status}: {text(r.get('error'))}")
            elif status == "skipped":
                add("skipped", r, text(r.get("error")) or "no reason given")
            if text(r.get("suspect")):
                add("suspect", r, text(r.get("suspect")))
            if noisy(r):
                add(
                    "noisy",
                    r,
                    f"IQR {spread(r)} of the median over n={text(r.get('n'))} samples (above bench.noise_threshold)",
                )
        fallback = []
        if "fallback" in df:
            for why, part in df[df["fallback"].fillna("").astype("string") != ""].groupby("fallback", observed=True):
                names = ", ".join(sorted({text(x) for x in part.get("experiment", [])}))
                fallback.append(["", esc(names), "", esc(f"{why} ({len(part)} rows)")])
        if fallback:
            kinds["fallback"] = fallback
        for section, what, detail in self.notes + [("", "plot", p) for p in self.figures.problems]:
            kinds.setdefault("report", []).append([esc(section), esc(what), "", esc(detail)])
        titles = {
            "error": "Errors (rows that failed)",
            "skipped": "Skipped parts, and why",
            "suspect": "Suspect figures",
            "noisy": "Noisy measurements (IQR / median above bench.noise_threshold)",
            "fallback": "Fall-backs (ran elsewhere than asked: the CPU for a missing GPU, say)",
            "report": "Notes from building this report",
        }
        counts = {k: len(kinds[k]) for k in titles if kinds.get(k)}
        blocks = []
        for kind in titles:
            found = kinds.get(kind)
            if not found:
                continue
            shown = found[:MAX_WARNINGS]
            more = f'<p class="note">and {len(found) - len(shown)} more</p>' if len(found) > len(shown) else ""
            header = ["experiment", "measurement", "run", "detail"]
            blocks.append(
                f'<div class="warning" data-kind="{kind}"><h3>{esc(titles[kind])} ({len(found)})</h3>'
                + table_html(header, shown, "warnings", [f'data-kind="{kind}"'] * len(shown))
                + more
                + "</div>"
            )
        body = "".join(blocks) or "<p>None: no errors, skips, suspect or noisy figures, or fall-backs.</p>"
        return f'<section id="warnings"><h2>Warnings</h2>{body}</section>', counts

    # the page ----------------------------------------------------------------------------------

    def render(self) -> str:
        experiments = self.experiments()
        order = section_order(experiments)
        sections = [self.section(name, experiments[name]) for name in order]
        env = self.environment()
        warnings, counts = self.warnings()
        toc = "".join(
            f'<li><a href="#{section_id(n)}">{esc(heading(n, experiments[n]))}</a> <small>{esc(n)}</small></li>'
            for n in order
        )
        toc += '<li><a href="#environment">Environment</a></li>'
        total = sum(counts.values())
        toc += f'<li><a href="#warnings">Warnings ({total})</a></li>'
        glance = ", ".join(f"{n} {k}" for k, n in counts.items())
        n_runs = self.df["run_id"].nunique() if "run_id" in self.df else 0
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        top = [
            f"<p>{len(self.df)} rows from {n_runs} runs, {len(order)} experiments; "
            f"from {esc(', '.join(self.sources))}; written {esc(when)}.</p>",
            f'<p class="glance">Warnings: <a href="#warnings">{esc(glance) if glance else "none"}</a></p>',
        ]
        if not self.figures.available:
            top.append(f'<p class="noplot matplotlib">{esc(MATPLOTLIB_LINE)}</p>')
        return PAGE.format(
            title=esc(f"perflab report: {', '.join(order) or 'no rows'}"),
            css=CSS,
            guard=GUARD_JS,
            top="".join(top),
            toc=toc,
            sections="\n".join([*sections, trend_section(self.df, self.samples)]),
            environment=env,
            warnings=warnings,
            script=CHECK_JS,
        )


TRAIN_COLUMNS = {"model", "n_devices", "global_batch", "lr", "epochs"}
TEXT_LIKE = ("devices", "device_name", "num_threads", "slurm_job_id", "slurm_node", "slurm_nodes")


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["status"].astype("string") == "ok"] if "status" in rows else rows


def noisy(r: Mapping[str, Any]) -> bool:
    return str(r.get("noisy")) == "True"


def _fmt(v: Any, pattern: str = "{:.4g}") -> str:
    x = number(v)
    return pattern.format(x) if x is not None else ""


def _summary(values: pd.Series, column: str) -> str:
    """A column over many rows in a few words: its range (numbers), or its distinct values."""
    values = values.dropna()
    numeric = pd.to_numeric(values, errors="coerce") if not pd.api.types.is_bool_dtype(values) else None
    if numeric is not None and numeric.notna().all() and column not in TEXT_LIKE:
        lo, hi = (_whole(round(float(x), 3)) for x in (numeric.min(), numeric.max()))
        return f"{lo}" if lo == hi else f"{lo} to {hi}"
    distinct = list(dict.fromkeys(text(_whole(v)) for v in values))
    return ", ".join(distinct[:12]) + (f" (+{len(distinct) - 12} more)" if len(distinct) > 12 else "")


def heading(name: str, module: str) -> str:
    """``13.5 Training on multiple GPUs``: the book section of a preset (or of its module)."""
    chapter, title = CHAPTERS.get(name) or CHAPTERS.get(module) or ("", "Other experiments")
    return f"{chapter} {title}".strip()


def section_id(name: str) -> str:
    return "sec-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name)


def build(*paths: str | Path) -> str:
    """The report's HTML for the results under ``paths`` (run dirs, sweep dirs, trees, CSV files)."""
    from perflab.results import load

    if not paths:
        raise ReportError("give one or more results paths (a results tree, a run or sweep dir, a CSV file)")
    for p in paths:
        if not Path(p).exists():
            raise ReportError(f"{p}: no such file or folder")
    try:
        df = load(*paths)
    except FileNotFoundError as err:
        raise ReportError(str(err)) from None
    if df.empty:
        raise ReportError(f"no result rows under {', '.join(map(str, paths))}")
    return Report(df, [str(p) for p in paths], load_samples(paths)).render()


def check_output(out: Path) -> None:
    """``out`` can be written (a regular file or a new one in a writable folder): checked before
    anything is loaded, so a bad -o costs nothing."""
    from perflab.errors import ConfigError

    try:
        files.check_file("-o", out, "an HTML file path (a regular file or a new one)")
    except ConfigError as err:
        raise ReportError(err.line()) from None


def write(html_text: str, out: Path) -> Path:
    """The report into ``out`` at once (a temp file renamed): a reader never sees half of it."""
    check_output(out)
    try:
        files.write_atomic(out, html_text)
    except OSError as err:
        raise ReportError(f"{out}: {err.strerror or err}") from None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perflab.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="PATH", help="results trees, run or sweep dirs, or CSV files")
    parser.add_argument("-o", "--output", type=Path, default=Path("report.html"), help="default: report.html")
    args = parser.parse_args(argv)
    try:
        check_output(args.output)
        write(build(*args.paths), args.output)
    except ReportError as err:
        print(f"perflab.report: error: {err}", file=sys.stderr)
        return 2
    print(args.output)
    return 0


# --- the page's fixed parts -------------------------------------------------------------------

# First in <head>: collects script errors and console errors, so the self-check can count them.
GUARD_JS = """
window.__reportErrors = [];
window.addEventListener("error", function (e) { window.__reportErrors.push(String(e.message || e)); });
(function () {
  var original = console.error;
  console.error = function () {
    window.__reportErrors.push(Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
})();
"""

# Last in <body>: once loaded, what rendered, as data-* attributes of <body> (and of each section).
CHECK_JS = """
window.addEventListener("load", function () {
  var drawn = function (el) { var r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  var body = document.body, sections = document.querySelectorAll("section.experiment");
  var plots = document.querySelectorAll("figure.plot"), ok = 0, shown = 0;
  plots.forEach(function (f) {
    var svg = f.querySelector("svg");
    var yes = svg !== null && drawn(svg) && svg.querySelectorAll("path, use, text").length > 0;
    f.dataset.drawn = yes ? "1" : "0";
    if (yes) { ok += 1; }
  });
  sections.forEach(function (s) {
    var r = s.getBoundingClientRect();
    s.dataset.top = Math.round(r.top + window.scrollY);
    s.dataset.height = Math.round(r.height);
    if (drawn(s)) { shown += 1; }
    s.dataset.plotsDrawn = s.querySelectorAll('figure.plot[data-drawn="1"]').length;
  });
  body.dataset.height = document.documentElement.scrollHeight;
  body.dataset.sections = sections.length;
  body.dataset.sectionsDrawn = shown;
  body.dataset.plots = plots.length;
  body.dataset.plotsDrawn = ok;
  body.dataset.resources = performance.getEntriesByType("resource").length;
  body.dataset.errors = window.__reportErrors.length;
  body.dataset.errorText = window.__reportErrors.join(" | ");
  body.dataset.ready = "1";
});
"""

CSS = """
:root { --ink: #1d232b; --muted: #5d6875; --line: #d9dee5; --bg: #ffffff; --soft: #f4f6f9;
        --ok: #2f7d32; --warn: #a35d00; --bad: #b3261e; --accent: #2c5d9e; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
       color: var(--ink); background: var(--bg); }
header, main, footer { max-width: 1180px; margin: 0 auto; padding: 0 24px; }
header { padding-top: 24px; border-bottom: 1px solid var(--line); }
h1 { margin: 0 0 4px; font-size: 26px; }
h2 { margin: 32px 0 4px; font-size: 21px; border-bottom: 2px solid var(--accent); padding-bottom: 4px; }
h2 small, nav small { color: var(--muted); font-weight: normal; font-family: ui-monospace, monospace; font-size: 13px; }
h3 { margin: 18px 0 6px; font-size: 16px; }
a { color: var(--accent); }
nav ol { columns: 2; padding-left: 20px; margin: 8px 0 16px; }
.about, .note, figcaption { color: var(--muted); font-size: 13px; }
.glance { font-weight: 600; }
ul.headline { background: var(--soft); border-left: 4px solid var(--accent); padding: 8px 12px 8px 28px; margin: 0; }
ul.beside { padding-left: 20px; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
figure.plot { margin: 8px 0; padding: 8px; border: 1px solid var(--line); border-radius: 6px; background: #fff;
              flex: 0 1 560px; max-width: 100%; }
figure.plot svg { display: block; width: 100%; height: auto; }
.noplot { color: var(--muted); font-style: italic; font-size: 13px; }
.noplot.failed, .noplot.matplotlib { color: var(--bad); font-style: normal; font-weight: 600; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; width: 100%; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
table.env { width: auto; min-width: 50%; }
table.env td:first-child { color: var(--muted); white-space: nowrap; }
td { font-variant-numeric: tabular-nums; }
.status { font-weight: 600; }
.status.ok { color: var(--ok); }
.status.skipped { color: var(--warn); }
.status.error, .status.oom, .status.timeout, .status.cancelled { color: var(--bad); }
tr.flagged td { background: #fff8e6; }
.warning h3 { color: var(--warn); }
.warning[data-kind="error"] h3 { color: var(--bad); }
footer { color: var(--muted); font-size: 12px; padding: 24px; }
@media print { figure.plot { break-inside: avoid; } nav { display: none; } }
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<script>{guard}</script>
<style>{css}</style>
</head>
<body>
<header>
<h1>perflab report</h1>
{top}
<nav><ol>{toc}</ol></nav>
</header>
<main>
{sections}
{environment}
{warnings}
</main>
<footer>Written by python -m perflab.report: self-contained (no network, no external files).
Figures: matplotlib SVG.</footer>
<script>{script}</script>
</body>
</html>
"""


if __name__ == "__main__":
    sys.exit(main())
