"""One job's run directory, the unit of truth: its rows, raw samples and completion record.

``results.csv``   every row so far, rewritten atomically after each row (a crash keeps them);
``samples.csv``   every raw sample, appended (a torn line is skipped on reading);
``run.json``      the completion record: which config (hash), what came of it, complete or
                  not, when and where. "Done" anywhere in perflab means: this file says so.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, get_origin, get_type_hints

from perflab.store import files
from perflab.store.layout import RECORD as RECORD  # the tree's names, said once there
from perflab.store.rows import RESULTS, SAMPLE_COLUMNS, SAMPLES, csv_text, read_csv

# ok: ran; done: an identical point had run (same_as says where); skipped: nothing could run
# here; refused: a bad value; error / oom / cancelled / timeout: it stopped; running: it has not
# ended (or was killed without a word).


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")  # runs in one second still sort


@dataclass
class RunRecord:
    """``run.json``: what a job was and what came of it."""

    run_id: str
    experiment: str
    config_hash: str
    outcome: str = "running"
    complete: bool = False  # every part ran to its end (ok); only then is the point "done"
    sweep_id: str = ""
    job_num: int = 0
    started: str = field(default_factory=now)
    finished: str = ""
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    rows: int = 0
    error: str = ""
    same_as: str = ""  # outcome "done": the run dir whose rows this point reuses
    where: dict[str, str] = field(default_factory=dict)  # e.g. SLURM job id, node, log file
    subject: str = ""  # the code under test (results.subject: a tag, or the working directory's git commit)
    process: int = 1  # which of bench.processes' fresh processes (1..K)
    model_digest: str = ""  # a model folder's contents (environment.model_contents): rewritten, a new point
    perflab_version: str = ""

    def save(self, run_dir: Path) -> None:
        """Write run.json at once; on a full disk, over the earlier record in place (its blocks
        are already there), so that a run that could not end its record is never left at
        "running". Raises OSError if neither works."""
        data = json.dumps(asdict(self), indent=1) + "\n"
        try:
            files.write_atomic(run_dir / RECORD, data)
        except OSError as err:
            if err.errno not in files.FULL or not (run_dir / RECORD).is_file():
                raise
            files.rewrite_in_place(run_dir / RECORD, data.encode())

    @classmethod
    def read(cls, run_dir: Path) -> "RunRecord | None":
        """The record, or None if there is none (or it is unreadable: then the run is not done)."""
        try:
            data = files.read_json(run_dir / RECORD)  # a FIFO there blocks no reader
            known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            record = cls(**known)
        except (OSError, ValueError, TypeError, AttributeError):  # AttributeError: not an object
            return None
        wrong = [k for k, t in _field_types().items() if not isinstance(getattr(record, k), t)]
        return None if wrong else record


FOLDER_ID = re.compile(r"_([0-9a-f]{8})$")  # the random end of a run or sweep folder's name (composition.new_uid)


def folder_id(run_dir: Path) -> str:
    """The id a run's folder is found by: the random end of its name (``2026-11-23_12-27-14_e7c42e06``
    -> ``e7c42e06``), a sweep job's as its sweep's and its number (``…_8b5b2c5c/1`` -> ``8b5b2c5c.1``);
    "" for a folder named otherwise (``hydra.run.dir=mine``)."""
    found = FOLDER_ID.search(run_dir.name)
    if found:
        return found.group(1)
    parent = FOLDER_ID.search(run_dir.parent.name)
    return f"{parent.group(1)}.{run_dir.name}" if parent and run_dir.name.isdigit() else ""


@functools.cache
def _field_types() -> dict[str, type]:
    """Each RunRecord field's type (``dict`` for ``dict[str, str]``): worked out once, not per
    run.json read (get_type_hints took most of the time a listing of 10k runs spent reading them)."""
    return {k: get_origin(t) or t for k, t in get_type_hints(RunRecord).items()}


EARLIER_RUNS = ".requeued"  # hidden: loaders skip it
TAKEN_OVER = ".taken-over"  # hidden: what a paused holder measured of a point another took over


def set_aside_earlier_run(run_dir: Path, folder: str = EARLIER_RUNS) -> Path | None:
    """SLURM runs a job it requeued (preempted, its node lost) again in the job dir its earlier
    run wrote: move that run's files to ``<run dir>/.requeued/<its run id>/`` so the dir holds
    one run, whose rows alone are the point's. Returns where they went (None: nothing there).
    ``folder=TAKEN_OVER``: the rows of a run whose point another process took over."""
    there = [run_dir / name for name in (RECORD, RESULTS, SAMPLES, "error.txt") if (run_dir / name).exists()]
    if not there:
        return None
    record = RunRecord.read(run_dir)
    dest = run_dir / folder / (record.run_id if record else f"unknown-{os.getpid()}")
    dest.mkdir(parents=True, exist_ok=True)
    for path in there:
        os.replace(path, dest / path.name)
    return dest


def overrides_of(run_dir: Path) -> list[str]:
    """The command line's overrides of a run (``.hydra/overrides.yaml``), as typed: read as
    plain YAML, since OmegaConf would resolve a ``${...}`` in them."""
    import yaml

    try:
        items = yaml.safe_load(files.read_regular(run_dir / ".hydra" / "overrides.yaml")) or []
    except (OSError, ValueError):
        return []
    return [str(o) for o in items] if isinstance(items, list) else []


class RunWriter:
    """Writes one job's rows: each ``add`` rewrites ``results.csv`` atomically, appends the raw
    samples, and (if a ledger is set) appends the row there too.

    Rows are kept in memory; the file is read again only if another process wrote it since our
    last write (a DDP job's rank 0 writes from its own process).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        ledger: Path | None = None,
        samples: bool = True,
        fence: Callable[[], None] | None = None,
    ) -> None:
        self.run_dir, self.ledger, self.keep_samples = Path(run_dir), ledger, samples
        self.fence = fence  # a sweep point's claim check (point_claims.HeldClaim.fence): before and after each row
        self._rows: list[dict[str, Any]] = []
        self._stamp: tuple[int, int] | None = None  # (mtime_ns, size) of our last write

    @property
    def rows(self) -> list[dict[str, Any]]:
        path = self.run_dir / RESULTS
        stamp = _stamp(path)
        if stamp != self._stamp:
            self._rows = read_csv(path, text=True).to_dict("records") if stamp else []
            self._stamp = stamp
        return self._rows

    def add(
        self, row: Mapping[str, Any], samples: Sequence[float] = (), warmup: Sequence[float] = ()
    ) -> dict[str, Any]:
        """Store ``row``; its ``row_id`` is ``<run_id>#<n>``, n counting the run dir's rows (unique in it)."""
        if self.fence is not None:
            self.fence()
        rows = self.rows
        row = {"row_id": f"{row['run_id']}#{len(rows) + 1}", **row}
        rows.append(row)
        path = self.run_dir / RESULTS
        try:
            files.write_atomic(path, csv_text(rows))
        except OSError:
            rows.pop()  # not on disk: not a row of this run
            raise
        self._stamp = _stamp(path)
        if self.fence is not None:  # lost while writing: the row is set aside with the run's others
            self.fence()
        if self.keep_samples and (samples or warmup):
            keys = [row[k] for k in ("row_id", "run_id", "experiment", "measurement")]
            lines = [[*keys, "warmup", i, t] for i, t in enumerate(warmup)]
            lines += [[*keys, "sample", i, t] for i, t in enumerate(samples)]
            files.append_text(
                self.run_dir / SAMPLES,
                csv_text([dict(zip(SAMPLE_COLUMNS, x)) for x in lines], SAMPLE_COLUMNS, header=False),
                header=",".join(SAMPLE_COLUMNS) + "\n",
            )
        if self.ledger is not None:
            from perflab.store import ledger

            ledger.append(self.ledger, [row])
        return row


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def rows_of(run_dir: Path, text: bool = False):
    """A run dir's rows as a DataFrame (empty if none); ``text``: every cell as the text it is
    (read_csv), which is faster where only a few cells are looked at."""
    import pandas as pd

    path = run_dir / RESULTS
    return read_csv(path, text=text) if path.is_file() else pd.DataFrame()
