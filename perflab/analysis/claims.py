"""The book's claims, checked on this machine: each a statement with the value it expects here,
what a results tree measured, a tolerance and one of four verdicts:

  VALID           the measurement supports the claim, within its tolerance
  INVALID         the measurement contradicts it, on clean evidence (enough samples, the
                  machine not disturbed, no impossible figure)
  UNDERPOWERED    the evidence cannot decide: too few samples (and how many more would do), a
                  busy machine, a run too short to learn, a figure perflab flags as suspect
  NOT APPLICABLE  the claim cannot be checked here, and why (no GPU, one device ...)

The claims belong to the experiments: each may define ``claims(rows, tree) -> list[Claim]``
(``rows``: one preset's rows, ``tree``: every row of the results with their raw samples; the
experiment contract, ``perflab.config.contract.Hooks``), built with the checks in
:mod:`perflab.analysis.checks`. :func:`judge` asks every preset's experiment. No torch here: judging a
tree needs only its files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("perflab")

VALID = "VALID"
INVALID = "INVALID"
UNDERPOWERED = "UNDERPOWERED"
NOT_APPLICABLE = "NOT APPLICABLE"
VERDICTS = (VALID, INVALID, UNDERPOWERED, NOT_APPLICABLE)


@dataclass(frozen=True)
class Claim:
    """One checkable statement of the book and its verdict on one results tree."""

    section: str  # the book's section, "13.3"
    statement: str  # what is claimed, as a checkable sentence
    book: str  # what the book says (its value, where it gives one)
    expected: str  # the value expected here, and where it comes from (this machine's ceilings or the book)
    tolerance: str  # how far from ``expected`` still counts
    measured: str  # what the tree measured ("" when nothing could be)
    verdict: str
    why: str = ""  # the reason for the verdict: always given unless VALID
    experiment: str = ""  # the preset whose rows are the evidence (filled in by ``judge``)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}: one of {', '.join(VERDICTS)}")


@dataclass
class Tree:
    """Every row of a results tree and each row's raw sample seconds (by ``row_id``)."""

    rows: pd.DataFrame
    samples: Mapping[str, np.ndarray] = field(default_factory=dict)

    def samples_of(self, row: Mapping[str, Any]) -> np.ndarray:
        """A row's raw sample seconds (its warm-up left out); empty when none were kept."""
        found = self.samples.get(str(row.get("row_id")))
        return np.asarray(found, float) if found is not None else np.array([])


def judge(rows: pd.DataFrame, samples: Mapping[str, np.ndarray] | None = None) -> list[Claim]:
    """Every claim the experiments of ``rows`` make about them, in the book's order.

    Each preset's rows go to the claims the book makes of its experiment (``perflab.book``); a
    hook that fails costs its own claims, with a line in the log, never the others' or the report.
    """
    from perflab.analysis.frames import own_columns
    from perflab.config import registry

    if rows.empty or "experiment" not in rows:
        return []
    tree = Tree(rows, dict(samples or {}))
    found: list[Claim] = []
    names = rows["experiment"].astype("string").fillna("")
    for experiment in dict.fromkeys(str(n) for n in names if n):
        own = own_columns(rows[names == experiment])  # its own keys: a hook boxes every cell
        measured_by = registry.of_rows(own)
        if measured_by is None:
            continue
        try:
            hook = measured_by.book.claims
            made = hook(own, tree) if hook else []
        except Exception as err:  # a bug in one experiment's claims must not hide the rest
            log.warning("claims of %s: %s: %s", experiment, type(err).__name__, err)
            continue
        found += [replace(c, experiment=c.experiment or experiment) for c in made]
    return sorted(found, key=lambda c: (section_key(c.section), c.experiment))


def section_key(section: str) -> tuple[float, ...]:
    """The book's order of sections ("13.10" after "13.9"; anything else last)."""
    try:
        return tuple(float(p) for p in section.split("."))
    except ValueError:
        return (float("inf"),)


def counts(claims: list[Claim]) -> dict[str, int]:
    """How many claims got each verdict, in the verdicts' order (empty ones left out)."""
    tally = {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
    return {v: n for v, n in tally.items() if n}
