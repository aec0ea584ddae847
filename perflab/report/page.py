"""The report page for a set of rows: ``Report(df, sources, samples).render()`` -> HTML text.

A section per preset, each drawn from its experiment's ``report`` hook (:class:`perflab.config.contract.Section`:
number and title, a few headline lines, the reference's setup beside this tree's, tables,
figures, notes) the same way for perflab's experiments and a user's; then the machines the rows
came from and every warning. This module names no experiment: what is special about one lives
in it.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from importlib import resources
from string import Template
from typing import Any, Mapping, Sequence

import pandas as pd

from perflab.analysis import frames
from perflab.analysis.frames import records, text
from perflab.analysis.table import flags, human_time, rate, spread
from perflab.config import contract, registry
from perflab.history import report_section as trend_section  # the trend over subjects, where there is a history
from perflab.report.html import MATPLOTLIB_LINE, Figures, bullet_list, esc, section_id, table_html
from perflab.report.operators import section as operators_section
from perflab.report.reproducibility import summary  # the book's claims judged, before the sections
from perflab.store.outcome import FAILED
from perflab.store.rows import number

MAX_TABLE_ROWS = 500  # per section; the CSV holds every row
MAX_WARNINGS = 200  # per kind of warning
MAX_HEADLINE_LINES = 4  # a section's headline; the rest is in its tables
MAX_HEADLINE_RUNS = 50  # the headline table of a big sweep
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
TEXT_LIKE = ("devices", "device_name", "num_threads", "slurm_job_id", "slurm_node", "slurm_nodes")
UNNAMED = "(unnamed)"
MAX_DEVICE_IDS = 8  # named in a section's first line; more are counted
MAX_NAMED = 4  # measurements named in one warning that they share; more are counted


def asset(name: str) -> str:
    """A file shipped beside this module (the page template, its CSS and scripts)."""
    return resources.files("perflab.report").joinpath(name).read_text(encoding="utf-8")


def order_key(number: str, name: str) -> tuple[tuple[float, ...], str]:
    """Sections by their number ("13.1" < "13.10"), unnumbered ones last, then by name."""
    try:
        parts = tuple(float(p) for p in number.split(".")) if number else (math.inf,)
    except ValueError:
        parts = (math.inf,)
    return parts, name


class Preset:
    """One preset's rows, its experiment (None when not installed here) and what its hook said."""

    def __init__(self, name: str, rows: pd.DataFrame, report: Report) -> None:
        self.name, self.rows = name, rows
        self.experiment: registry.Experiment | None = None
        self.data = contract.Section()
        try:
            self.experiment = registry.of_rows(rows)
            if self.experiment is not None:
                self.data = self.experiment.section(rows, report.samples)
        except Exception as err:  # an experiment's hook must not cost the whole report
            report.notes.append((name, "report hook failed", f"{type(err).__name__}: {err}"))
        self.metric = self.experiment.metric if self.experiment else "median_s"
        self.runs = frames.runs_at(rows)  # labelled once, for the headline and the rows table
        self._records: dict[int, dict[str, Any]] = {}

    def records(self, at: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at positions ``at`` as records, each converted once for every reader of the
        section, and only those read (a section shows a few hundred of a history's rows)."""
        todo = [i for i in dict.fromkeys(at) if i not in self._records]
        if todo:
            self._records.update(zip(todo, records(self.rows.iloc[todo])))
        return [self._records[i] for i in at]

    @property
    def heading(self) -> str:
        return f"{self.data.number} {self.data.title or self.name}".strip()

    @property
    def order(self) -> tuple[tuple[float, ...], str]:
        return order_key(self.data.number, self.name)


class Report:
    """The page for a set of rows: ``Report(df, sources, samples).render()`` -> HTML text."""

    def __init__(self, df: pd.DataFrame, sources: Sequence[str], samples: Mapping[str, Any] | None = None) -> None:
        self.df = df
        self.sources = [str(s) for s in sources]
        self.samples = dict(samples or {})
        self.figures = Figures()
        self.notes: list[tuple[str, str, str]] = []  # (section, what, detail): the report's own warnings

    # one section per preset --------------------------------------------------------------------

    def names(self) -> list[str]:
        if "experiment" not in self.df:
            return [UNNAMED] if len(self.df) else []
        return [str(n) for n in self.df["experiment"].astype("string").fillna(UNNAMED).unique()]

    def rows_of(self, name: str) -> pd.DataFrame:
        if "experiment" not in self.df:
            return self.df
        return frames.own_columns(self.df[self.df["experiment"].astype("string").fillna(UNNAMED) == name])

    def section(self, s: Preset) -> str:
        d = s.data
        parts = [
            f'<section class="experiment" id="{section_id(s.name)}" data-experiment="{esc(s.name)}" '
            f'data-chapter="{esc(d.number)}">',
            f"<h2>{esc(s.heading)} <small>{esc(s.name)}</small></h2>",
            f'<p class="about">{self.about(s.rows)}</p>',
            self.headline(s),
            self.reference(d),
        ]
        for t in d.tables:
            intro = f"<p>{esc(t.intro)}</p>" if t.intro else ""
            parts.append(intro + table_html(t.header, [[esc(c) for c in row] for row in t.rows], "book"))
        figures = [self.figure(f) for f in d.figures]
        if any(figures):
            parts.append(f'<div class="plots">{"".join(figures)}</div>')
        parts.append("<h3>Rows</h3>" + self.rows_table(s))
        parts.append("</section>")
        return "\n".join(p for p in parts if p)

    def figure(self, f: contract.Figure) -> str:
        """A figure of the section, drawn from its rows (or, without rows of its own, every row here)."""
        rows = self.df if f.rows is None else f.rows
        return self.figures.figure(f.name, lambda: f.plot(rows), f.why_none, f.caption)

    def about(self, rows: pd.DataFrame) -> str:
        n_runs = rows["run_id"].nunique() if "run_id" in rows else 1
        counts = rows["status"].astype("string").value_counts() if "status" in rows else pd.Series(dtype=int)
        status = ", ".join(f"{n} {s}" for s, n in counts.items())
        keys = [k.removeprefix("cfg.") for k in frames.varying(rows)]
        devices = sorted({text(d) for d in rows.get("device_name", pd.Series(dtype="string")).dropna()})
        words = f"{len(rows)} rows ({status}) from {n_runs} run{'s' if n_runs != 1 else ''}"
        if keys:
            words += f"; swept: {', '.join(keys)}"
        ids = sorted(
            {d for x in rows.get("devices", pd.Series(dtype="string")).dropna() for d in text(x).split("+") if d}
        )
        if len(devices) == 1 and len(ids) > 1:  # a device split into workers is not one device
            named = f" ({', '.join(ids)})" if len(ids) <= MAX_DEVICE_IDS else ""
            words += f"; on {len(ids)} devices{named}, each {devices[0]}"
        elif devices:
            words += f"; on {', '.join(devices)}"
        return esc(words)

    def headline(self, s: Preset) -> str:
        """At most a few lines: the hook's own over all runs, else a single run's headline; with
        several runs, each run's headline in a table under it."""
        labelled = s.runs
        each: list[tuple[str, list[str]]] = []
        if s.experiment is not None:
            for label, at in labelled[:MAX_HEADLINE_RUNS]:
                try:
                    own = [dict(r) for r in s.records(at)]  # the hook's copies: the rows table shares the records
                    each.append((label, s.experiment.headline(own)))
                except Exception as err:  # an experiment's headline must not cost the report
                    self.notes.append((s.name, "headline failed", f"{type(err).__name__}: {err}"))
                    break
        lines = list(s.data.headline) or (each[0][1] if len(labelled) == 1 and each else [])
        out = []
        if lines:
            more = len(lines) - MAX_HEADLINE_LINES
            shown = lines[:MAX_HEADLINE_LINES] + ([f"(+{more} more lines: see the rows)"] if more > 0 else [])
            out.append(bullet_list(shown, "headline"))
        if len(labelled) > 1 and any(found for _, found in each):
            body = [[esc(label), "<br>".join(esc(x) for x in found)] for label, found in each if found]
            tail = len(labelled) - len(each)
            note = f'<p class="note">and {tail} more runs (python -m perflab.results)</p>' if tail > 0 else ""
            out.append(table_html(["run", "headline"], body, "runs") + note)
        return f'<div class="headline"><h3>Headline</h3>{"".join(out)}</div>' if out else ""

    @staticmethod
    def reference(d: contract.Section) -> str:
        """The reference's setup beside this tree's, and the notes on where it comes from."""
        notes = "".join(f"<p>{esc(n)}</p>" for n in d.notes)
        if not d.setup:
            return notes
        body = [[esc(x.what), esc(x.reference), esc(x.here)] for x in d.setup]
        table = table_html(["", d.reference, "this tree"], body, "book")
        return f'<div class="book"><h3>{esc(d.reference).capitalize()} beside this tree</h3>{notes}{table}</div>'

    # rows --------------------------------------------------------------------------------------

    def rows_table(self, s: Preset) -> str:
        labelled = s.runs
        show_run = len(labelled) > 1
        header = ["measurement", "status", "n", "median", "IQR", "rate", "flags", "notes"]
        header = (["run"] if show_run else []) + header
        shown = [(label, i) for label, at in labelled for i in at[:MAX_TABLE_ROWS]][:MAX_TABLE_ROWS]
        listed = list(zip([label for label, _ in shown], s.records([i for _, i in shown])))
        said = [
            "; ".join(dict.fromkeys(text(r.get(c)) for c in ("error", "suspect", "note") if text(r.get(c))))
            for _, r in listed
        ]
        measured = [i for i, (_, r) in enumerate(listed) if text(r.get("status")) == "ok"]
        shared, rest = frames.shared_reasons([said[i] for i in measured])  # said once, under the table
        for i, note in zip(measured, rest):
            said[i] = note
        body, attrs = [], []
        for (label, r), notes in zip(listed, said):
            status = text(r.get("status"))
            ok = status == "ok" and number(r.get("median_s")) is not None
            name = s.experiment.label(r) if s.experiment else text(r.get("measurement"))
            flagged = flags(r)
            cells = [
                esc(name),
                f'<span class="status {esc(status)}">{esc(status)}</span>',
                esc(r.get("n")) if ok else "",
                esc(human_time(r.get("median_s"))) if ok else "",
                esc(spread(r)) if ok else "",
                esc(rate(r, s.metric)),
                esc(flagged),
                esc(notes),
            ]
            body.append(([esc(label)] if show_run else []) + cells)
            attrs.append(f'class="{esc(status)}{" flagged" if flagged else ""}"')
        more = len(s.rows) - len(listed)
        tail = f'<p class="note shared">Every measured row: {esc("; ".join(shared))}</p>' if shared else ""
        tail += (
            f'<p class="note">{more} more rows not shown here: the CSV files hold every row.</p>' if more > 0 else ""
        )
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
        suspect: dict[tuple[str, str], list[tuple[str, str, str]]] = {}  # an experiment's reason, once
        for r in records(df[flagged]):
            status = text(r.get("status"))
            if status in FAILED:
                add("error", r, f"{status}: {text(r.get('error'))}")
            elif status == "skipped":
                add("skipped", r, text(r.get("error")) or "no reason given")
            if text(r.get("suspect")):
                key = (text(r.get("experiment")), frames.kind(text(r.get("suspect"))))
                suspect.setdefault(key, []).append(
                    (text(r.get("measurement")), text(r.get("run_id")), text(r.get("suspect")))
                )
            if str(r.get("noisy")) == "True":
                add(
                    "noisy",
                    r,
                    f"IQR {spread(r, few=0)} of the median over n={text(r.get('n'))} samples "
                    "(above bench.noise_threshold)",
                )
        for (experiment, _), given in suspect.items():
            names = list(dict.fromkeys(m for m, _, _ in given))
            ids = list(dict.fromkeys(run for _, run, _ in given))
            measurement = ", ".join(names) if len(names) <= MAX_NAMED else f"{len(names)} measurements"
            run = ids[0] if len(ids) == 1 else f"{len(ids)} runs"
            detail = frames.merged([reason for _, _, reason in given])
            kinds.setdefault("suspect", []).append([esc(experiment), esc(measurement), esc(run), esc(detail)])
        fallback = []
        if "fallback" in df:
            for why, part in df[df["fallback"].fillna("").astype("string") != ""].groupby("fallback", observed=True):
                which = ", ".join(sorted({text(x) for x in part.get("experiment", [])}))
                n = part["run_id"].nunique() if "run_id" in part else 1
                fallback.append(
                    [esc(which), "", esc(f"{n} run{'s' if n != 1 else ''}"), esc(f"{why} ({len(part)} rows)")]
                )
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
        found = sorted((Preset(n, self.rows_of(n), self) for n in self.names()), key=lambda s: s.order)
        sections = [self.section(s) for s in found]  # before the warnings: they collect its notes
        trend = trend_section(self.df, self.samples)  # a history's series lead: a tree of many subjects is one history
        env = self.environment()
        warnings, counts = self.warnings()
        toc = "".join(
            f'<li><a href="#{section_id(s.name)}">{esc(s.heading)}</a> <small>{esc(s.name)}</small></li>' for s in found
        )
        toc = ('<li><a href="#trends">Trends over the code under test</a></li>' if trend else "") + toc
        toc += '<li><a href="#environment">Environment</a></li>'
        toc += f'<li><a href="#warnings">Warnings ({sum(counts.values())})</a></li>'
        glance = ", ".join(f"{n} {k}" for k, n in counts.items())
        n_runs = self.df["run_id"].nunique() if "run_id" in self.df else 0
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        top = [
            f"<p>{len(self.df)} rows from {n_runs} runs, {len(found)} experiments; "
            f"from {esc(', '.join(self.sources))}; written {esc(when)}.</p>",
            f'<p class="glance">Warnings: <a href="#warnings">{esc(glance) if glance else "none"}</a></p>',
        ]
        if not self.figures.available:
            top.append(f'<p class="noplot matplotlib">{esc(MATPLOTLIB_LINE)}</p>')
        return Template(asset("page.html")).substitute(
            title=esc(f"perflab report: {', '.join(s.name for s in found) or 'no rows'}"),
            css=asset("style.css"),
            guard=asset("guard.js"),
            top="".join(top),
            toc=toc,
            sections="\n".join(
                [
                    trend,
                    summary(self.df, self.samples),
                    *sections,
                    operators_section(self.sources, self.figures),  # where the time went, what moved
                ]
            ),
            environment=env,
            warnings=warnings,
            script=asset("check.js"),
        )


def _summary(values: pd.Series, column: str) -> str:
    """A column over many rows in a few words: its range (numbers), or its distinct values."""
    values = values.dropna()
    numeric = pd.to_numeric(values, errors="coerce") if not pd.api.types.is_bool_dtype(values) else None
    if numeric is not None and numeric.notna().all() and column not in TEXT_LIKE:
        lo, hi = (frames.whole(round(float(x), 3)) for x in (numeric.min(), numeric.max()))
        return f"{lo}" if lo == hi else f"{lo} to {hi}"
    distinct = list(dict.fromkeys(text(v) for v in values))
    return ", ".join(distinct[:12]) + (f" (+{len(distinct) - 12} more)" if len(distinct) > 12 else "")
