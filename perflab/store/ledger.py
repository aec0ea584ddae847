"""The optional ledger (``results.ledger=PATH``): one CSV that every job's rows are also
appended to, for people who want a single file. It is a convenience, never the truth: run
dirs are, and nothing in perflab reads the ledger to decide anything. On a cluster filesystem
prefer ``perflab.results.load(tree)`` or ``python -m perflab.results export``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from filelock import FileLock, Timeout

from perflab.errors import ConfigError
from perflab.store import files
from perflab.store.rows import csv_text, header_of, is_ours, order_columns, read_csv

log = logging.getLogger("perflab")
LOCK_TIMEOUT_S = 60.0  # a writer killed while holding the lock blocks nobody longer than this
ALLOWED = "a perflab ledger CSV, a new file path, or null (no ledger)"


def check(path: Path, key: str = "results.ledger") -> None:
    """Refuse, before anything is measured, a ledger perflab cannot or must not append to."""
    if not files.check_file(key, path, ALLOWED):
        return
    real = files.target(path)
    if real.stat().st_size == 0:
        return
    header = header_of(real)
    if not header:
        raise ConfigError(key, str(path), ALLOWED, problem="not a CSV text file")
    if not is_ours(header):
        raise ConfigError(
            key, str(path), ALLOWED, problem=f"not a perflab ledger (its header starts {','.join(header[:3])})"
        )


def append(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append rows under a file lock; new columns rewrite the file (atomically) with the union.

    Appends start on a fresh line even after a torn write. A lock held too long (a writer
    killed on another node) costs this job its ledger lines, not its results: it says so.
    """
    real = files.target(path)
    try:
        with FileLock(str(real) + ".lock", timeout=LOCK_TIMEOUT_S):
            header = header_of(real) if real.exists() else []
            new = [c for row in rows for c in row if c not in header]
            if header and not new:
                files.append_text(real, csv_text(rows, header, header=False))
                return
            old = read_csv(real, text=True).to_dict("records") if header else []
            columns = order_columns([*header, *new])
            files.write_atomic(real, csv_text([*old, *rows], columns))
    except Timeout:
        log.warning(
            "results.ledger=%s: locked for over %.0f s by another writer; these rows are only in the run dir",
            path,
            LOCK_TIMEOUT_S,
        )
