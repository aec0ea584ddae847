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
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from perflab import files
from perflab.rows import RESULTS, fix_dtypes, read_many
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


def run_dirs(top: Path) -> Iterator[Path]:
    """Every run dir under ``top`` (a dir holding run.json or results.csv); hidden dirs skipped."""
    stack = [Path(top)]
    while stack:
        here = stack.pop()
        try:
            entries = list(os.scandir(here))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        names = {e.name for e in entries}
        if RECORD in names or RESULTS in names:
            yield here
            continue  # a run dir's subfolders (.hydra, workers, traces) hold no runs
        stack += sorted(
            (Path(e.path) for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")),
            reverse=True,
        )


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
    """Who is measuring a point now."""

    host: str
    pid: int
    run_dir: str
    age_s: float  # seconds since its last heartbeat
    slurm_job: str = ""  # the SLURM job it ran in, if any

    def __str__(self) -> str:
        return f"{self.host}:{self.pid} ({self.run_dir})"


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
        except FileExistsError:
            holder = _holder(path)
            if holder is None or not _gone(holder, stale_s):
                return holder or Holder("?", 0, "?", 0.0)
            _take_over(path, holder)
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        return Claim(path, body, beat_s=max(1.0, min(30.0, stale_s / 4)))
    return _holder(path) or Holder("?", 0, "?", 0.0)


def requeued() -> bool:
    """This is a SLURM job's second or later run (SLURM requeued it)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0


def _holder(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text())
        age = time.time() - path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return Holder(
        str(data.get("host", "?")),
        int(data.get("pid", 0)),
        str(data.get("run_dir", "?")),
        age,
        str(data.get("slurm_job", "")),
    )


def _gone(holder: Holder, stale_s: float) -> bool:
    if holder.age_s > stale_s:
        return True
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
    if moved is not None and (moved.host, moved.pid, moved.run_dir) != (holder.host, holder.pid, holder.run_dir):
        # someone claimed it between our look and our move: put theirs back
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    aside.unlink(missing_ok=True)
    log.info("took over the claim of %s: it stopped", holder)


# --- the index ------------------------------------------------------------------------------


def _sources(root: Path) -> dict[str, list[int]]:
    """Run dir (relative to ``root``) -> [mtime_ns, size] of its results.csv: the same walk as
    run_dirs(), on plain strings and DirEntry stats (10k run dirs in a fraction of a second)."""
    top = os.path.abspath(root)
    found: dict[str, list[int]] = {}
    stack = [top]
    while stack:
        here = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        results = next((e for e in entries if e.name == RESULTS), None)
        if results is not None or any(e.name == RECORD for e in entries):
            if results is not None:
                st = results.stat()
                found[os.path.relpath(here, top)] = [st.st_mtime_ns, st.st_size]
            continue
        stack += [e.path for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    return found


def load_tree(root: Path, experiment: str | None = None):
    """Every row under the store ``root`` (optionally of one experiment), through the index.

    Run dirs whose results.csv has not changed since they were indexed come from the Parquet
    segments; new or changed ones are read from CSV and added as a new segment. If the index
    cannot be written (a read-only tree), loading still works, only slower.
    """
    import pandas as pd

    root = Path(root)
    index = meta(root) / "index"
    sources = _sources(root)
    indexed: dict[str, str] = {}  # source -> segment holding its current rows
    segments = sorted(index.glob("*.json")) if index.is_dir() else []
    for manifest in segments:
        try:
            stamps = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        for source, stamp in stamps.items():
            if sources.get(source) == stamp:
                indexed[source] = manifest.stem
    frames = []
    wanted_by_segment: dict[str, set[str]] = {}
    for source, segment in indexed.items():
        wanted_by_segment.setdefault(segment, set()).add(source)
    for segment, wanted in wanted_by_segment.items():
        try:
            part = pd.read_parquet(
                index / f"{segment}.parquet", filters=[("experiment", "==", experiment)] if experiment else None
            )
        except (OSError, ValueError) as err:  # a segment removed by a concurrent compaction, or damaged
            log.debug("index segment %s unreadable (%s): reading its run dirs", segment, err)
            for source in wanted:
                indexed.pop(source, None)
            continue
        frames.append(part[part["_source"].isin(wanted)])
    fresh = [s for s in sources if s not in indexed]
    if fresh:
        new = _read_sources(root, fresh)
        if not new.empty:
            _write_segment(index, new, {s: sources[s] for s in fresh})
            frames.append(new[new["experiment"] == experiment] if experiment and "experiment" in new else new)
    if not experiment and len(segments) + bool(fresh) > MAX_SEGMENTS and frames:
        _compact(index, pd.concat(frames, ignore_index=True, sort=False), sources)
    if not frames:
        return pd.DataFrame()
    df = pd.concat([f for f in frames if not f.empty] or frames, ignore_index=True, sort=False)
    base = root.resolve()
    where = {s: str(Path(s) if Path(s).is_absolute() else base / s) for s in df["_source"].unique()}
    moved = df["_source"].map(where).rename("run_dir")  # where each run dir is now (trees move)
    return fix_dtypes(pd.concat([df.drop(columns=["_source", "run_dir"], errors="ignore"), moved], axis=1))


def _read_sources(root: Path, sources: list[str]):
    """Rows of many run dirs, with a ``_source`` column; see rows.read_many."""
    paths = [(Path(s) if Path(s).is_absolute() else root / s) / RESULTS for s in sources]
    return read_many(paths, labels=sources, column="_source")


def _write_segment(index: Path, df, stamps: dict[str, list[int]]) -> None:
    """A new immutable segment and then its manifest (readers only trust segments with one)."""
    name = f"seg-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
    try:
        index.mkdir(parents=True, exist_ok=True)
        files.write_atomic(index / f"{name}.parquet", _to_parquet(df))
        files.write_atomic(index / f"{name}.json", json.dumps(stamps))
    except (OSError, ValueError, ImportError) as err:
        log.debug("results index not updated (%s); loading still works", err)


def _compact(index: Path, df, sources: dict[str, list[int]]) -> None:
    """One segment of every current row in place of the many; a reader that finds a segment
    gone meanwhile reads those run dirs from CSV instead."""
    old = sorted(index.glob("seg-*"))
    _write_segment(index, df, {s: sources[s] for s in set(df["_source"]) if s in sources})
    for path in old:
        path.unlink(missing_ok=True)


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
