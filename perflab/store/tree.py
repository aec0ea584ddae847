"""The results tree (``results.store``, default ``outputs/``): finding its runs, and the folder
perflab keeps beside them.

The truth is in the run dirs (``results.csv`` + ``run.json``). What lives under
``<store>/.perflab/`` is derived and safe to delete (``python -m perflab.results reindex``
rebuilds it; a missing ``done/`` is rebuilt by itself):

  done/<config hash>/<run id>   which points are done (:mod:`perflab.store.done_marks`)
  claims/<config hash>.json     a sweep point being measured now (:mod:`perflab.store.point_claims`)
  index/<segment>.parquet       the rows of many run dirs, loaded fast (:mod:`perflab.store.index`)
  index/samples/<segment>.parquet   their raw samples, by row id

Every file there is created whole (a unique name, or O_EXCL): nothing relies on many writers
appending to one file, or on file locks, which cluster filesystems do not all honour.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import Iterator

from perflab.store import files
from perflab.store.rows import RESULTS, Notes
from perflab.store.rundir import RECORD

log = logging.getLogger("perflab")

META = ".perflab"


def meta(root: Path) -> Path:
    return Path(root) / META


def check(root: Path) -> None:
    """The store and the folders perflab keeps in it can be written: before any work. What
    sits where one of ``.perflab/``'s folders belongs (a file, a FIFO, a dangling link) is
    removed first: that folder is derived, and rebuilt."""
    files.check_dir("results.store", Path(root))
    for sub in ("", "done", "claims", "index"):
        with contextlib.suppress(OSError):  # a read-only tree: check_dir says so in one line
            derived_dir(meta(root) / sub, make=False)
        files.check_dir("results.store", meta(root) / sub, shown=str(root))


def derived_dir(path: Path, make: bool = True) -> Path:
    """``path``, a folder of ``.perflab/`` (derived from the run dirs: safe to delete, rebuilt):
    anything else there (a file, a FIFO, a dangling or looping link) is removed and said."""
    kind = files.kind_of(path)
    if kind != "a directory" and (kind != "missing" or path.is_symlink()):
        path.unlink()
        log.warning("perflab: %s was %s, not a folder; removed (.perflab/ is rebuilt from the runs)", path, kind)
    if make:
        path.mkdir(parents=True, exist_ok=True)
    return path


# --- finding runs ---------------------------------------------------------------------------
#
# Symlinked folders are followed, by readers as by writers. A symlinked ``runs/`` (or
# ``.perflab/index``) is how people put results on another disk; the writers (Hydra making run
# dirs, the index writing segments) already go through it, so the readers go too: a reader that
# refused would hide every run written there. Each real folder is visited once (a link loop
# ends). A ``results.csv`` that is itself a symlink is never read: perflab writes real files, so
# a linked one is someone else's data (it could point anywhere, a password file included). Nor
# is a results.csv or run.json that is not a regular file (a FIFO would block its reader forever,
# a device never end): perflab writes regular files only (the samples loader says the same of
# a samples.csv).

RESULTS_LINK = "skipped {n} symlinked results.csv (perflab writes real files; a link is not followed)"
NOT_PLAIN = "skipped {n} non-regular file{s} (a FIFO, a device, a folder) where perflab keeps a run's files"


def walk(top: str | os.PathLike, notes: Notes | None = None) -> Iterator[tuple[str, dict[str, os.stat_result]]]:
    """(run dir, the stats of the run files perflab reads there, by name) for every run dir
    under ``top``: a folder holding run.json or results.csv. Hidden folders are skipped; a run
    dir's subfolders hold no runs. A folder's two run files are looked up by name first (the
    stats a reader needs anyway), and only a folder that is no run dir is listed: 10k run dirs
    cost 30k stats, not 10k listings besides. Each real folder is visited once (a folder link, a
    loop), known by its own identity: two run dirs whose results.csv are hard links of one file
    (``cp -al`` snapshots) are two run dirs."""
    stack, seen = [os.fspath(top)], set()
    while stack:
        here = stack.pop()
        try:
            st = os.stat(here)  # a folder is known by its own identity, not its files' (hard links)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        found, is_run_dir, skipped = _run_files(here)
        if is_run_dir:
            for why, path in skipped:
                if notes is not None:
                    notes.add(why, path)
            yield here, found
            continue
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        stack += sorted(
            (e.path for e in entries if not e.name.startswith(".") and _is_dir(e)),
            reverse=True,
        )


def _run_files(here: str) -> tuple[dict[str, os.stat_result], bool, list[tuple[str, str]]]:
    """The stats of the run files in ``here`` that perflab reads, by name; whether ``here`` is a
    run dir (it holds a run file, read or not); and why any other is not read, with its path. A
    results.csv is never followed through a link, a run.json is; one that is not a regular file
    is not read."""
    found, is_run_dir, skipped = {}, False, []
    base = here if here.endswith(os.sep) else here + os.sep  # not os.path.join: 20k calls at 10k run dirs
    for name in (RESULTS, RECORD):
        path = base + name
        try:
            st = os.lstat(path)
        except OSError:  # none there (or ``here`` is no folder)
            continue
        is_run_dir, why = True, ""
        if stat.S_ISREG(st.st_mode):  # the usual case: a regular file
            found[name] = st
            continue
        if stat.S_ISLNK(st.st_mode) and name == RESULTS:
            why = RESULTS_LINK
        elif stat.S_ISLNK(st.st_mode):
            try:
                st = os.stat(path)
            except OSError:  # a dangling or looping link
                why = NOT_PLAIN
        if not why and not stat.S_ISREG(st.st_mode):
            why = NOT_PLAIN
        if why:
            skipped.append((why, path))
        else:
            found[name] = st
    return found, is_run_dir, skipped


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # through a symlink too
    except OSError:
        return False


def run_dirs(top: Path, notes: Notes | None = None) -> Iterator[Path]:
    """Every run dir under ``top`` (see _walk), symlinked folders followed."""
    for here, _ in walk(top, notes):
        yield Path(here)


def is_store(path: Path) -> bool:
    """A results tree as perflab writes it (runs/, sweeps/ or its .perflab/ folder)."""
    return any((Path(path) / part).is_dir() for part in (META, "runs", "sweeps"))


def relative(root: Path, run_dir: Path) -> str:
    """How the index names a run dir: relative to the store when inside it (trees can move)."""
    try:
        return str(Path(os.path.abspath(run_dir)).relative_to(os.path.abspath(root)))
    except ValueError:
        return str(Path(os.path.abspath(run_dir)))
