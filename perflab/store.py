"""The results tree (``results.store``, default ``outputs/``): finding runs, knowing which
points are done, claiming sweep points, and an index that makes loading a big tree fast.

The truth is in the run dirs (``results.csv`` + ``run.json``). What lives under
``<store>/.perflab/`` is derived and safe to delete (``python -m perflab.results reindex``
rebuilds it; a missing ``done/`` is rebuilt by itself):

  done/<config hash>/<run id>   one tiny file per complete run, holding its run dir: "is this
                                point done?" is one directory listing, however big the tree
  claims/<config hash>.json     a sweep point being measured now (host, pid); its mtime is a
                                heartbeat, so a claim whose holder died is taken over
  index/<segment>.parquet       the rows of many run dirs, with a manifest (.json) of which run
                                dirs at which (mtime, size): loading reads only what changed

Every file here is created whole (a unique name, or O_EXCL): nothing relies on many writers
appending to one file, or on file locks, which cluster filesystems do not all honour.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from perflab import files
from perflab.rows import RESULTS, Notes, concat, fix_dtypes, read_many
from perflab.rundir import RECORD, RunRecord

log = logging.getLogger("perflab")

META = ".perflab"
MAX_SEGMENTS = 8  # more index segments than this are merged into one on the next full load


def meta(root: Path) -> Path:
    return Path(root) / META


def check(root: Path) -> None:
    """The store and the folders perflab keeps in it can be written: before any work (a
    file where ``.perflab/done`` belongs would otherwise fail the job after it measured)."""
    files.check_dir("results.store", Path(root))
    for sub in ("done", "claims", "index"):
        files.check_dir("results.store", meta(root) / sub, shown=str(root))


# --- finding runs ---------------------------------------------------------------------------
#
# Symlinked folders are followed, by readers as by writers. A symlinked ``runs/`` (or
# ``.perflab/index``) is how people put results on another disk; the writers (Hydra making run
# dirs, the index writing segments) already go through it, so the readers go too: a reader that
# refused would hide every run written there. Each real folder is visited once (a link loop
# ends). A ``results.csv`` that is itself a symlink is never read: perflab writes real files, so
# a linked one is someone else's data (it could point anywhere, a password file included).

RESULTS_LINK = "skipped {n} symlinked results.csv (perflab writes real files; a link is not followed)"


def _walk(top: str | os.PathLike, notes: Notes | None = None) -> Iterator[tuple[str, dict[str, os.DirEntry]]]:
    """(run dir, its entries by name) for every run dir under ``top``: a folder holding run.json
    or results.csv. Hidden folders are skipped; a run dir's subfolders hold no runs."""
    stack, seen = [os.fspath(top)], set()
    while stack:
        here = stack.pop()
        try:
            st = os.stat(here)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = {e.name: e for e in os.scandir(here)}
        except OSError:
            continue
        if RECORD in entries or RESULTS in entries:
            results = entries.get(RESULTS)
            if results is not None and results.is_symlink():
                if notes is not None:
                    notes.add(RESULTS_LINK, results.path)
                entries.pop(RESULTS)
            yield here, entries
            continue
        stack += sorted(
            (e.path for e in entries.values() if not e.name.startswith(".") and _is_dir(e)),
            reverse=True,
        )


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # through a symlink too
    except OSError:
        return False


def run_dirs(top: Path, notes: Notes | None = None) -> Iterator[Path]:
    """Every run dir under ``top`` (see _walk), symlinked folders followed."""
    for here, _ in _walk(top, notes):
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


# --- done -----------------------------------------------------------------------------------


def mark_done(root: Path, record: RunRecord, run_dir: Path) -> None:
    """Say in the index that ``run_dir`` completed this config (after its run.json says so)."""
    folder = meta(root) / "done" / record.config_hash
    folder.mkdir(parents=True, exist_ok=True)
    files.write_atomic(folder / record.run_id, relative(root, run_dir) + "\n")


def find_done(root: Path, config_hash: str) -> Path | None:
    """The newest run dir whose run.json says it completed this config, or None.

    Looks in the done index (one listing); markers whose run dir is gone or no longer complete
    are dropped. A store without the index (deleted, or written by an older perflab) gets it
    rebuilt from the run dirs first.
    """
    done = meta(root) / "done"
    if not done.is_dir():
        rebuild_done(root)
    folder = done / config_hash
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
        if record and record.complete and record.config_hash == config_hash:
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


