"""Where perflab keeps what in a results tree, and the one rule that follows from it: which
paths hold truth (a run dir's files, a sweep dir's, ``.perflab/``), so that no output a user
names lands there. Names only, and plain ``os`` calls: every module of the store, the
lowest (``files``) included, can ask it.

  <run dir>/results.csv, samples.csv, run.json    a run's truth (rows, raw samples, record)
  <run dir>/operators.csv                         its profiled operators (bench.profile=true)
  <sweep dir>/multirun.yaml, sweep.csv            a sweep's (Hydra's record of it, its rows)
  <store>/.perflab/                               derived from the run dirs (rebuilt)
"""

from __future__ import annotations

import os
from pathlib import Path

RESULTS = "results.csv"
SAMPLES = "samples.csv"
OPERATORS = "operators.csv"  # perflab.measure.operators writes it
RECORD = "run.json"
META = ".perflab"
SWEEP_MARK = "multirun.yaml"  # Hydra's record of a sweep, in the sweep dir


def is_run_dir(folder: str | os.PathLike) -> bool:
    """``folder`` holds a run file (results.csv or run.json, whatever its kind)."""
    return any(os.path.lexists(os.path.join(folder, name)) for name in (RESULTS, RECORD))


def is_store(path: str | os.PathLike) -> bool:
    """A results tree as perflab writes it (runs/, sweeps/ or its .perflab/ folder)."""
    return any((Path(path) / part).is_dir() for part in (META, "runs", "sweeps"))


def run_dir_above(path: str | os.PathLike) -> Path | None:
    """The run dir ``path`` lies in (its folder or one further up), or None."""
    return next((p for p in Path(os.path.abspath(path)).parents if is_run_dir(p)), None)


def truth(path: str | os.PathLike) -> str:
    """Why writing at ``path`` (symlinks followed) would change what perflab wrote as truth, or
    keeps as derived ('' where it would not): a file in a run dir or a sweep dir, anything under
    ``.perflab/``, a folder that is a run dir, a sweep dir or a results tree. The one rule every
    output path asks (files.check_file, ``ab --out``)."""
    real = Path(os.path.realpath(path))
    if META in real.parts:
        return f"it is under {META}/, which perflab keeps for itself (rebuilt from the runs)"
    above = run_dir_above(real)
    if above is not None:
        return f"it is in the run dir {above}, which holds what its run wrote and nothing else"
    if (real.parent / SWEEP_MARK).exists():
        return f"it is in the sweep dir {real.parent}, which holds what its sweep wrote"
    if real.is_dir() and (is_run_dir(real) or is_store(real) or (real / SWEEP_MARK).exists()):
        return "it is a run dir, a sweep dir or a results tree"
    return ""
