"""Instruction counts of single-threaded CPU work: a metric the machine's load does not move.

``bench.instructions=true`` counts the instructions of a part's call under valgrind's callgrind
through ``torch.utils.benchmark.Timer.collect_callgrind``, beside its time, in the row's
``instructions`` column (per call; the median of ``REPEATS`` counts of ``NUMBER`` calls) and
``instructions_spread_pct`` (their max - min over the median). Callgrind runs the call in a
fresh ``python`` (found on ``PATH``: this interpreter's folder is put first) from source text,
so a part that can be counted says its call as ``Counted(stmt, setup)``: the setup builds
every name the stmt uses. Only the CPU, and one thread: the count of threaded work depends on
how the threads share it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from dataclasses import dataclass

NUMBER = 5  # calls counted per repeat
REPEATS = 3  # counts, each of NUMBER calls: their spread says how deterministic the count is
KEY = "bench.instructions"


@dataclass(frozen=True)
class Counted:
    """A part's call as source text for callgrind: ``setup`` once, then ``stmt`` per call."""

    stmt: str
    setup: str = "pass"


def unavailable() -> str:
    """Why instructions cannot be counted here ("" where they can): valgrind must be on PATH."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt-get install valgrind)"
    return ""


def count(what: Counted) -> dict[str, float]:
    """The row's columns: ``instructions`` per call and ``instructions_spread_pct``."""
    from torch.utils.benchmark import Timer

    here = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([here, path])  # callgrind starts `python`: this one
    try:
        timer = Timer(stmt=what.stmt, setup=what.setup, num_threads=1)
        found = timer.collect_callgrind(NUMBER, repeats=REPEATS, collect_baseline=False, retain_out_file=False)
    finally:
        os.environ["PATH"] = path
    counts = [c.counts(denoise=True) / NUMBER for c in found]
    median = statistics.median(counts)
    return {"instructions": median, "instructions_spread_pct": 100 * (max(counts) - min(counts)) / median}