# --- claims ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """Who is measuring a point now (as its claim file says)."""

    host: str
    pid: int
    run_dir: str
    age_s: float  # seconds since its last heartbeat
    slurm_job: str = ""  # the SLURM job it ran in, if any
    path: str = ""  # the claim file
    unreadable: str = ""  # why the claim file says nothing (empty, not a claim, a directory)

    def __str__(self) -> str:
        if self.unreadable:
            return f"the claim file {self.path} ({self.unreadable}, {self.age_s:.0f} s old)"
        return f"{self.host}:{self.pid} ({self.run_dir}; claim file {self.path})"


# A claim file is written at once by the process that created it: one that still says nothing
# after this long never will (its writer died, or a full disk cut it short).
UNREADABLE_GRACE_S = 5.0


class Claim:
    """A held claim on a sweep point; a thread refreshes its mtime until ``release()``. A claim
    that another process took over (it thought this one gone) is left to that process."""

    def __init__(self, path: Path, body: bytes, beat_s: float) -> None:
        self.path, self.body, self._stop = path, body, threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(beat_s,), daemon=True, name="perflab-claim")
        self._thread.start()

    def _mine(self) -> bool:
        try:
            return self.path.read_bytes() == self.body
        except FileNotFoundError:
            return False
        except OSError:  # a passing read error (a network filesystem): still ours
            return True

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every) and self._mine():
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        self._stop.set()
        if self._mine():
            self.path.unlink(missing_ok=True)


def claim(root: Path, config_hash: str, run_dir: Path, stale_s: float) -> Claim | Holder:
    """Claim the point ``config_hash`` for this process, or say who holds it.

    A claim is taken over when its holder is gone: a dead pid on this host, no heartbeat for
    ``stale_s`` (a holder on another node that was killed), or an earlier run of this same
    SLURM job (requeued after a preemption or a node failure: SLURM ended that run).
    """
    folder = meta(root) / "claims"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{config_hash}.json"
    body = json.dumps(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_dir": str(run_dir),
            "since": time.time(),
            "slurm_job": os.environ.get("SLURM_JOB_ID", ""),
        }
    ).encode()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except (FileExistsError, IsADirectoryError):
            holder = _holder(path)
            if holder is None:  # gone between our try and our look
                continue
            if not _gone(holder, stale_s):
                return holder
            _take_over(path, holder)
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
        except OSError:  # a full disk, an I/O error: leave no empty claim behind for others to wait on
            path.unlink(missing_ok=True)
            raise
        return Claim(path, body, beat_s=max(1.0, min(30.0, stale_s / 4)))
    return _holder(path) or Holder("?", 0, "?", 0.0, path=str(path), unreadable="changing hands")


def requeued() -> bool:
    """This is a SLURM job's second or later run (SLURM requeued it)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0


def _holder(path: Path) -> Holder | None:
    """What the claim file at ``path`` says; None if there is none. A file that cannot be read
    as a claim (empty, garbage, a directory) is a Holder that says why, aged by its mtime."""
    try:
        age = time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return None
    except OSError as err:
        return Holder("?", 0, "?", 0.0, path=str(path), unreadable=err.strerror or str(err))
    if path.is_dir():
        return Holder("?", 0, "?", age, path=str(path), unreadable="a directory")
    try:
        data = json.loads(path.read_bytes())
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return Holder(
            str(data.get("host", "?")),
            int(data.get("pid", 0)),
            str(data.get("run_dir", "?")),
            age,
            str(data.get("slurm_job", "")),
            path=str(path),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as err:
        size = path.stat().st_size if path.exists() else 0
        why = "empty" if size == 0 else f"not a claim: {type(err).__name__}"
        return Holder("?", 0, "?", age, path=str(path), unreadable=why)


def _gone(holder: Holder, stale_s: float) -> bool:
    if holder.age_s > stale_s:
        return True
    if holder.unreadable:  # never a claim (a directory), or one that stayed unwritten
        return holder.unreadable == "a directory" or holder.age_s > min(stale_s, UNREADABLE_GRACE_S)
    if holder.slurm_job and holder.slurm_job == os.environ.get("SLURM_JOB_ID") and requeued():
        return True
    if holder.host != socket.gethostname():
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _take_over(path: Path, holder: Holder) -> None:
    """Move the dead holder's claim aside (only one of several takers can), then retry."""
    aside = path.with_name(f"{path.name}.gone-{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    moved = _holder(aside)
    if (
        moved is not None
        and not moved.unreadable
        and (moved.host, moved.pid, moved.run_dir) != (holder.host, holder.pid, holder.run_dir)
    ):
        # someone claimed it between our look and our move: put theirs back
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)
    log.info("perflab: took over %s%s", holder, "" if holder.unreadable else ": its holder stopped")


