"""What one ``perflab`` command learns from its jobs, for its exit code.

Hydra calls our task function once per job and our sweep callback at the end, and lets
neither return anything to the caller; a context variable scoped to one ``app.main`` call
carries the outcomes back instead of module globals. Jobs that a launcher runs in other
processes report through their run dirs, which the sweep callback reads.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Session:
    outcomes: list[str] = field(default_factory=list)  # each in-process job's outcome
    exit_codes: list[int] = field(default_factory=list)
    sweep_dir: Path | None = None  # set when a sweep starts (and by its first job run in this process)
    sweep_exit: int | None = None  # set by the sweep's summary
    unsaved: dict[str, Any] = field(default_factory=dict)  # job dir name -> a RunRecord no disk would take
    uids: list[str] = field(default_factory=list)  # the ends of the run / sweep folder names made
    points: list[list[str]] = field(default_factory=list)  # a sweep's points, as their overrides
    running: bool = False  # a job of this process started and has not returned

    def exit_code(self) -> int:
        if self.sweep_exit is not None:
            return self.sweep_exit
        return max(self.exit_codes, default=0)


CURRENT: ContextVar[Session | None] = ContextVar("perflab_session", default=None)
