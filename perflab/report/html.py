"""The report's HTML pieces: escaped text, tables, lists, and figures inlined as SVG (each with
ids of its own, since several SVGs share one document)."""

from __future__ import annotations

import html
import re
from typing import Any, Callable, Iterable, Sequence

from perflab.analysis.frames import text

MATPLOTLIB_LINE = "Plots need matplotlib, which is not installed here: pip install 'perflab[report]'."


def esc(v: Any) -> str:
    return html.escape(text(v))


def table_html(
    header: Sequence[str], body: Iterable[Sequence[Any]], cls: str = "", row_attrs: Sequence[str] = ()
) -> str:
    """A table; ``body``'s cells are HTML already (escape them with :func:`esc`)."""
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
    """Builds figures into inline SVG, counting what was drawn and what failed."""

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
        from perflab.analysis import plots

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


def section_id(name: str) -> str:
    return "sec-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name)