# --- the index ------------------------------------------------------------------------------


FORMAT = 2  # of an index segment; a segment of another format (another perflab version) is rebuilt
OTHER_FORMAT = "rebuilt {n} index segment{s} written by another perflab version"
DAMAGED = "rebuilt {n} damaged index segment{s}"


def _sources(root: Path, notes: Notes | None = None) -> dict[str, list[int]]:
    """Run dir (relative to ``root``) -> stamp: [mtime_ns, size] of its results.csv and of its
    run.json (0, 0 when it has none), so that a run that ends (run.json: running -> ok) is read
    again. The same walk as run_dirs(), on DirEntry stats (10k run dirs in a fraction of a second)."""
    top = os.fspath(root)
    found: dict[str, list[int]] = {}
    for here, entries in _walk(top, notes):
        results = entries.get(RESULTS)
        if results is None:
            continue
        try:
            st = results.stat()
            rec = entries[RECORD].stat() if RECORD in entries else None
        except OSError:
            continue
        stamp = [st.st_mtime_ns, st.st_size, rec.st_mtime_ns if rec else 0, rec.st_size if rec else 0]
        found[os.path.relpath(here, top)] = stamp
    return found


def _manifest(path: Path) -> tuple[dict[str, list[int]], dict[str, dict[str, int]]] | None:
    """The sources a segment's manifest lists, and what was skipped in them when they were
    read (so every later load still says it); None if it is not of this format (or damaged:
    ValueError, OSError); FileNotFoundError if it went meanwhile (a concurrent compaction)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("sources"), dict):
        return None
    noted = data.get("notes")
    return data["sources"], noted if isinstance(noted, dict) else {}


def load_tree(root: Path, experiment: str | None = None, notes: Notes | None = None):
    """Every row under the store ``root`` (optionally of one experiment), through the index.

    Run dirs whose results.csv (and run.json) have not changed since they were indexed come
    from the Parquet segments; new or changed ones are read from CSV and added as a new
    segment. A segment that is damaged or of another format is rebuilt from its run dirs and
    removed (``notes`` says so). If the index cannot be written (a read-only tree), loading
    still works, only slower. Every row gets ``run_outcome``: what its run's run.json says
    (``running``: killed, or not ended yet; empty: no run.json).
    """
    import pandas as pd

    notes = notes if notes is not None else Notes()
    root = Path(root)
    index = meta(root) / "index"
    sources = _sources(root, notes)
    indexed: dict[str, str] = {}  # source -> segment holding its current rows
    dropped: dict[str, str] = {}  # segment -> why it is rebuilt
    segments = sorted(index.glob("*.json")) if index.is_dir() else []
    noted: dict[str, dict[str, int]] = {}  # source -> what reading it skipped: said on every load
    for manifest in segments:
        try:
            found = _manifest(manifest)
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            found, dropped[manifest.stem] = None, DAMAGED
        if found is None:
            dropped.setdefault(manifest.stem, OTHER_FORMAT)
            continue
        stamps, skipped = found
        for source, stamp in stamps.items():
            if sources.get(source) == stamp:
                indexed[source] = manifest.stem
                noted[source] = skipped.get(source, {})
    frames = []
    wanted_by_segment: dict[str, set[str]] = {}
    for source, segment in indexed.items():
        wanted_by_segment.setdefault(segment, set()).add(source)
    for segment, wanted in wanted_by_segment.items():
        try:
            part = pd.read_parquet(
                index / f"{segment}.parquet", filters=[("experiment", "==", experiment)] if experiment else None
            )
            if "_source" not in part:
                raise ValueError("no _source column")
        except FileNotFoundError:  # removed by a concurrent compaction: read its run dirs
            part = None
        except Exception as err:  # damaged: pyarrow raises its own kinds
            log.debug("index segment %s unreadable (%s): reading its run dirs", segment, err)
            part, dropped[segment] = None, DAMAGED
        if part is None:
            for source in wanted:
                indexed.pop(source, None)
            continue
        frames.append(part[part["_source"].isin(wanted)])
    for source, kinds in noted.items():
        if source in indexed:
            for kind, count in kinds.items():
                notes.add(kind, _results_of(root, source), count)
    fresh = [s for s in sources if s not in indexed]
    if fresh:
        now = Notes()
        new = _read_sources(root, fresh, now)
        for kind, places in now.kinds.items():
            for place, count in places.items():
                notes.add(kind, place, count)
        skipped = {s: now.of(_results_of(root, s)) for s in fresh}
        if new.empty and any(skipped.values()):  # nothing but what was skipped: remember that much
            new = pd.DataFrame({"_source": [], "experiment": []}, dtype="string")
        if not new.empty or any(skipped.values()):
            _write_segment(index, new, {s: sources[s] for s in fresh}, {s: k for s, k in skipped.items() if k})
        if len(new):
            frames.append(new[new["experiment"] == experiment] if experiment and "experiment" in new else new)
    for segment, why in dropped.items():
        notes.add(why, index / f"{segment}.parquet")
        _remove_segment(index, segment)
    if not experiment and len(segments) - len(dropped) + bool(fresh) > MAX_SEGMENTS and frames:
        _compact(index, concat(frames), sources)
    if not frames:
        return pd.DataFrame()
    df = concat([f for f in frames if not f.empty] or frames)
    base = root.resolve()
    where = {s: str(Path(s) if Path(s).is_absolute() else base / s) for s in df["_source"].unique()}
    moved = df["_source"].map(where).rename("run_dir")  # where each run dir is now (trees move)
    return fix_dtypes(pd.concat([df.drop(columns=["_source", "run_dir"], errors="ignore"), moved], axis=1))


def _results_of(root: Path, source: str) -> Path:
    return (Path(source) if Path(source).is_absolute() else root / source) / RESULTS


def _read_sources(root: Path, sources: list[str], notes: Notes | None = None):
    """Rows of many run dirs, with a ``_source`` column (see rows.read_many) and each row's
    ``run_outcome`` from its run dir's run.json."""
    dirs = [Path(s) if Path(s).is_absolute() else root / s for s in sources]
    df = read_many([_results_of(root, s) for s in sources], labels=sources, column="_source", notes=notes)
    if not df.empty:
        records = {s: RunRecord.read(d) for s, d in zip(sources, dirs)}
        outcomes = {s: r.outcome if r else "" for s, r in records.items()}
        df["run_outcome"] = df["_source"].map(outcomes).astype("string")
    return df


