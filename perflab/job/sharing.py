"""Launcher policy: what perflab allows and says when Hydra runs jobs side by side.

Jobs running at once on one machine (``+launcher=parallel``: Hydra's joblib launcher)
disturb each other's timings, so every row says so in ``beside``; GPU jobs are refused,
since parallel jobs would share the GPUs. SLURM jobs get machines of their own.
"""

from __future__ import annotations

import logging
from typing import Sequence

from perflab.errors import ConfigError
from perflab.measure.devices import Device

log = logging.getLogger("perflab")


def beside(place, devices: Sequence[Device]) -> str:
    """What ran beside this job on its machine ("" if nothing); refuses sharing a GPU."""
    if place.parallel_jobs <= 1:
        return ""
    if any(d.type != "cpu" for d in devices):
        raise ConfigError(
            "hydra.launcher.n_jobs",
            place.parallel_jobs,
            "1, the basic launcher, or +launcher=slurm for GPU sweeps",
            problem="parallel local jobs would share the GPUs",
        )
    log.warning("jobs run %s at a time on this machine: their timings disturb each other", place.parallel_jobs)
    return f"up to {place.parallel_jobs} jobs at once (joblib): timings disturbed"
