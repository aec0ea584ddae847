"""The book beside the experiments: what *Dive into Deep Learning*, chapter 13 (Computational
Performance, its PyTorch edition), says about perflab's own experiments, and how ``perflab
chapter`` sizes them. The experiments (``perflab.experiments``) only measure, as a user's do; the
book reads their rows.

A part is a module here named after its experiment (``perflab.book.matmul``). It may define
``CHAPTER_SHARE`` and ``chapter(machine, seconds) -> points`` (its share of ``perflab chapter``'s
budget and its points sized to the seconds it gets, :mod:`perflab.measure.sizing`), ``claims(rows,
tree) -> claims`` (the book's claims judged on the rows, :mod:`perflab.analysis.checks`), and
``report`` / ``work`` (the experiment's report section and work line: the book's setup beside
ours), which stand for the experiment module's hooks of those names.

Only what we are sure of: the book's printed *timings* for 13.1, 13.2, 13.5 and 13.6 come out of
its own build, differ between its editions and name no machine, so none are quoted.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional

REFERENCE = "the book"
SETUP_ONLY = (
    "The book's printed timings for this section are not quoted: they come out of its own build, "
    "differ between its editions, and name no machine. Its setup is, beside this tree's."
)
PARTS = ("async_compute", "auto_parallel", "comm", "compile", "hardware", "matmul", "train")
SHOWN = ("report", "work")  # the experiment's hooks a part stands for


@dataclass(frozen=True)
class Part:
    """The book's part of one experiment: its share of the chapter's budget, its sizes, its claims."""

    name: str
    share: float = 0.0
    chapter: Optional[Callable[[Any, float], Any]] = None
    claims: Optional[Callable[[Any, Any], Any]] = None

    @property
    def in_chapter(self) -> bool:
        return self.chapter is not None and self.share > 0


def module(experiment: str) -> ModuleType | None:
    """``perflab.book.<experiment>`` for perflab's own experiments; None for any other."""
    return importlib.import_module(f"{__name__}.{experiment}") if experiment in PARTS else None


def part(experiment: str, builtin: bool, own: ModuleType) -> Part:
    """The book's part of a registered experiment (``own``: its module). A user's experiment module
    that defines ``CHAPTER_SHARE``, ``chapter`` or ``claims`` itself is read as before, with a
    DeprecationWarning: those hooks left the contract in 0.4.0 and are read this release only."""
    found = module(experiment) if builtin else None
    if found is None:
        found = own
        old = [n for n in ("CHAPTER_SHARE", "chapter", "claims") if getattr(found, n, None) is not None]
        if old:
            warnings.warn(
                f"{found.__name__} defines {', '.join(old)}: these hooks left the experiment contract "
                "(perflab.book holds the book's); they are read this release only",
                DeprecationWarning,
                stacklevel=2,
            )
    return Part(
        experiment,
        float(getattr(found, "CHAPTER_SHARE", 0.0) or 0.0),
        getattr(found, "chapter", None),
        getattr(found, "claims", None),
    )


def shown(experiment: str, builtin: bool) -> dict[str, Any]:
    """The hooks the book's part stands for in perflab's own experiment (report, work), by name."""
    found = module(experiment) if builtin else None
    return {n: getattr(found, n) for n in SHOWN if hasattr(found, n)}
