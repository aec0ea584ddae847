"""How a job ends, below the two halves that run it (:mod:`perflab.job.execute`, the path, and
:mod:`perflab.job.runner`, the torch half): where it runs (:class:`Place`), what came of it
(:class:`Result`), and the endings that measure nothing -- refused (a bad value), reused (done
before), discarded (nothing written) -- with ``run.json`` saved so that no record is ever left
saying "running".
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perflab.config.session import CURRENT
from perflab.errors import ConfigError
from perflab.store import files
from perflab.store.outcome import exit_code
from perflab.store.rows import RESULTS
from perflab.store.rundir import EARLIER_RUNS, RECORD, RunRecord, RunWriter, rows_of

log = logging.getLogger("perflab")


@dataclass(frozen=True)
class Place:
    """Where a job runs and as what: its folder and, in a sweep, the sweep and its number."""

    run_dir: Path
    experiment: str  # the preset's name (train, lenet_scratch, ...), as rows call it
    sweep_dir: Path | None = None
    job_num: int = 0
    parallel_jobs: int = 1  # a launcher running this many jobs side by side on this machine
    overrides: tuple[str, ...] = ()
    helper: bool = False  # a further task of a multi-node SLURM job: it runs workers, task 0 records

    @property
    def in_sweep(self) -> bool:
        return self.sweep_dir is not None


@dataclass
class Result:
    outcome: str
    run_dir: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    @property
    def exit_code(self) -> int:
        return exit_code(self.outcome)


def refuse(
    err: ConfigError, place: Place, record: RunRecord, identity: dict[str, Any], writer: RunWriter | None = None
) -> Result:
    """A bad value: one line. In a sweep the point also leaves an ``error`` row and its record."""
    line = err.line()
    log.debug("refused: %s", line)
    if place.helper:  # a node without rank 0: the node with it says so, in the job dir they share
        return Result("refused", place.run_dir, [], line)
    record.outcome, record.error, record.finished = "refused", line, record_time()
    if place.in_sweep:
        writer = writer or RunWriter(place.run_dir, samples=False)
        try:
            writer.add({**identity, "measurement": "job", "status": "error", "error": line})
        except OSError as err:
            log.error("perflab: %s (its row could not be written: %s)", line, files.os_line(err))
        record.rows = len(writer.rows)
        save_record(record, place)
    elif writer is not None and writer.rows:
        record.rows = len(writer.rows)
        save_record(record, place)
    else:
        discard(place.run_dir, also_record=True)  # a refusal that wrote nothing leaves no run
    return Result("refused", place.run_dir, writer.rows if writer else [], line)


def reuse(source: Path, place: Place, record: RunRecord) -> Result:
    """This point was measured already, completely, in ``source``: its rows stand for it."""
    log.info("perflab: already done in %s (results.redo=true measures it again)", source)
    record.outcome, record.complete, record.same_as, record.finished = "done", False, str(source), record_time()
    save_record(record, place)
    return Result("done", place.run_dir, rows_of(source).to_dict("records"))


def save_record(record: RunRecord, place: Place) -> None:
    """The run's record, or, where even that cannot be written (a full disk), one line and no
    record at all: never one left saying "running". The sweep's summary still counts the point."""
    try:
        record.save(place.run_dir)
    except OSError as err:
        log.error("perflab: %s: its run.json could not be written (%s)", place.run_dir, files.os_line(err))
        with contextlib.suppress(OSError):
            (place.run_dir / RECORD).unlink(missing_ok=True)
        session = CURRENT.get()
        if session is not None:
            session.unsaved[place.run_dir.name] = record


def record_time() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# What a job that wrote nothing leaves in its folder: Hydra's record of it, its log, its record;
# and folders wholly its own: its worker processes' logs (Context.launch_workers: a node of a
# multi-node run whose workers hold no rank 0 records nothing, and leaves nothing).
MADE = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "perflab.log", RECORD)
MADE_FOLDERS = ("workers",)


def discard(run_dir: Path, also_record: bool = False) -> None:
    """Remove the folder of a job that wrote nothing, so no empty run misleads (its record
    alone where the folder also keeps the runs of a requeued SLURM job: .requeued/). Only what
    the job made goes (:data:`MADE`): a user's file in a folder they named stays, and its folder."""
    nothing = not (run_dir / RESULTS).exists() and (also_record or not (run_dir / RECORD).exists())
    if (run_dir / EARLIER_RUNS).is_dir():
        if nothing:
            (run_dir / RECORD).unlink(missing_ok=True)
    elif run_dir.is_dir() and nothing:
        for name in MADE_FOLDERS:
            made = run_dir / name
            if made.is_dir() and not made.is_symlink():  # a link itself is the user's: never followed
                shutil.rmtree(made, ignore_errors=True)
        files.remove_made(run_dir, MADE)