def _write_segment(
    index: Path, df, stamps: dict[str, list[int]], noted: dict[str, dict[str, int]] | None = None
) -> None:
    """A new immutable segment and then its manifest (readers only trust segments with one)."""
    name = f"seg-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
    manifest = {"format": FORMAT, "sources": stamps, "notes": noted or {}}
    try:
        index.mkdir(parents=True, exist_ok=True)
        files.write_atomic(index / f"{name}.parquet", _to_parquet(df))
        files.write_atomic(index / f"{name}.json", json.dumps(manifest))
    except (OSError, ValueError, ImportError) as err:
        log.debug("results index not updated (%s); loading still works", err)


def _remove_segment(index: Path, segment: str) -> None:
    """A segment's files (or whatever sits where they belong: it is derived, and ours)."""
    for path in (index / f"{segment}.json", index / f"{segment}.parquet"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()


def _compact(index: Path, df, sources: dict[str, list[int]]) -> None:
    """One segment of every current row in place of the many; a reader that finds a segment
    gone meanwhile reads those run dirs from CSV instead."""
    old = sorted({p.name.split(".")[0] for p in index.glob("seg-*")})
    _write_segment(index, df, {s: sources[s] for s in set(df["_source"]) if s in sources})
    for segment in old:
        _remove_segment(index, segment)


def _to_parquet(df) -> bytes:
    """Parquet bytes; object columns that mix types (numbers in one run, text in another) become text."""
    import io

    import pandas as pd

    df = df.copy()
    for col in df.columns:
        if df[col].dtype == object and pd.api.types.infer_dtype(df[col], skipna=True) not in (
            "string",
            "boolean",
            "empty",
        ):
            df[col] = df[col].map(lambda v: None if v is None or (isinstance(v, float) and v != v) else str(v))
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()
