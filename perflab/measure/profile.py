"""Traces on demand (``bench.profile=true``): one torch.profiler Chrome trace per measurement,
taken in a pass of its own after the timed samples, so profiling never slows what is timed.

The trace is written by ``on_trace_ready`` when the scheduled active steps end (exporting
after a scheduled profile instead gives a near-empty trace on the CPU). Open it in
chrome://tracing or https://ui.perfetto.dev.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Callable, Sequence

from perflab.measure.devices import Device, synchronize

ACTIVE_CALLS = 3


def trace(run_dir: Path, name: str, fn: Callable[[], object], devices: Sequence[Device]) -> str:
    """Profile one warm-up call and ``ACTIVE_CALLS`` calls of ``fn``; return the trace's path
    relative to the run dir (the row's ``trace`` column)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    folder = run_dir / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name).strip('_') or 'trace'}.json"
    activities = [ProfilerActivity.CPU]
    if any(d.type == "cuda" for d in devices):
        activities.append(ProfilerActivity.CUDA)
    with warnings.catch_warnings():  # "clears events at the end of each cycle": we use one cycle
        warnings.simplefilter("ignore", UserWarning)
        with profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=1, active=ACTIVE_CALLS),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        ) as prof:
            for _ in range(1 + ACTIVE_CALLS):
                fn()
                synchronize(devices)
                prof.step()
    return str(path.relative_to(run_dir))
