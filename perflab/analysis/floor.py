"""The floor of a one-process verdict: the between-process variation assumed where a side has
one process, from the command line or the trees themselves, never from a cache.

With one process a side the variation between processes is unknown, and a verdict must not be
more confident than it allows: a 2 % floor false-FAILed half of A/A pairs on a quiet VM whose
processes differ by 10-40 %. A verdict is a function of the trees and the command line (the
same inputs, the same verdict, on any machine, at any time), so the floor is, in order:
``--process-cv``; else what the same experiment's points with two or more processes a side
measured in these trees (their pooled log spread); else ``replicates.FLOOR_CV``, assumed and
said. An earlier release pooled every ``perflab ab`` of the machine in a per-user cache, so the
same ``perflab compare`` answered FAIL, then INCONCLUSIVE: nothing is kept across runs now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from perflab.analysis.replicates import FLOOR_CV


@dataclass(frozen=True)
class Floor:
    """The between-process variation assumed (a log standard deviation) and where it came from,
    in words for the verdict."""

    cv: float
    source: str


def given(cv: float) -> Floor:
    return Floor(cv, "--process-cv")


ASSUMED = Floor(FLOOR_CV, "assumed: no point of these trees measured it with 2 or more processes a side")


def measured(spreads: Iterable[tuple[float, int]]) -> Floor:
    """The pooled between-process spread of the points that measured one ((log standard
    deviation, degrees of freedom), ``replicates.between``: two or more processes on a side),
    weighted by their degrees of freedom; ``ASSUMED`` where none did."""
    found = [(cv, df) for cv, df in spreads if df >= 1 and math.isfinite(cv)]
    df = sum(d for _, d in found)
    pooled = math.sqrt(sum(d * cv**2 for cv, d in found) / df) if df else 0.0
    if not pooled > 0:
        return ASSUMED
    points = f"{len(found)} point{'s' if len(found) != 1 else ''}"
    return Floor(pooled, f"measured in these trees: {points} of the experiment with 2 or more processes a side")
