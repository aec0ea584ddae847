"""Processes as the unit of replication: ``bench.processes=K`` runs the whole command K times,
each in a fresh interpreter (``python -m perflab ...``), one after the other, so a sweep's
points are measured once in each process before any is measured again (a slow drift of the
machine spreads over every point rather than landing on one).

Each process knows its index from ``PERFLAB_PROCESS`` (1..K): its rows carry it as ``process``
and a sweep's done marks hold it (``perflab.store.done_marks``), so process 2 of a point is not
taken for process 1 already done. ``perflab ab`` starts its processes through ``run_one`` too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Mapping, Sequence

ENV = "PERFLAB_PROCESS"  # this process's index among the K of bench.processes=K (absent: 1)
KEY = "bench.processes"


def index() -> int:
    """This process's index (1 where none was given, or it is not a whole number >= 1)."""
    text = os.environ.get(ENV, "")
    return int(text) if text.isdigit() and int(text) >= 1 else 1


def asked(args: Sequence[str]) -> int:
    """K of the last ``bench.processes=K`` on the command line; 1 where absent or not a whole
    number (the schema refuses such a value in one line, in the process that reads it)."""
    found = [a.partition("=")[2] for a in args if a.lstrip("+~").startswith(f"{KEY}=")]
    return int(found[-1]) if found and found[-1].isdigit() else 1


def conduct(args: Sequence[str]) -> int | None:
    """Run the command ``args`` in K fresh processes when it asks for ``bench.processes=K > 1``
    and this is not already one of them; the exit code of the first that failed, else 0. None:
    nothing to conduct, run here."""
    from perflab.config.schema import MAX_PROCESSES

    k = asked(args)
    if ENV in os.environ or not 1 < k <= MAX_PROCESSES:
        return None
    worst = 0
    for i in range(1, k + 1):
        print(f"perflab: process {i} of {k} ({KEY}={k})", file=sys.stderr, flush=True)
        code = run_one(args, process=i)
        if code == 2:  # a usage error: the same in every process
            return code
        worst = worst or code
    return worst


def run_one(
    args: Sequence[str],
    *,
    process: int,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    quiet: bool = False,
    cwd: str | os.PathLike[str] | None = None,
    module: str = "perflab",
) -> int:
    """``python -m perflab ARGS`` in a fresh process as process ``process``, with ``env`` added to
    this environment (``python``: another interpreter, e.g. another venv's; ``cwd``: where it
    starts, e.g. a worktree of the code under test; ``module``: another of perflab's entries,
    e.g. ``perflab.job.together``). Its exit code."""
    environ = {**os.environ, **(env or {}), ENV: str(process)}
    out = subprocess.DEVNULL if quiet else None
    command = [python or sys.executable, "-m", module, *args]
    return subprocess.run(command, env=environ, stdout=out, cwd=cwd).returncode
