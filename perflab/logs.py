"""A terminal log handler that writes to whatever ``sys.stdout`` is now (a notebook, a test's
capture, a redirect made after logging was set up) and goes quiet when its reader goes away
(``perflab ... | head``): the job carries on and writes its rows, with no traceback."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO


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
