"""One job, from a composed config to rows on disk: the single path that the CLI (every point
of a sweep, on any launcher), ``perflab.run()`` and the tests all take.

  check     the typed config, the experiment, every output path        (no torch yet)
  skip?     in a sweep: the point (config, subject, process) is done already -> reuse its rows
  claim     in a sweep: this point is ours, or wait for whoever measures it; checked before and
            after each row and the done mark (fencing): taken over while this process was
            paused, what it measured is set aside and the taker's rows stand
  devices   resolve them; missing ones are an error or a ``skipped`` row  (perflab.job.runner: open)
  refute    the experiment's ``check`` against those devices (TF32 on a CPU), before run.json
            says "running"                                           (runner: run)
  run       the experiment; a crash, an OOM or a stop signal becomes a row  (runner: run)
  record    run.json says what came of it; a complete point is marked done  (runner: close)

A bad value is refused in one line: nothing is written for a single run; a sweep point
leaves an ``error`` row and the sweep goes on. Where a job runs and how it ends without
measuring (refused, reused, discarded): :mod:`perflab.job.ending`.
"""

from __future__ import annotations

import logging
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from perflab.config import install, registry
from perflab.config.schema import PerflabConfig, config_hash, resolve_all, validate
from perflab.errors import ConfigError
from perflab.job import processes
from perflab.job.ending import Place, Result, record_time, refuse, reuse, save_record
from perflab.measure.peaks import Peaks
from perflab.store import done_marks, files, point_claims, tree
from perflab.store.rows import flatten
from perflab.store.rundir import TAKEN_OVER, RunRecord, folder_id, rows_of, set_aside_earlier_run

log = logging.getLogger("perflab")


def new_run_id(run_dir: Path | None = None) -> str:
    """Unique across machines and trees: the time, the id its folder is found by (so that the
    run id ``perflab results`` shows names its folder: ``20261124-111316-4ecf12b7-05a3c1e9`` is
    in ``runs/2026-11-24_11-13-16_4ecf12b7``), then 32 random bits (a requeued job runs again in
    the same folder); without such a folder, 48 random bits."""
    stamp = f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    folder = folder_id(run_dir) if run_dir is not None else ""
    return f"{stamp}-{folder}-{secrets.token_hex(4)}" if folder else f"{stamp}-{secrets.token_hex(6)}"


def execute(cfg: DictConfig, place: Place) -> Result:
    """Run one job (see the module docstring); never raises for a user mistake or a crash."""
    run_id = new_run_id(place.run_dir)
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
        process=processes.index(),
    )
    identity = {
        "run_id": run_id,
        "sweep_id": record.sweep_id,
        "job_num": place.job_num,
        "experiment": place.experiment,
        "config_hash": record.config_hash,
        "rank": 0,
        "process": record.process,
        "run_dir": str(place.run_dir),
        **flatten(resolved),
    }
    try:
        check_overrides(place.overrides)
    except ConfigError as err:
        refusal = err
    if point_claims.requeued() and not place.helper:  # SLURM runs this job again: its earlier run wrote here
        earlier = RunRecord.read(place.run_dir)
        if earlier is not None and earlier.complete:  # it finished before SLURM requeued it
            log.info("perflab: this point was complete before SLURM requeued it: %s", place.run_dir)
            return Result(earlier.outcome, place.run_dir, rows_of(place.run_dir).to_dict("records"))
        moved = set_aside_earlier_run(place.run_dir)
        if moved is not None:
            log.info("perflab: SLURM requeued this job; its earlier run is in %s", moved)
    taken = occupied(cfg, place)
    if taken:  # a run is there already: nothing is written into it, not even a row saying so
        return Result("refused", place.run_dir, [], taken)
    if refusal is not None:
        return refuse(refusal, place, record, identity)
    try:
        settings, experiment, peaks = check(cfg)
    except ConfigError as err:
        return refuse(err, place, record, identity)
    root = Path(settings.results.store)

    claim = None
    fenced = place.in_sweep and not settings.results.redo and not place.helper
    while True:
        if fenced:
            got = claim_or_error(root, record, place, settings)
            if not isinstance(got, point_claims.HeldClaim):
                return got
            claim = got
        try:
            from perflab.job import runner  # torch from here on

            return runner.GuardedJob(settings, experiment, peaks, place, record, identity, claim).go()
        except point_claims.TakenOver as lost:  # paused past claim_stale_s: the taker's rows stand
            if not fenced:
                raise
            moved = set_aside_earlier_run(place.run_dir, TAKEN_OVER)
            aside = f"; what it measured here is set aside in {moved}" if moved else ""
            log.warning("perflab: %s%s", lost, aside)
            record.outcome, record.complete, record.error = "running", False, ""
        finally:
            if claim is not None:
                claim.release()
                claim = None


