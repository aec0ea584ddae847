"""perflab: a config-driven lab for measuring the computational performance of PyTorch work.

``perflab.run(experiment, overrides)`` runs one job and returns its rows (a DataFrame);
``perflab.results.load(path)`` loads any results tree; ``perflab.compare`` compares them.
"""

from __future__ import annotations

from typing import Any, Sequence

from perflab.version import __version__

__all__ = ["__version__", "run"]


def run(experiment: str, overrides: Sequence[str] = ()) -> Any:
    """Run one job as the command line would; see :func:`perflab.api.run`."""
    from perflab.api import run as _run

    return _run(experiment, overrides)
