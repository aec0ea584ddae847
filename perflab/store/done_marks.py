"""Which sweep points are done: one tiny file per complete run under ``.perflab/done/<point
key>/<run id>``, holding its run dir, so "is this point done?" is one directory listing however
big the tree is. A point's key is its config hash, what is measured (the subject, the code
under test: a re-run after a commit measures again; and a model folder's contents, its
``model_digest``: a folder rewritten with other weights is measured again) and the process
(bench.processes: process 2 is not process 1)."""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import string
from pathlib import Path

from perflab.store import files
from perflab.store.rows import RESULTS, Notes, read_csv
from perflab.store.rundir import RunRecord
from perflab.store.tree import derived_dir, meta, relative, run_dirs

log = logging.getLogger("perflab")


FORMAT = "FORMAT-2"  # in done/: its markers are keyed by point_key (config, subject, process)
KEY_FORMAT = "{config}-{subject}-p{process}"  # a point's key: point_key writes it, KEY reads it
NO_SUBJECT = "none"
SUBJECT_DIGITS = 12  # of the subject's sha256


def point_key(config_hash: str, subject: str = "", process: int = 1, model_digest: str = "") -> str:
    """What "the same point" means for done marks and claims: config, subject (with the model
    folder's digest where there is one: the key's format and a key without one stay as they
    were), process."""
    measured = subject + (f"\0model {model_digest}" if model_digest else "")
    said = hashlib.sha256(measured.encode()).hexdigest()[:SUBJECT_DIGITS] if measured else NO_SUBJECT
    return KEY_FORMAT.format(config=config_hash, subject=said, process=process)


def _pattern(template: str, **fields: str) -> re.Pattern[str]:
    """A format string as a regex: its text literal, each field the pattern given for it."""
    parts = string.Formatter().parse(template)
    return re.compile("".join(re.escape(text) + (fields[name] if name else "") for text, name, _, _ in parts))


# what point_key makes, derived from the same format (a key of another format is an older perflab's)
KEY = _pattern(KEY_FORMAT, config=".+", subject=f"(?:{NO_SUBJECT}|[0-9a-f]{{{SUBJECT_DIGITS}}})", process=r"\d+")


def key_of(record: RunRecord) -> str:
    return point_key(record.config_hash, record.subject, record.process, record.model_digest)


def mark_done(root: Path, record: RunRecord, run_dir: Path) -> None:
    """Say in the index that ``run_dir`` completed this point (after its run.json says so)."""
    folder = derived_dir(meta(root) / "done" / key_of(record))
    files.write_atomic(folder / record.run_id, relative(root, run_dir) + "\n")


def unmark(root: Path, record: RunRecord) -> None:
    """Take back :func:`mark_done` (the point was taken over from this run meanwhile)."""
    (meta(root) / "done" / key_of(record) / record.run_id).unlink(missing_ok=True)


def find_done(root: Path, key: str, rebuilt: bool = False) -> Path | None:
    """The newest run dir whose run.json says it completed this point (``point_key``), or None.

    Looks in the done index (one listing); markers whose run dir is gone or no longer complete
    are dropped, and so are those whose rows are missing or torn (the point is measured again,
    and that is said). A store without the index (deleted, damaged, or written by an older
    perflab) gets it rebuilt from the run dirs first.
    """
    done = meta(root) / "done"
    if files.kind_of(done) != "a directory" or files.kind_of(done / FORMAT) != "a regular file":
        rebuild_done(root)  # none yet, damaged, or keyed as an older perflab keyed it (config hash only)
    folder = done / key
    if files.kind_of(folder) not in ("a directory", "missing"):  # damaged: rebuilt, then read
        derived_dir(folder, make=False)
        rebuild_done(root)
    try:
        markers = sorted(folder.iterdir(), key=lambda p: p.name, reverse=True)  # run ids start with the time
    except FileNotFoundError:
        return None
    damaged = False
    for marker in markers:
        try:
            where = Path(files.read_text(marker).strip())
        except (OSError, ValueError):  # not a marker (a folder, a FIFO, not text): derived, so dropped
            log.warning("perflab: %s is %s, not a done marker; removed", marker, files.kind_of(marker))
            _drop(marker)
            damaged = True
            continue
        run_dir = where if where.is_absolute() else Path(root) / where
        record = RunRecord.read(run_dir)
        if record and record.complete and key_of(record) == key:
            why = damage(run_dir, record)
            if not why:
                return run_dir
            log.warning("perflab: %s completed this point, but %s: measuring it again", run_dir, why)
        _drop(marker)  # stale: the run dir was removed, rewritten or damaged
    if damaged and not rebuilt:  # the run it named may still be complete: ask the run dirs
        rebuild_done(root)
        return find_done(root, key, rebuilt=True)
    return None


def damage(run_dir: Path, record: RunRecord) -> str:
    """Why a complete run's rows cannot stand for its point ('' when they can): its results.csv
    is missing, not a file, or holds fewer of its rows than run.json counts (torn, cut short)."""
    path = run_dir / RESULTS
    kind = files.kind_of(path)
    if kind != "a regular file":
        return f"its {RESULTS} is {kind}"
    notes = Notes()
    try:
        df = read_csv(path, notes=notes)
    except OSError as err:
        return f"its {RESULTS} cannot be read ({err.strerror})"
    mine = int((df["run_id"].astype(str) == record.run_id).sum()) if "run_id" in df else 0
    if mine >= max(record.rows, 1):
        return ""
    torn = df.attrs.get("skipped_lines", 0) or (1 if notes.lines() else 0)
    said = f" ({torn} torn or malformed line{'s' if torn != 1 else ''})" if torn else ""
    return f"its {RESULTS} holds {mine} of its {record.rows} rows{said}"


def _drop(marker: Path) -> None:
    if marker.is_dir() and not marker.is_symlink():
        shutil.rmtree(marker, ignore_errors=True)
    else:
        marker.unlink(missing_ok=True)


def rebuild_done(root: Path) -> int:
    """Recreate ``done/`` from every run.json in the tree; returns how many runs are done (a
    complete run whose rows are damaged is not: its point is measured again)."""
    done = derived_dir(meta(root) / "done")
    for old in done.iterdir():  # markers of another key format (an older perflab's) would never be found
        if old.name != FORMAT and not KEY.fullmatch(old.name) and not files.in_flight(old):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
    count = 0
    for run_dir in run_dirs(root):
        record = RunRecord.read(run_dir)
        if record and record.complete and not damage(run_dir, record):
            mark_done(root, record, run_dir)
            count += 1
    files.write_atomic(done / FORMAT, "done marks keyed by config hash, subject and process\n")
    return count
