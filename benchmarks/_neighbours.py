"""Processes spinning on the CPUs while a benchmark measures: a CI runner's neighbours."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def spinning(count: int = 1, settle_s: float = 0.0) -> Iterator[None]:
    """``count`` processes (0: none) each burning one CPU while the block runs; ``settle_s``:
    a pause first, so that the scheduler has spread them."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    if spinners and settle_s:
        time.sleep(settle_s)
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()
