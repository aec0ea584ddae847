"""One job, from a composed config to rows on disk: the single path that the CLI (every point
of a sweep, on any launcher), ``perflab.run()`` and the tests all take.

  check     the typed config, the experiment, every output path        (no torch yet)
  skip?     in a sweep: the point is done already (its run.json says so) -> reuse its rows
  claim     in a sweep: this point is ours, or wait for whoever measures it
  devices   resolve them; missing ones are an error or a ``skipped`` row
  refute    the experiment's ``check`` against those devices (TF32 on a CPU), before run.json
            says "running"
  run       the experiment; a crash, an OOM or a stop signal becomes a row  (perflab.guard)
  record    run.json says what came of it; a complete point is marked done

A bad value is refused in one line: nothing is written for a single run; a sweep point
leaves an ``error`` row and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import logging
import random
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence, cast

from omegaconf import DictConfig, OmegaConf

from perflab import files, install, registry, store
from perflab.errors import ConfigError
from perflab.peaks import Peaks
from perflab.rows import RESULTS, flatten
from perflab.rundir import EARLIER_RUNS, RECORD, RunRecord, RunWriter, rows_of, set_aside_earlier_run
from perflab.schema import PerflabConfig, config_hash, resolve_all, validate
from perflab.session import CURRENT

log = logging.getLogger("perflab")

# The single run's exit code for each outcome (a sweep's is decided over all its points).
EXIT_CODES = {
    "ok": 0,
    "done": 0,
    "skipped": 0,
    "refused": 2,
    "error": 1,
    "oom": 1,
    "timeout": 1,
    "cancelled": 130,
    "running": 1,
}


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
        return EXIT_CODES.get(self.outcome, 1)


def new_run_id() -> str:
    """Unique across machines and trees: the time, then 48 random bits."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(6)}"


def execute(cfg: DictConfig, place: Place) -> Result:
    """Run one job (see the module docstring); never raises for a user mistake or a crash."""
    run_id = new_run_id()
    try:
        resolved, refusal = resolve_all(cfg), None
    except ConfigError as err:  # refused below, once there is a record to say so
        resolved, refusal = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=False)), err
    record = RunRecord(
        run_id=run_id,
        experiment=place.experiment,
        config_hash=config_hash(resolved),
        sweep_id=place.sweep_dir.name if place.sweep_dir else "",
        job_num=place.job_num,
    )
    identity = {
        "run_id": run_id,
        "sweep_id": record.sweep_id,
        "job_num": place.job_num,
        "experiment": place.experiment,
        "config_hash": record.config_hash,
        "rank": 0,
        "run_dir": str(place.run_dir),
        **flatten(resolved),
    }
    try:
        check_overrides(place.overrides)
    except ConfigError as err:
        refusal = err
    if store.requeued() and not place.helper:  # SLURM runs this job again: its earlier run wrote here
        earlier = RunRecord.read(place.run_dir)
        if earlier is not None and earlier.complete:  # it finished before SLURM requeued it
            log.info("perflab: this point was complete before SLURM requeued it: %s", place.run_dir)
            return Result(earlier.outcome, place.run_dir, rows_of(place.run_dir).to_dict("records"))
        moved = set_aside_earlier_run(place.run_dir)
        if moved is not None:
            log.info("perflab: SLURM requeued this job; its earlier run is in %s", moved)
    if refusal is not None:
        return refuse(refusal, place, record, identity)
    try:
        settings, experiment, peaks = check(cfg)
    except ConfigError as err:
        return refuse(err, place, record, identity)
    root = Path(settings.results.store)

    claim = None
    if place.in_sweep and not settings.results.redo and not place.helper:
        try:
            got = claim_point(root, record, place, settings)
        except OSError as err:  # a full disk, an I/O error: this point cannot be claimed, nor measured
            line = f"cannot claim this point: {files.os_line(err)}"
            log.error("perflab: %s", line)
            record.outcome, record.error, record.finished = "error", line, record_time()
            save_record(record, place)
            return Result("error", place.run_dir, [], line)
        if isinstance(got, Path):
            return reuse(got, place, record)
        claim = got
    try:
        from perflab import guard  # torch from here on

        return guard.run(settings, experiment, peaks, place, record, identity)
    finally:
        if claim is not None:
            claim.release()


def check_overrides(overrides: Sequence[str]) -> None:
    """What the command line alone can refute."""
    renamed = next((o for o in overrides if o.lstrip("+~").startswith("experiment.name=")), None)
    if renamed is not None:  # the preset's keys would then be checked against another experiment's
        raise ConfigError(
            "experiment.name",
            renamed.partition("=")[2],
            "the preset's own; choose the experiment with +experiment=NAME",
        )


def check_values(cfg: DictConfig) -> tuple[PerflabConfig, registry.Experiment]:
    """The typed config and its experiment: everything the schema alone can refute (no path
    is touched, no device looked at). A sweep checks every point with it before running any."""
    resolve_all(cfg)
    name = cfg.experiment.get("name") if "experiment" in cfg else None
    if name not in registry.names():
        raise ConfigError("experiment", name, ", ".join(registry.choices()), problem="unknown experiment")
    experiment = registry.get(str(name))
    return validate(cfg, experiment.hooks.Config), experiment


def check(cfg: DictConfig) -> tuple[PerflabConfig, registry.Experiment, Peaks]:
    """The typed config, its experiment, and every path the job will write: before any work."""
    install.check_torch_pair()
    settings, experiment = check_values(cfg)
    store.check(Path(settings.results.store))
    if settings.results.ledger:
        from perflab import ledger

        ledger.check(Path(settings.results.ledger))
    if settings.trainer is not None:
        files.check_dir("trainer.checkpoint_dir", Path(settings.trainer.checkpoint_dir))
    peaks_path = Path(settings.results.peaks) if settings.results.peaks else None
    peaks = Peaks.open(peaks_path, will_write=experiment.writes_peaks)
    return settings, experiment, peaks


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


def claim_point(root: Path, record: RunRecord, place: Place, settings: PerflabConfig) -> store.Claim | Path:
    """This sweep point, claimed; or the run dir that completed it (before, or while we waited
    for another sweep that was measuring it)."""
    said = False
    while True:
        done = store.find_done(root, record.config_hash)
        if done is not None:
            return done
        got = store.claim(root, record.config_hash, place.run_dir, settings.results.claim_stale_s)
        if isinstance(got, store.Claim):
            if store.find_done(root, record.config_hash) is None:  # not completed just before our claim
                return got
            got.release()
            continue
        if not said:
            stale = settings.results.claim_stale_s
            if got.unreadable:
                wait = min(stale, store.UNREADABLE_GRACE_S) - got.age_s
                log.info("perflab: waiting: %s says nothing yet; taken over in %.0f s if it still does not", got, wait)
            else:
                log.info(
                    "perflab: waiting: %s is measuring this very point (taken over after "
                    "results.claim_stale_s=%g s without its heartbeat)",
                    got,
                    stale,
                )
            said = True
        time.sleep(min(5.0, settings.results.claim_stale_s / 10))


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


def discard(run_dir: Path, also_record: bool = False) -> None:
    """Remove the folder of a job that wrote nothing, so no empty run misleads (its record
    alone where the folder also keeps the runs of a requeued SLURM job: .requeued/)."""
    nothing = not (run_dir / RESULTS).exists() and (also_record or not (run_dir / "run.json").exists())
    if (run_dir / EARLIER_RUNS).is_dir():
        if nothing:
            (run_dir / "run.json").unlink(missing_ok=True)
    elif run_dir.is_dir() and nothing:
        shutil.rmtree(run_dir, ignore_errors=True)


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
