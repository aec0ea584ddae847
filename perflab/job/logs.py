"""A terminal log handler that writes to whatever ``sys.stdout`` is now (a notebook, a test's
capture, a redirect made after logging was set up) and goes quiet when its reader goes away
(``perflab ... | head``): the job carries on and writes its rows, with no traceback. And
whether a job may draw live progress (a self-erasing status line, a bar) on the terminal."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

LIVE = [True]  # perflab chapter draws one bar for all its jobs and turns the jobs' own off


def live() -> bool:
    """A job's live progress goes to stderr: only on a terminal, and not inside perflab chapter."""
    return LIVE[0] and sys.stderr.isatty()


class Console(logging.StreamHandler):
    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self.quiet = False

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current sys.stdout

    def emit(self, record: logging.LogRecord) -> None:
        if self.quiet:
            return
        try:
            self.stream.write(self.format(record) + self.terminator)
            self.flush()
        except BrokenPipeError:
            self.quiet = True
            quiet_stdout()
        except Exception:
            self.handleError(record)


def quiet_stdout() -> None:
    """Point stdout at /dev/null so that Python's own flush at exit cannot fail either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class LogFile(logging.FileHandler):
    """The job's log file. A write that fails (a full disk) is said once, in one line, and the
    file is given up; the terminal still shows every message (logging's default is a traceback
    per message)."""

    def handleError(self, record: logging.LogRecord) -> None:
        if getattr(self, "failed", False):
            return
        self.failed = True
        err = sys.exc_info()[1]
        why = getattr(err, "strerror", None) or err
        sys.stderr.write(f"perflab: the log file {self.baseFilename} cannot be written ({why}); not written further\n")

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(self, "failed", False):
            super().emit(record)
