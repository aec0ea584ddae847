"""The command line: ``python -m perflab +experiment=NAME [key=value ...]`` (Hydra app).

Flow of one job: compose the config (Hydra) -> check it (schema) -> resolve devices ->
run experiments/<name>.py -> rows written as they come -> a short table at the end.
User mistakes become one line on stderr and exit code 2; a crash inside an experiment
becomes an ``error``/``oom`` row, its traceback goes to the job log, and the exit code is 1.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import shutil
import sys
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from perflab import registry
from perflab.context import Context
from perflab.devices import Resolved, resolve
from perflab.environment import environment
from perflab.errors import ConfigError, MissingDevice, one_line
from perflab.results import RESULTS, ResultsWriter, flatten, summary_table
from perflab.schema import validate

log = logging.getLogger("perflab")
_failed_jobs = 0  # jobs whose experiment crashed (error/oom rows): exit code 1
_bad_jobs = 0  # jobs refused for a bad config value (one line each): exit code 2


def main() -> None:
    # Let composition errors reach us instead of Hydra's multi-line report, so that a
    # user mistake is one line and exit code 2 (real bugs still show a full traceback).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    OmegaConf.register_new_resolver("perflab_uid", lambda: secrets.token_hex(3), use_cache=True, replace=True)
    registry.register_configs()
    app = hydra.main(config_path=str(registry.config_dir()), config_name="config", version_base="1.3")(run_job)
    try:
        app()
    except (ConfigError, HydraException, OmegaConfBaseException) as err:
        print(f"perflab: error: {one_line(err)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("perflab: interrupted; rows already finished are saved", file=sys.stderr)
        sys.exit(130)
    if _bad_jobs:
        sys.exit(2)
    if _failed_jobs:
        sys.exit(1)


def run_job(cfg: DictConfig) -> None:
    """One Hydra job (one point of a sweep)."""
    global _failed_jobs, _bad_jobs
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    if OmegaConf.is_missing(cfg.experiment, "name"):
        _discard(out_dir)
        print(registry.listing())
        return
    skip_reason = ""
    try:
        settings = validate(cfg)
        experiment = registry.discover().get(settings.experiment.name)
        if experiment is None:
            raise ConfigError("experiment.name", settings.experiment.name, ", ".join(registry.discover()))
        try:
            resolved = resolve(settings.devices)
        except MissingDevice as missing:
            if settings.devices.on_missing != "skip":
                raise
            resolved, skip_reason = Resolved([]), missing.line()
    except ConfigError as err:
        # Reported here, not raised: Hydra would add lines of its own, and a sweep goes on.
        _bad_jobs += 1
        _discard(out_dir)
        print(f"perflab: error: {err.line()}", file=sys.stderr)
        return

    ledger = Path(settings.results.ledger) if settings.results.ledger else None
    writer = ResultsWriter(out_dir, ledger, samples=settings.results.samples)
    ctx = Context(settings, resolved, writer, _base_row(cfg, hc, out_dir, resolved))
    log.info("perflab %s on %s -> %s", settings.experiment.name, ", ".join(resolved.names) or "-", out_dir)
    try:
        if skip_reason:
            ctx.skip("job", skip_reason)
        else:
            _seed(settings.seed)
            experiment.module.run(ctx)
    except ConfigError as err:  # a check only the experiment can make (e.g. sizes vs devices)
        _bad_jobs += 1
        if not writer.rows:
            _discard(out_dir)
        print(f"perflab: error: {err.line()}", file=sys.stderr)
    except Exception as exc:  # a crash is a row, not a lost job
        _failed_jobs += 1
        status = "oom" if isinstance(exc, torch.OutOfMemoryError) else "error"
        log.debug("job failed", exc_info=True)
        _log_traceback(out_dir, exc)
        ctx.record("job", status=status, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        if writer.rows and settings.results.table:
            log.info("\n%s\n\nrows: %s%s", summary_table(writer.rows), out_dir / RESULTS,
                     f" (ledger: {ledger})" if ledger else "")


def _base_row(cfg: DictConfig, hc, out_dir: Path, resolved: Resolved) -> dict:
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_id = Path(hc.sweep.dir).name if multirun else ""
    run_id = f"{sweep_id}/{hc.job.num}" if multirun else out_dir.name
    resolved_cfg = OmegaConf.to_container(cfg, resolve=True)
    return {
        "run_id": run_id,
        "sweep_id": sweep_id,
        "job_num": hc.job.num if multirun else 0,
        "experiment": hc.runtime.choices.get("experiment") or cfg.experiment.name,  # the preset's name
        "rank": 0,
        "fallback": resolved.fallback,
        **environment(),
        "run_dir": str(out_dir),
        **flatten(resolved_cfg),
    }


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _log_traceback(out_dir: Path, exc: BaseException) -> None:
    import traceback

    text = "".join(traceback.format_exception(exc))
    (out_dir / "error.txt").write_text(text)
    log.error("%s: %s (traceback: %s)", type(exc).__name__, exc, out_dir / "error.txt")


def _discard(out_dir: Path) -> None:
    """Remove the run dir Hydra made for a job that wrote nothing, so no empty run misleads."""
    if out_dir.is_dir() and not (out_dir / RESULTS).exists():
        shutil.rmtree(out_dir, ignore_errors=True)
