"""Which sweep points are done: one tiny file per complete run under ``.perflab/done/<point
key>/<run id>``, holding its run dir, so "is this point done?" is one directory listing however
big the tree is. A point's key is its config hash, what is measured (the subject, the code
under test: a re-run after a commit measures again; and a model folder's contents, its
``model_digest``: a folder rewritten with other weights is measured again) and the process
(bench.processes: process 2 is not process 1)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import string
from pathlib import Path

from perflab.store import files
from perflab.store.rows import RESULTS, Notes, read_csv
from perflab.store.rundir import RunRecord
from perflab.store.tree import derived_dir, derived_file, meta, relative, remove, run_dirs

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
    files.write_atomic(derived_file(folder / record.run_id), relative(root, run_dir) + "\n")


def unmark(root: Path, record: RunRecord) -> None:
    """Take back :func:`mark_done` (the point was taken over from this run meanwhile)."""
    _drop(meta(root) / "done" / key_of(record) / record.run_id)


def find_done(root: Path, key: str) -> Path | None:
    """The newest run dir whose run.json says it completed this point (``point_key``), or None.

    Looks in the done index (one listing). A marker is derived, so its damage never makes a
    point measured twice: one that is not a marker (cut short, empty, bit-flipped, a link, a
    folder) or leads to no complete run of this point (its run dir removed), and a marks folder
    left empty, are dropped and the point is looked for in the run dirs themselves, its marker
    rebuilt. A complete run whose rows are missing or torn is no longer done (measured again,
    and said). A store without the index (deleted, damaged, or written by an older perflab)
    gets it rebuilt from the run dirs first.
    """
    done = meta(root) / "done"
    format_mark = done / FORMAT
    if (
        files.kind_of(done) != "a directory"
        or done.is_symlink()
        or files.kind_of(format_mark) != "a regular file"
        or format_mark.is_symlink()
    ):
        rebuild_done(root)  # none yet, damaged, or keyed as an older perflab keyed it (config hash only)
    folder = done / key
    if folder.is_symlink() or files.kind_of(folder) not in ("a directory", "missing"):  # damaged
        derived_dir(folder, make=False)
        return _look_in_run_dirs(root, key)
    try:
        markers = sorted(folder.iterdir(), key=lambda p: p.name, reverse=True)  # run ids start with the time
    except FileNotFoundError:
        return None
    damaged = not markers  # perflab leaves no empty marks folder (see _drop): someone emptied it
    for marker in markers:
        if files.in_flight(marker):
            continue
        where = _read_marker(marker)
        if where is None:  # not a marker: derived, so dropped, and the point looked for in the runs
            log.warning("perflab: %s is %s, not a done marker; removed", marker, _what(marker))
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
            _drop(marker)
            continue
        _drop(marker)  # its run dir was removed or rewritten, or the marker's bytes changed: ask the runs
        damaged = True
    return _look_in_run_dirs(root, key) if damaged else None


def _read_marker(marker: Path) -> Path | None:
    """The run dir a marker names, or None where it is no marker: a link, not a regular file,
    not one line of text naming a folder."""
    if marker.is_symlink():
        return None
    try:
        text = files.read_text(marker)
    except (OSError, ValueError):
        return None
    where = text.strip()
    if not where or "\n" in where or not text.endswith("\n") or "\0" in where:
        return None
    return Path(where)


def _what(marker: Path) -> str:
    if marker.is_symlink():
        return "a link"
    kind = files.kind_of(marker)
    return "not one line naming a run dir" if kind == "a regular file" else kind


def _look_in_run_dirs(root: Path, key: str) -> Path | None:
    """The newest complete run of this point, found in the run dirs themselves (its marker was
    damaged or lost), marked done again; or None, and its marks folder goes."""
    found = []
    for run_dir in run_dirs(root):
        record = RunRecord.read(run_dir)
        if record and record.complete and key_of(record) == key and not damage(run_dir, record):
            found.append((record.run_id, run_dir, record))
    if not found:
        with contextlib.suppress(OSError):  # empty: nothing says this point is done
            (meta(root) / "done" / key).rmdir()
        return None
    _, run_dir, record = max(found, key=lambda f: f[0])
    mark_done(root, record, run_dir)
    log.info("perflab: %s completed this point; its done marker was rebuilt", run_dir)
    return run_dir


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
    """Remove a marker (a link: the link itself; nothing through a link), and its marks folder
    once empty: an empty one is never left, so finding one means the markers were lost."""
    remove(marker)
    with contextlib.suppress(OSError):
        marker.parent.rmdir()


def rebuild_done(root: Path) -> int:
    """Recreate ``done/`` from every run.json in the tree; returns how many runs are done (a
    complete run whose rows are damaged is not: its point is measured again)."""
    done = derived_dir(meta(root) / "done")
    for old in done.iterdir():  # markers of another key format (an older perflab's) would never be found
        if old.name != FORMAT and not KEY.fullmatch(old.name) and not files.in_flight(old):
            remove(old)  # through a link (.perflab/ linked to a folder of the user's): left
    count = 0
    for run_dir in run_dirs(root):
        record = RunRecord.read(run_dir)
        if record and record.complete and not damage(run_dir, record):
            mark_done(root, record, run_dir)
            count += 1
    files.write_atomic(derived_file(done / FORMAT), "done marks keyed by config hash, subject and process\n")
    return count
