"""perflab: a config-driven lab for measuring the computational performance of PyTorch work.

``perflab.run(experiment, overrides)`` runs one job and returns its rows (a DataFrame);
``perflab.results.load(path)`` loads any results tree; ``perflab.compare`` compares them.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from perflab.version import __version__

# OpenMP threads that wait for work sleep instead of spinning: beside a busy process, spinning
# threads take the CPU from the one they wait for, and a matmul on 2 cores runs several times
# slower (docs/running.md#what-omp_num_threads-does). Read once, when torch is imported: a
# process that imported torch before perflab keeps its policy, and the variable is left unset
# there, so that rows (omp_wait_policy) say the policy the threads had. OMP_WAIT_POLICY=active
# restores spinning.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["__version__", "run"]


def run(experiment: str, overrides: Sequence[str] = ()) -> Any:
    """Run one job as the command line would; see :func:`perflab.api.run`."""
    from perflab.api import run as _run

    return _run(experiment, overrides)
