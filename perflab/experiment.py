"""What an experiment's author imports, in one place, whether the experiment is perflab's own
or lives in the user's package (``from perflab.experiment import ExperimentConfig, Section``).

The config and report parts import no torch (an experiment module is imported to check a
config, before any torch); ``Context``, ``Part``, ``Benchmark``, ``Device``, ``on_device`` and
the alone-then-together measurement (``alone_then_together`` and its kin) come
from the measuring layer, which does, and are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from perflab.analysis.table import human_bytes, human_time, per_s
from perflab.config.contract import Figure, Samples, Section, Setup, Table
from perflab.config.schema import (
    BACKENDS,
    COMPILE_MODES,
    DTYPES,
    MISSING,
    PRECISIONS,
    ExperimentConfig,
    PerflabConfig,
    one_of,
    positive,
    require,
    some_of,
)
from perflab.errors import ConfigError
from perflab.measure.instructions import Counted
from perflab.store.rows import number

if TYPE_CHECKING:
    from perflab.analysis.claims import INVALID, NOT_APPLICABLE, UNDERPOWERED, VALID, Claim, Tree
    from perflab.job.context import Context
    from perflab.measure.alone_together import (
        alone_then_together,
        check_cpu_split,
        concurrency_headline,
        split_cpu_if_fallback,
    )
    from perflab.measure.bench import Benchmark, Part
    from perflab.measure.devices import Device, on_device

# Imported on first use: these bring torch (the claims' names, numpy).
_WITH_TORCH = {
    "INVALID": "perflab.analysis.claims",
    "NOT_APPLICABLE": "perflab.analysis.claims",
    "UNDERPOWERED": "perflab.analysis.claims",
    "VALID": "perflab.analysis.claims",
    "Claim": "perflab.analysis.claims",
    "Tree": "perflab.analysis.claims",
    "Benchmark": "perflab.measure.bench",
    "Context": "perflab.job.context",
    "Part": "perflab.measure.bench",
    "alone_then_together": "perflab.measure.alone_together",
    "check_cpu_split": "perflab.measure.alone_together",
    "concurrency_headline": "perflab.measure.alone_together",
    "split_cpu_if_fallback": "perflab.measure.alone_together",
    "Device": "perflab.measure.devices",
    "on_device": "perflab.measure.devices",
}

__all__ = [
    "BACKENDS",
    "COMPILE_MODES",
    "INVALID",
    "NOT_APPLICABLE",
    "UNDERPOWERED",
    "VALID",
    "Benchmark",
    "Claim",
    "ConfigError",
    "Context",
    "Counted",
    "DTYPES",
    "Device",
    "ExperimentConfig",
    "Figure",
    "MISSING",
    "Part",
    "PerflabConfig",
    "PRECISIONS",
    "Samples",
    "Section",
    "Setup",
    "Table",
    "Tree",
    "alone_then_together",
    "check_cpu_split",
    "concurrency_headline",
    "human_bytes",
    "human_time",
    "number",
    "on_device",
    "one_of",
    "per_s",
    "positive",
    "require",
    "some_of",
    "split_cpu_if_fallback",
]


def __getattr__(name: str) -> Any:
    if name in _WITH_TORCH:
        return getattr(importlib.import_module(_WITH_TORCH[name]), name)
    raise AttributeError(f"module 'perflab.experiment' has no attribute {name!r}")
