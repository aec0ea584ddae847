"""The command line: ``python -m perflab +experiment=NAME [key=value ...]`` (Hydra app).

Flow of one job: compose the config (Hydra) -> check it (schema) -> resolve devices ->
skip it if the ledger has this exact config done -> run experiments/<name>.py -> rows
written as they come -> a short table. A user mistake is one line on stderr (exit code 2
for a single run; an ``error`` row in a sweep, which goes on). A crash inside an experiment
becomes an ``error``/``oom`` row, its traceback goes to ``error.txt``, and the exit code is 1.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import shutil
import sys
import traceback
from collections import Counter
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from perflab import registry, sweep
from perflab.context import Context
from perflab.devices import Resolved, resolve
from perflab.environment import environment
from perflab.errors import ConfigError, MissingDevice, first_line, one_line
from perflab.results import RESULTS, ResultsWriter, flatten, summary_table
from perflab.schema import config_hash, validate

log = logging.getLogger("perflab")
_outcomes: Counter = Counter()  # this process's jobs, for a single run's exit code


def main() -> None:
    # Let composition errors reach us instead of Hydra's multi-line report, so that a
    # user mistake is one line and exit code 2 (real bugs still show a full traceback).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    OmegaConf.register_new_resolver("perflab_uid", lambda: secrets.token_hex(3), use_cache=True, replace=True)
    registry.register_configs()
    sweep.last_tally = None
    _outcomes.clear()
    app = hydra.main(config_path=str(registry.config_dir()), config_name="config", version_base="1.3")(run_job)
    try:
        app()
    except (ConfigError, HydraException, OmegaConfBaseException) as err:
        print(f"perflab: error: {one_line(err)}", file=sys.stderr)
        sys.exit(2)
    except ValueError as err:
        if not _raised_by_hydra(err):
            raise
        print(f"perflab: error: {err}", file=sys.stderr)  # a misuse of Hydra's own flags
        sys.exit(2)
    except KeyboardInterrupt:
        print("perflab: interrupted; rows already finished are saved", file=sys.stderr)
        sys.exit(130)
    sys.exit(sweep.exit_code(sweep.last_tally if sweep.last_tally is not None else _outcomes))


def run_job(cfg: DictConfig) -> None:
    """One Hydra job (one point of a sweep)."""
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    in_sweep = hc.mode == RunMode.MULTIRUN
    if OmegaConf.is_missing(cfg.experiment, "name"):
        _discard(out_dir)
        print(registry.listing())
        return
    base = _base_row(cfg, hc, out_dir)
    try:
        settings = validate(cfg)
        experiment = registry.discover().get(settings.experiment.name)
        if experiment is None:
            raise ConfigError("experiment.name", settings.experiment.name, ", ".join(registry.discover()))
        resolved, skip_reason = _resolve_devices(settings, in_sweep)
        beside = _parallel_jobs(hc, resolved)
    except ConfigError as err:
        _refuse(err, out_dir, base, in_sweep)
        return

    ledger = Path(settings.results.ledger) if settings.results.ledger else None
    # A sweep re-run skips the points the ledger has; a single run always measures again.
    done = sweep.completed_run(ledger, base["config_hash"]) if in_sweep and not settings.results.redo else None
    if done:
        print(f"perflab: already done in run {done} (results.redo=true runs it again)")
        _finish(out_dir, "done", in_sweep)
        return

    writer = ResultsWriter(out_dir, ledger, samples=settings.results.samples)
    ctx = Context(settings, resolved, writer, {**base, "fallback": resolved.fallback, "beside": beside})
    log.info("perflab %s on %s -> %s", base["experiment"], ", ".join(resolved.names) or "-", out_dir)
    outcome = "ok"
    try:
        if skip_reason:
            ctx.skip("job", skip_reason)
            outcome = "skipped"
        else:
            _seed(settings.seed)
            experiment.module.run(ctx)
    except ConfigError as err:  # a check only the experiment can make (e.g. batch vs devices)
        _refuse(err, out_dir, ctx.base_row, in_sweep, writer)
        return
    except Exception as exc:  # a crash is a row, not a lost job
        outcome = "oom" if isinstance(exc, torch.OutOfMemoryError) else "error"
        (out_dir / "error.txt").write_text("".join(traceback.format_exception(exc)))
        log.error("%s: %s (traceback: %s)", type(exc).__name__, exc, out_dir / "error.txt")
        ctx.record("job", status=outcome, error=f"{type(exc).__name__}: {first_line(exc)}")
    finally:
        rows = writer.rows
        if rows and settings.results.table:
            log.info("\n%s\n\nrows: %s%s", summary_table(rows), out_dir / RESULTS,
                     f" (ledger: {ledger})" if ledger else "")
    _finish(out_dir, outcome, in_sweep)


def _resolve_devices(settings, in_sweep: bool) -> tuple[Resolved, str]:
    """Devices, or (no devices, the reason) when missing devices should become a skipped row."""
    try:
        return resolve(settings.devices), ""
    except MissingDevice as missing:
        skip = settings.devices.on_missing == "skip" or (settings.devices.on_missing == "auto" and in_sweep)
        if not skip:
            raise
        return Resolved([]), missing.line()


def _parallel_jobs(hc, resolved: Resolved) -> str:
    """With a launcher that runs jobs side by side, say so in every row; never share a GPU."""
    launcher = str(hc.launcher.get("_target_", ""))
    n_jobs = hc.launcher.get("n_jobs", 1)
    if "joblib" not in launcher.lower() or n_jobs == 1:
        return ""
    if any(d.type != "cpu" for d in resolved.devices):
        raise ConfigError("hydra/launcher", "joblib", "hydra.launcher.n_jobs=1, the basic launcher or "
                          "+launcher=slurm for GPU sweeps", problem="parallel local jobs would share the GPUs")
    log.warning("jobs run %s at a time on this machine: their timings disturb each other", n_jobs)
    return f"up to {n_jobs} jobs at once (joblib): timings disturbed"


def _refuse(err: ConfigError, out_dir: Path, base: dict, in_sweep: bool, writer: ResultsWriter | None = None) -> None:
    """A bad value: one line. In a sweep the point also leaves an ``error`` row, and the sweep goes on."""
    print(f"perflab: error: {err.line()}", file=sys.stderr)
    if in_sweep:
        ledger = base.get("cfg.results.ledger")
        writer = writer or ResultsWriter(out_dir, Path(ledger) if ledger else None, samples=False)
        writer.add({**base, "measurement": "job", "status": "error", "error": err.line()})
    elif writer is None or not writer.rows:
        _discard(out_dir)
    _finish(out_dir, "refused", in_sweep)


def _finish(out_dir: Path, outcome: str, in_sweep: bool) -> None:
    _outcomes[outcome] += 1
    if in_sweep:
        sweep.write_outcome(out_dir, outcome)
    elif outcome == "done":
        _discard(out_dir)


def _base_row(cfg: DictConfig, hc, out_dir: Path) -> dict:
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_id = Path(hc.sweep.dir).name if multirun else ""
    resolved_cfg = OmegaConf.to_container(cfg, resolve=True)
    return {
        "run_id": f"{sweep_id}/{hc.job.num}" if multirun else out_dir.name,
        "sweep_id": sweep_id,
        "job_num": hc.job.num if multirun else 0,
        "experiment": hc.runtime.choices.get("experiment") or cfg.experiment.name,  # the preset's name
        "config_hash": config_hash(resolved_cfg),
        "rank": 0,
        **environment(),
        "run_dir": str(out_dir),
        **flatten(resolved_cfg),
    }


def _raised_by_hydra(err: BaseException) -> bool:
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{os.sep}hydra{os.sep}" in frames[-1].filename


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _discard(out_dir: Path) -> None:
    """Remove the run dir Hydra made for a job that wrote nothing, so no empty run misleads."""
    if out_dir.is_dir() and not (out_dir / RESULTS).exists():
        shutil.rmtree(out_dir, ignore_errors=True)
