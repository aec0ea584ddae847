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
import errno
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Iterator

from perflab.errors import ConfigError
from perflab.store import files
from perflab.store.layout import META as META
from perflab.store.layout import SWEEP_MARK, is_run_dir, run_dir_above
from perflab.store.layout import is_store as is_store  # what tree.is_store was, said once there
from perflab.store.rows import RESULTS, Notes
from perflab.store.rundir import RECORD

log = logging.getLogger("perflab")


def meta(root: Path) -> Path:
    return Path(root) / META


def check(root: Path) -> None:
    """The store and the folders perflab keeps in it can be written: before any work. What
    sits where one of ``.perflab/``'s folders belongs (a file, a FIFO, a dangling link) is
    removed first: that folder is derived, and rebuilt."""
    files.check_dir("results.store", Path(root))
    for sub in ("", "done", "claims", "index"):
        with contextlib.suppress(OSError):  # a read-only tree: check_dir says so in one line
            derived_dir(meta(root) / sub, make=False, links=sub in ("", "index"))
        files.check_dir("results.store", meta(root) / sub, shown=str(root))


def derived_dir(path: Path, make: bool = True, links: bool = False) -> Path:
    """``path``, a folder of ``.perflab/`` (derived from the run dirs: safe to delete, rebuilt):
    anything else there (a file, a FIFO, a dangling or looping link) is removed and said. A link
    to a folder too (the link only, never what it points to: perflab deletes in these folders),
    unless ``links``: ``.perflab/`` itself and its ``index/`` may live on another disk."""
    kind = files.kind_of(path)
    linked = path.is_symlink() and not (links and kind == "a directory")
    if linked or (kind not in ("a directory", "missing")):
        said = f"a link to {kind}" if path.is_symlink() else kind
        if not remove(path):
            raise FileExistsError(errno.EEXIST, f"{said}, reached through a link: not removed", str(path))
        log.warning("perflab: %s was %s, not a folder; removed (.perflab/ is rebuilt from the runs)", path, said)
    if make:
        path.mkdir(parents=True, exist_ok=True)
    return path


def derived_file(path: Path) -> Path:
    """``path``, a file of ``.perflab/`` about to be written whole: a link there is removed (the
    link, never its target: a derived file is not written through a link to a user's file), and
    so is a folder, a FIFO or a socket (a folder only where reached without a link: see removable)."""
    kind = files.kind_of(path)
    if path.is_symlink() or kind not in ("a regular file", "missing"):
        said = f"a link to {kind}" if path.is_symlink() else kind
        if not remove(path):
            raise FileExistsError(errno.EEXIST, f"{said}, reached through a link: not removed", str(path))
        log.warning("perflab: %s was %s, not a file; removed (.perflab/ is rebuilt from the runs)", path, said)
    return path


def removable(path: Path) -> bool:
    """Whether ``path`` may be deleted as a derived file: its folder is reached from the store's
    ``.perflab/`` with no link on the way (a link there could lead into a user's folder, whose
    files are never deleted: only the link itself may be)."""
    parts = Path(os.path.abspath(path)).parts
    if META not in parts:
        return False
    at = parts.index(META)
    folders = [Path(*parts[: i + 1]) for i in range(at, len(parts) - 1)]  # .perflab/ ... its folder
    return not any(folder.is_symlink() for folder in folders)


def remove(path: Path) -> bool:
    """Delete the derived file or folder ``path`` where :func:`removable` says so (a link: the
    link itself); else leave it and say so. Returns whether it is gone."""
    if not removable(path):
        log.warning("perflab: %s is reached through a link; left as it is (nothing is deleted through a link)", path)
        return False
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    return not os.path.lexists(path)


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

UNREADABLE_FOLDER = "skipped {n} folder{s} that could not be read ({why}): runs there are not loaded"
RESULTS_LINK = "skipped {n} symlinked results.csv (perflab writes real files; a link is not followed)"
NOT_PLAIN = "skipped {n} non-regular file{s} (a FIFO, a device, a folder) where perflab keeps a run's files"


