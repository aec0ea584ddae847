"""Moved to ``perflab.measure.instruments`` (0.5.0): ``memory`` (``Memory``, ``host_peak``),
``machine`` (``Machine``, ``busy_reason``, ``worst`` ...), ``gpu`` (``GpuState``,
``throttle_words``). The old names keep working, with a DeprecationWarning, until 0.6.0."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    **dict.fromkeys(("MB", "Memory", "host_peak"), "memory"),
    **dict.fromkeys(("GpuState", "THROTTLE_REASONS", "throttle_words"), "gpu"),
    **dict.fromkeys(
        (
            *("FEWER_THREADS", "MACHINE_COLUMNS", "MIN_WINDOW_TICKS", "Machine", "QUIETER", "TICK_S"),
            *("busy_reason", "cpu_pressure_us", "others_since_import", "own_cpu_s", "run_queue"),
            *("since_import", "worst"),
        ),
        "machine",
    ),
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where = f"perflab.measure.instruments.{_MOVED[name]}"
    warnings.warn(f"perflab.measure.watch.{name} moved to {where}.{name}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(where), name)
