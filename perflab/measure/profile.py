"""Traces on demand (``bench.profile=true``): one torch.profiler Chrome trace per measurement,
taken in a pass of its own after the timed samples, so profiling never slows what is timed.

The same pass is reduced per operator into the run dir's ``operators.csv``
(``perflab.measure.operators``). The trace is written by ``on_trace_ready`` when the scheduled
active steps end (exporting after a scheduled profile instead gives a near-empty trace on the
CPU). Open it in chrome://tracing or https://ui.perfetto.dev.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Sequence

from perflab.measure import operators
from perflab.measure.devices import Device

ACTIVE_CALLS = operators.ACTIVE_CALLS


def trace(run_dir: Path, name: str, fn: Callable[[], object], devices: Sequence[Device]) -> str:
    """Profile ``ACTIVE_CALLS`` calls of ``fn`` (a warm-up call first on a GPU); return the trace's path
    relative to the run dir (the row's ``trace`` column)."""
    return traced(run_dir, name, fn, devices)[0]


def traced(
    run_dir: Path, name: str, fn: Callable[[], object], devices: Sequence[Device], calls: int = ACTIVE_CALLS
) -> tuple[str, operators.Profiled]:
    """``trace``'s path and the same pass (``calls`` calls) reduced per operator
    (``perflab.measure.operators``)."""
    folder = run_dir / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name).strip('_') or 'trace'}.json"
    found = operators.profiled(fn, devices, calls=calls, trace=path)
    return str(path.relative_to(run_dir)), found