def walk(top: str | os.PathLike, notes: Notes | None = None) -> Iterator[tuple[str, dict[str, os.stat_result]]]:
    """(run dir, the stats of the run files perflab reads there, by name) for every run dir
    under ``top``: a folder holding run.json or results.csv. Hidden folders are skipped; a run
    dir's subfolders hold no runs. A folder's two run files are looked up by name first (the
    stats a reader needs anyway), and only a folder that is no run dir is listed. Each real
    folder is visited once (a folder link, a loop), known by its own identity: two run dirs
    whose results.csv are hard links of one file (``cp -al`` snapshots) are two run dirs. A run
    dir met as a plain folder of its listing is known by the inode the listing gives, on its
    folder's device: no stat of its own (20k run dirs: 20k system calls less); a linked one, and
    every folder that is no run dir (what loops and mounts go through), by a stat."""
    stack: list[tuple[str, tuple[int, int] | None]] = [(os.fspath(top), None)]
    seen: set[tuple[int, int]] = set()
    while stack:
        here, known = stack.pop()
        if known is not None and known in seen:
            continue
        found, is_run_dir, skipped = _run_files(here)
        if not is_run_dir or known is None:
            try:
                st = os.stat(here)  # a folder is known by its own identity, not its files' (hard links)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
        if known is not None:
            seen.add(known)
        if is_run_dir:
            for why, path in skipped:
                if notes is not None:
                    notes.add(why, path)
            yield here, found
            continue
        try:
            entries = list(os.scandir(here))
        except (FileNotFoundError, NotADirectoryError):  # gone meanwhile
            continue
        except OSError as err:  # no permission, a dead mount: its runs are not hidden in silence
            if notes is not None:
                notes.add(UNREADABLE_FOLDER.replace("{why}", err.strerror or type(err).__name__), here)
            continue
        folders = [e for e in entries if not e.name.startswith(".") and _is_dir(e)]
        stack += sorted(
            ((e.path, None if e.is_symlink() else (st.st_dev, e.inode())) for e in folders),
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


def relative(root: Path, run_dir: Path) -> str:
    """How the index names a run dir: relative to the store when inside it (trees can move)."""
    try:
        return str(Path(os.path.abspath(run_dir)).relative_to(os.path.abspath(root)))
    except ValueError:
        return str(Path(os.path.abspath(run_dir)))


# --- where a new run may go -------------------------------------------------------------------
#
# A run dir holds what its run wrote and nothing else: no new run is written where a run already
# is, or where no reader looks (:func:`check_run_dir`). Where an output a user names may not go:
# layout.truth, which files.check_file asks.

RUN_DIR_ALLOWED = "a new or empty folder (the default: a fresh one under results.store)"


def check_run_dir(key: str, run_dir: Path, root: Path) -> None:
    """A new run (or sweep) may be written in ``run_dir``: not into a run already there (its rows
    would be filed under the new one), not the store itself, nor a folder holding runs (they would
    be hidden: a run dir's subfolders hold no runs), nor inside a run dir or a hidden folder of the
    store (never read). Else one line (ConfigError), before anything is written."""
    real, store = Path(os.path.realpath(run_dir)), Path(os.path.realpath(root))
    why = ""
    if real == store or real in store.parents:
        why = "it is the results store, or holds it (every run there would be hidden)"
    elif store in real.parents and any(p.startswith(".") for p in real.relative_to(store).parts):
        why = f"it is under a hidden folder of the store ({META}/ ...), which no reader reads"
    elif (above := run_dir_above(real)) is not None:
        why = f"it is inside the run dir {above} (a run dir's subfolders are never read)"
    elif is_run_dir(real) or (real / SWEEP_MARK).exists():
        why = "it already holds a run (or a sweep)"
    elif _holds_runs(real):
        why = "it holds runs (a run dir's subfolders are never read: they would be hidden)"
    if why:
        raise ConfigError(key, str(run_dir), RUN_DIR_ALLOWED, problem=why)


def _holds_runs(folder: Path, depth: int = 2) -> bool:
    """A run dir within ``depth`` levels below ``folder`` (runs/<run>, sweeps/<sweep>/<n>): a
    bounded look, so a big folder of the user's costs a few listings, not a walk."""
    try:
        entries = [e for e in os.scandir(folder) if not e.name.startswith(".") and _is_dir(e)]
    except OSError:
        return False
    return any(is_run_dir(Path(e.path)) or (depth > 1 and _holds_runs(Path(e.path), depth - 1)) for e in entries)
