"""Moved to ``perflab.measure.instruments.energy`` (0.5.0); the old names keep working, with a
DeprecationWarning, until 0.6.0."""

from __future__ import annotations

import warnings
from typing import Any

from perflab.measure.instruments import energy as _energy


def __getattr__(name: str) -> Any:
    found = getattr(_energy, name)  # AttributeError for a name it never had
    warnings.warn(
        f"perflab.measure.energy.{name} moved to perflab.measure.instruments.energy.{name}",
        DeprecationWarning,
        stacklevel=2,
    )
    return found
