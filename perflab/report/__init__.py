"""One self-contained HTML report of any results tree: ``python -m perflab.report PATH... -o report.html``.

What a section holds is the experiment's own ``report`` hook (:mod:`perflab.config.contract`); this
package only draws it: ``page`` (the page, sections, environment, warnings), ``html`` (tables,
inline figures), and the page template, CSS and scripts as files beside them. Figures are
matplotlib's, inlined as SVG: the file opens anywhere, offline (docs/report.md says why).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from perflab.config.schema import ResultsConfig
from perflab.errors import OneLineParser
from perflab.report.html import MATPLOTLIB_LINE
from perflab.report.page import Report
from perflab.store import files

__all__ = ["MATPLOTLIB_LINE", "Report", "ReportError", "build", "check_output", "load_samples", "main", "write"]


class ReportError(ValueError):
    """A path or output the report cannot use: one line."""


def load_samples(
    paths: Sequence[str | Path], row_ids: Iterable[str] | None = None, reading: Any = None
) -> Mapping[str, Any]:
    """Each row's raw sample seconds (not its warm-up), by row_id (``row_ids``: only those rows';
    ``reading``: the ``perflab.results.Reading`` that read their rows)."""
    from perflab.compare import samples_by_row
    from perflab.store.rows import RESULTS, SAMPLES

    places = []
    for p in map(Path, paths):
        if p.is_dir():
            places.append(p)
        elif p.name == RESULTS and (p.parent / SAMPLES).is_file():
            places.append(p.parent / SAMPLES)  # a run's rows given as its CSV file: its samples beside it
    if reading is not None and [str(p) for p in places] == [str(Path(p)) for p in paths]:
        return samples_by_row(places, row_ids=row_ids, reading=reading)  # the trees not walked again
    return samples_by_row(places, row_ids=row_ids) if places else {}


def build(*paths: str | Path) -> str:
    """The report's HTML for the results under ``paths`` (run dirs, sweep dirs, trees, CSV files)."""
    from perflab.results import Reading

    if not paths:
        raise ReportError("give one or more results paths (a results tree, a run or sweep dir, a CSV file)")
    for p in paths:
        if not Path(p).exists():
            raise ReportError(f"{p}: no such file or folder")
    reading = Reading(*paths)  # the rows, then their samples: each tree walked once
    try:
        df = reading.rows()
    except FileNotFoundError as err:
        raise ReportError(str(err)) from None
    if df.empty:
        raise ReportError(f"no result rows under {', '.join(map(str, paths))}")
    return Report(df, [str(p) for p in paths], load_samples(paths, df["row_id"], reading)).render()


def check_output(out: Path) -> None:
    """``out`` can be written (a regular file or a new one in a writable folder): checked before
    anything is loaded, so a bad -o costs nothing."""
    from perflab.errors import ConfigError

    try:
        files.check_replace("-o", out, is_report, "a new file, or an earlier perflab report (replaced)")
    except ConfigError as err:
        raise ReportError(err.line()) from None


GENERATOR = '<meta name="generator" content="perflab report">'  # in page.html: what says a file is ours


def is_report(path: Path) -> bool:
    """A report perflab wrote: its generator tag (or, in reports older than the tag, its footer)."""
    return files.holds(path, [GENERATOR.encode(), b"Written by python -m perflab.report"], tail=4096)


def write(html_text: str, out: Path) -> Path:
    """The report into ``out`` at once (a temp file renamed): a reader never sees half of it."""
    check_output(out)
    try:
        files.write_atomic(out, html_text)
    except OSError as err:
        raise ReportError(f"{out}: {err.strerror or err}") from None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="perflab report", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "paths",
        nargs="*",
        default=[ResultsConfig.store],
        metavar="PATH",
        help=f"results trees, run or sweep dirs, or CSV files (default: {ResultsConfig.store})",
    )
    parser.add_argument("-o", "--output", type=Path, default=Path("report.html"), help="default: report.html")
    args = parser.parse_args(argv)
    try:
        check_output(args.output)
        write(build(*args.paths), args.output)
    except ReportError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(args.output)
    return 0
