"""``perflab ab``'s why pass: after the verdict, the sides measured again under the profiler, and
each FAIL (or, asked, each faster point) explained operator by operator.

The timed processes run without the profiler (it slows what it watches); where a point FAILed
(``--why``: or was significantly faster), ``PROCESSES`` more processes a side run with ``bench.profile=true``,
as the timed ones did (both sides in one process, in turns, where they can: a process's own
speed, which can differ by a quarter from the next one's, then falls on both sides of a pair),
into ``DIR/why/base`` and ``DIR/why/new``. Their points are
matched to the verdict's by name and their operators judged as pairs
(``perflab.analysis.attribution``); what the pass cost is said: its seconds against the timed
run's, and the profiled call against the timed one.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

import pandas as pd

from perflab.analysis import attribution

if TYPE_CHECKING:
    from perflab.ab import Measure, Side

    MeasureBoth = Callable[[Side, Side, int], int]  # (base, new, process) -> exit code of the one process

PROCESSES = 3  # a side: the fewest whose between-process spread is measured (replicates.MEASURED_FROM)


def fresh(shared: Sequence[str]) -> Measure:
    """A side's process ``k`` as ``perflab ab`` runs its timed ones (``Side.run``)."""
    return lambda side, k: side.run(shared, k)


def wanted(table: pd.DataFrame, faster: bool) -> bool:
    """Whether the table has a point to explain: a FAIL (``faster``: or a point significantly faster)."""
    return any(attribution.wanted(r, faster=faster) for r in table.to_dict("records"))


def explain(
    table: pd.DataFrame,
    sides: Sequence[Side],
    shared: Sequence[str],
    measure: Measure | None = None,
    *,
    faster: bool = False,
    alpha: float,
    process_cv: float | None,
    explained: frozenset[str] = frozenset(),
    together: MeasureBoth | None = None,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
) -> pd.DataFrame:
    """``table`` with ``why_moved`` / ``_moved`` on its points to explain, from a profiled pass of
    ``PROCESSES`` processes a side (``measure(side, k)``, as the timed run's; ``together(base, new, k)``:
    both sides' process ``k`` as one process, in turns, as ``perflab ab``'s timed ones)."""
    from perflab import compare

    profiled = [
        replace(s, tree=s.tree.parent / "why" / s.name, overrides=[*s.overrides, "bench.profile=true"]) for s in sides
    ]
    measure = measure or fresh(shared)
    start = clock()
    for k in range(1, PROCESSES + 1):
        ran = (  # (who, exit code), each process run as it is asked for: none after one that failed
            [("both sides", together(profiled[0], profiled[1], k))]
            if together
            else ((side.name, measure(side, k)) for side in (profiled if k % 2 else profiled[::-1]))
        )
        for name, code in ran:
            if code:
                say(f"the why pass: process {k} of {name} ended with exit {code}: nothing explained")
                return table
    spent = clock() - start
    base, new = profiled
    found = compare.ab(
        base.tree,
        new.tree,
        differ=[o.lstrip("+").partition("=")[0] for o in (*base.overrides, *new.overrides)],
        explained=explained,
        busy="left_out",
        paired=True,
    )
    found = attribution.explain(found, base.tree, new.tree, alpha=alpha, floor=process_cv, paired=True, every=True)
    by_name = {r["_name"]: r for r in found.to_dict("records") if r.get("_moved") is not None}
    out = table.copy()
    lines, moved = [], []
    for r in out.to_dict("records"):
        hit = by_name.get(r.get("_name")) if attribution.wanted(r, faster=faster) else None
        lines.append(hit["why_moved"] if hit else None)
        moved.append(hit["_moved"] if hit else None)
    out["why_moved"], out["_moved"] = lines, moved
    costs = [m.cost_x for m in moved if m is not None]
    say(
        f"the why pass: {PROCESSES} profiled processes a side{' (both sides in each, in turns)' if together else ''}"
        f" in {spent:.0f} s, into {base.tree.parent}"
        + (f"; a profiled call took {max(costs):.2g}x a timed one" if costs else "")
    )
    return out
