"""The floor of a one-process verdict: this machine's between-process variation, kept.

With one process a side the variation between processes is unknown, and a verdict must not be
more confident than it allows: a 2 % floor false-FAILed half of A/A pairs on a quiet VM whose
processes differ by 10-40 %. So ``perflab ab`` (and ``perflab compare --keep-floor``,
``perflab.compare.ab(keep=True)``), with two or more processes on a side, keeps what it
measured there (the standard deviation of the log per-process figures, and its degrees of
freedom) for the machine identity of its rows, in the user's cache (``KEPT``); a later
comparison with one process a side on that machine is judged against the pooled value of them
all. ``--process-cv`` overrides it; with nothing kept, ``replicates.FLOOR_CV`` is assumed, and said.

A series (a point's side, named by its first process's run) is kept once, its latest look
replacing earlier ones (``perflab ab`` looks after every round), and a machine keeps its
``MOST_SERIES`` latest series: the floor follows the machine as it is now. The points of one
run share its processes, so their variations are not independent: a run keeps one series (the
last of its points looked at), lest one sweep's pair of processes fill the pool.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from perflab.analysis.frames import plain_text
from perflab.analysis.replicates import FLOOR_CV
from perflab.measure.environment import identity_key

MOST_SERIES = 100  # a machine's latest series pooled into its floor
KEPT = "process_cv.json"  # in the user's cache: $XDG_CACHE_HOME/perflab/, else ~/.cache/perflab/


@dataclass(frozen=True)
class Floor:
    """The between-process variation assumed (a log standard deviation) and where it came from,
    in words for the verdict."""

    cv: float
    source: str


def given(cv: float) -> Floor:
    return Floor(cv, "--process-cv")


def path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "perflab" / KEPT


def machine(rows: pd.DataFrame) -> dict[str, str]:
    """The machine identity fields (``environment.IDENTITY``) the rows recorded, as text."""
    from perflab.measure.environment import IDENTITY

    return joined({f: set(map(plain_text, rows[f].dropna())) for f in IDENTITY if f in rows})


def joined(identity: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """A machine as it is kept: each identity field's values (``frames.plain_text``, as compare
    reads them for INCOMPARABLE), sorted and joined; fields with none left out."""
    out = {}
    for field, values in identity.items():
        found = sorted(set(values) - {""})
        if found:
            out[field] = ", ".join(found)
    return out


def _read() -> dict[str, Any]:
    """The kept file as it is now (read again only when it changed: compare asks per point)."""
    try:
        st = os.stat(path())
    except OSError:
        return {}
    return _parsed(str(path()), st.st_ino, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _parsed(name: str, inode: int, mtime_ns: int, size: int) -> dict[str, Any]:
    from perflab.store import files

    try:
        kept = json.loads(files.read_regular(name))
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def of(rows: pd.DataFrame) -> Floor:
    """The floor for the machine that measured ``rows``: its kept variation, pooled over its
    series, or ``FLOOR_CV`` where none is kept (or the file is unreadable)."""
    return of_machine(machine(rows))


def of_machine(identity: dict[str, str]) -> Floor:
    """``of`` for a machine identity (``machine``'s): a compare looks each machine up once."""
    series = _read().get(identity_key(identity), {}).get("series", {})
    try:
        found = [(float(s["cv"]), int(s["df"])) for s in series.values()]
    except (AttributeError, KeyError, TypeError, ValueError):
        found = []
    found = [(cv, df) for cv, df in found if math.isfinite(cv) and cv >= 0 and df >= 1]
    df = sum(d for _, d in found)
    pooled = math.sqrt(sum(d * cv**2 for cv, d in found) / df) if df else 0.0
    if not pooled > 0:
        return Floor(FLOOR_CV, "assumed: none kept for this machine")
    return Floor(pooled, f"this machine's, kept from {len(found)} earlier series of 2 or more processes in {path()}")


def keep(measured: Iterable[tuple[pd.DataFrame, str, np.ndarray]]) -> None:
    """Keep each series' between-process variation: (its rows, its metric, its per-process
    figures), one side of a point with two or more processes. A cache that cannot be written
    keeps nothing (said by nothing: the floor stays what it was)."""
    from perflab.store import files

    kept, now = copy.deepcopy(_read()), datetime.now(timezone.utc).isoformat(timespec="seconds")
    changed = False
    for rows, metric, figures in measured:
        logs = np.log(figures[np.isfinite(figures) & (figures > 0)])
        if len(logs) < 2 or "run_id" not in rows:
            continue
        identity = machine(rows)
        entry = kept.setdefault(identity_key(identity), {})
        entry = entry if isinstance(entry, dict) else {}
        kept[identity_key(identity)] = entry
        entry["machine"] = identity
        found = entry.get("series")
        series: dict[str, Any] = found if isinstance(found, dict) else {}
        name = f"{metric} {sorted(rows['run_id'].astype(str))[0]}"
        series.pop(name, None)  # re-inserted last: the latest
        series[name] = {"cv": float(np.std(logs, ddof=1)), "df": len(logs) - 1, "when": now}
        entry["series"] = dict(list(series.items())[-MOST_SERIES:])
        changed = True
    if changed:
        with contextlib.suppress(OSError):
            path().parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(path(), json.dumps(kept, indent=1) + "\n")