def occupied(cfg: DictConfig, place: Place) -> str:
    """Why this job's folder cannot take a new run (tree.check_run_dir's line), or '': Hydra's
    callback refused such a folder before Hydra wrote it; this finds what only the job's own
    folder shows (two points of a sweep given one ``hydra.sweep.subdir``)."""
    if place.helper:  # a further node's task shares its job dir with task 0, which records
        return ""
    try:
        store = Path(str(OmegaConf.select(cfg, "results.store", throw_on_resolution_failure=True)))
        key = "hydra.sweep.subdir" if place.in_sweep else "hydra.run.dir"
        tree.check_run_dir(key, place.run_dir, store)
    except ConfigError as err:
        return err.line()
    except OmegaConfBaseException:  # a store that does not resolve: refused by the checks next, in their words
        return ""
    return ""


def claim_or_error(
    root: Path, record: RunRecord, place: Place, settings: PerflabConfig
) -> point_claims.HeldClaim | Result:
    """This sweep point claimed, or the job's end: reused (done before, or by the sweep we waited
    for), or an error where the claim cannot be written (a full disk, an I/O error)."""
    try:
        got = claim_point(root, record, place, settings)
    except OSError as err:
        line = f"cannot claim this point: {files.os_line(err)}"
        log.error("perflab: %s", line)
        record.outcome, record.error, record.finished = "error", line, record_time()
        save_record(record, place)
        return Result("error", place.run_dir, [], line)
    return reuse(got, place, record) if isinstance(got, Path) else got


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
    tree.check(Path(settings.results.store))
    if settings.results.ledger:
        from perflab.store import ledger

        ledger.check(Path(settings.results.ledger))
    if settings.trainer is not None:
        files.check_dir("trainer.checkpoint_dir", Path(settings.trainer.checkpoint_dir))
    peaks_path = Path(settings.results.peaks) if settings.results.peaks else None
    peaks = Peaks.open(peaks_path, will_write=experiment.hooks.WRITES_PEAKS)
    return settings, experiment, peaks


def claim_point(root: Path, record: RunRecord, place: Place, settings: PerflabConfig) -> point_claims.HeldClaim | Path:
    """This sweep point, claimed; or the run dir that completed it (before, or while we waited
    for another sweep that was measuring it)."""
    from perflab.measure.environment import model_contents, subject

    said = False
    record.subject = subject(settings.results.subject)["subject"]  # a new commit is a new point
    record.model_digest = model_contents(settings.model).get("model_digest", "")  # so is a rewritten folder
    key = done_marks.key_of(record)
    while True:
        done = done_marks.find_done(root, key)
        if done is not None:
            return done
        got = point_claims.claim(root, key, place.run_dir, settings.results.claim_stale_s)
        if isinstance(got, point_claims.HeldClaim):
            if done_marks.find_done(root, key) is None:  # not completed just before our claim
                return got
            got.release()
            continue
        if not said:
            stale = settings.results.claim_stale_s
            if got.unreadable:
                wait = min(stale, point_claims.UNREADABLE_GRACE_S) - got.age_s
                log.info("perflab: waiting: %s says nothing yet; taken over in %.0f s if it still does not", got, wait)
            else:
                log.info(
                    "perflab: waiting: %s is measuring this very point (taken over after "
                    "results.claim_stale_s=%g s without its heartbeat: in %.0f s if it beats no more)",
                    got,
                    stale,
                    max(0.0, stale - got.age_s),
                )
            said = True
        time.sleep(min(5.0, settings.results.claim_stale_s / 10))
