"""Which sweep points are done: one tiny file per complete run under ``.perflab/done/<point
key>/<run id>``, holding its run dir, so "is this point done?" is one directory listing however
big the tree is. A point's key is its config hash, the subject (the code under test: a re-run
after a commit measures again) and the process (bench.processes: process 2 is not process 1)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from perflab.store import files
from perflab.store.rundir import RunRecord
from perflab.store.tree import meta, relative, run_dirs

log = logging.getLogger("perflab")


def point_key(config_hash: str, subject: str = "", process: int = 1) -> str:
    """What "the same point" means for done marks and claims: config, subject, process."""
    said = hashlib.sha256(subject.encode()).hexdigest()[:12] if subject else "none"
    return f"{config_hash}-{said}-p{process}"


def key_of(record: RunRecord) -> str:
    return point_key(record.config_hash, record.subject, record.process)


def mark_done(root: Path, record: RunRecord, run_dir: Path) -> None:
    """Say in the index that ``run_dir`` completed this point (after its run.json says so)."""
    folder = meta(root) / "done" / key_of(record)
    folder.mkdir(parents=True, exist_ok=True)
    files.write_atomic(folder / record.run_id, relative(root, run_dir) + "\n")


def find_done(root: Path, key: str) -> Path | None:
    """The newest run dir whose run.json says it completed this point (``point_key``), or None.

    Looks in the done index (one listing); markers whose run dir is gone or no longer complete
    are dropped. A store without the index (deleted, or written by an older perflab) gets it
    rebuilt from the run dirs first.
    """
    done = meta(root) / "done"
    if not done.is_dir():
        rebuild_done(root)
    folder = done / key
    try:
        markers = sorted(folder.iterdir(), key=lambda p: p.name, reverse=True)  # run ids start with the time
    except FileNotFoundError:
        return None
    for marker in markers:
        try:
            where = Path(marker.read_text().strip())
        except OSError:
            continue
        run_dir = where if where.is_absolute() else Path(root) / where
        record = RunRecord.read(run_dir)
        if record and record.complete and key_of(record) == key:
            return run_dir
        marker.unlink(missing_ok=True)  # stale: the run dir was removed or rewritten
    return None


def rebuild_done(root: Path) -> int:
    """Recreate ``done/`` from every run.json in the tree; returns how many runs are done."""
    (meta(root) / "done").mkdir(parents=True, exist_ok=True)
    count = 0
    for run_dir in run_dirs(root):
        record = RunRecord.read(run_dir)
        if record and record.complete:
            mark_done(root, record, run_dir)
            count += 1
    return count
