"""The environment columns every row carries, gathered once per job."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch

import perflab


@functools.cache
def git_sha() -> str:
    """The project's commit (with ``+dirty`` for local edits), or ``unknown`` outside a checkout."""
    root = Path(perflab.__file__).resolve().parent.parent
    if not (root / ".git").exists():  # an installed copy: site-packages is no checkout of ours
        return "unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


@functools.cache
def _static() -> dict[str, object]:
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "cuda_available": torch.cuda.is_available(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "hostname": socket.gethostname(),
        "git_sha": git_sha(),
        "perflab_version": perflab.__version__,
    }


SLURM = {
    "slurm_job_id": "SLURM_JOB_ID",
    "slurm_array_task_id": "SLURM_ARRAY_TASK_ID",
    "slurm_node": "SLURMD_NODENAME",  # where the row was written (rank 0's node) ...
    "slurm_nodes": "SLURM_JOB_NODELIST",  # ... and every node of the job (a multi-node run: several)
}


def environment() -> dict[str, object]:
    """Versions, host, time and (under SLURM) where the job ran; device names are per row."""
    where = {col: os.environ[var] for col, var in SLURM.items() if os.environ.get(var)}
    if where and os.environ.get("SUBMITIT_EXECUTOR"):  # a job of perflab's SLURM launcher: its log file
        with contextlib.suppress(Exception):
            import submitit

            where["log"] = str(submitit.JobEnvironment().paths.stderr)
    return {**_static(), **where, "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}
