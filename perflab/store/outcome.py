"""The words for how a measurement or a job ended, each once: its exit code and whether it failed.

A row's ``status`` is one of :data:`ROW_STATUSES`; a run's ``outcome`` (``run.json``, ``sweep.csv``)
any :class:`Outcome`. They are plain strings in files, so ``Outcome.OK == "ok"``.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    OK = "ok"
    DONE = "done"  # measured before, completely: those rows stand for this point
    SKIPPED = "skipped"  # a device this machine lacks, in a sweep
    REFUSED = "refused"  # a bad value: one line, nothing measured
    ERROR = "error"
    OOM = "oom"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    RUNNING = "running"  # what run.json says until the job ends: one killed without a word

    @property
    def exit_code(self) -> int:
        """A single run's exit code (a sweep's is decided over all its points)."""
        return _EXIT_CODES[self]

    @property
    def failed(self) -> bool:
        """A measurement that was attempted and did not end well."""
        return self in (Outcome.ERROR, Outcome.OOM, Outcome.TIMEOUT, Outcome.CANCELLED, Outcome.RUNNING)


_EXIT_CODES = {
    Outcome.OK: 0,
    Outcome.DONE: 0,
    Outcome.SKIPPED: 0,
    Outcome.REFUSED: 2,
    Outcome.ERROR: 1,
    Outcome.OOM: 1,
    Outcome.TIMEOUT: 1,
    Outcome.CANCELLED: 130,
    Outcome.RUNNING: 1,
}

# What a row's status can say (a refusal, a reuse and "running" are a run's, not a row's).
ROW_STATUSES = tuple(
    o
    for o in Outcome
    if o in (Outcome.OK, Outcome.SKIPPED, Outcome.OOM, Outcome.ERROR, Outcome.TIMEOUT, Outcome.CANCELLED)
)
# The statuses of a measurement that did not end well.
FAILED = tuple(o for o in Outcome if o.failed)


def exit_code(outcome: str) -> int:
    """The exit code of an outcome as a file says it (an unknown word: 1, a failure)."""
    try:
        return Outcome(outcome).exit_code
    except ValueError:
        return 1
