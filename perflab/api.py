"""The Python way in: ``perflab.run("matmul", ["experiment.size=512"])`` runs one job exactly
as ``perflab +experiment=matmul experiment.size=512`` does and returns its rows.

>>> import perflab
>>> df = perflab.run("quick/matmul")
>>> df[["measurement", "median_s", "tflops"]]
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import traceback
from pathlib import Path
from typing import Iterator, Sequence

from perflab import registry
from perflab.errors import ConfigError, Refused, one_line
from perflab.logs import LogFile
from perflab.schema import OPTIONAL_SECTIONS

log = logging.getLogger("perflab")


def register() -> None:
    """What composing needs: Hydra's resolvers, ours, every experiment's schema, our launcher."""
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf

    setup_globals()
    _find_our_hydra_plugins()
    OmegaConf.register_new_resolver("perflab_uid", new_uid, use_cache=True, replace=True)
    registry.register_configs()


def new_uid() -> str:
    """The random end of a run or sweep folder's name; the command remembers it, so that a folder
    Hydra made before failing (a full disk) can be found and removed."""
    from perflab.session import CURRENT

    uid = secrets.token_hex(4)
    session = CURRENT.get()
    if session is not None:
        session.uids.append(uid)
    return uid


def _find_our_hydra_plugins() -> None:
    """Hydra finds launchers by listing the ``hydra_plugins`` namespace with pkgutil. From a
    wheel ours is there; from an editable install (pip install -e) setuptools' import hook
    serves it but pkgutil cannot list it, so the source folder joins the namespace's path."""
    import hydra_plugins

    source = Path(__file__).resolve().parent.parent / "hydra_plugins"
    if (source / "perflab_slurm").is_dir() and str(source) not in list(hydra_plugins.__path__):
        hydra_plugins.__path__.append(str(source))


def compose(experiment: str, overrides: Sequence[str] = ()):
    """The job config for ``+experiment=NAME`` plus ``overrides``, and its run dir."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    register()
    try:
        with initialize_config_dir(str(registry.config_dir()), version_base="1.3", job_name="perflab"):
            cfg = hydra_compose("config", overrides=[f"+experiment={experiment}", *overrides], return_hydra_config=True)
        run_dir = Path(str(cfg.hydra.run.dir))
        choice = cfg.hydra.runtime.choices.get("experiment")
    except (ConfigError, HydraException, OmegaConfBaseException, AssertionError) as err:
        if isinstance(err, AssertionError) and not raised_by_omegaconf(err):
            raise
        raise Refused(absent_section(experiment, overrides) or one_line(err)) from None
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.set_readonly(cfg, False)
    return cfg, run_dir, choice


def absent_section(experiment: str, overrides: Sequence[str]) -> str | None:
    """The line for an override under ``model``/``data``/``strategy``/``trainer`` given to an
    experiment that has no such section (OmegaConf fails on it with a bare assertion or an
    odd type error), or None when that is not what went wrong. Composes once more with
    nothing but the experiment to see which sections it really has (the other overrides may be
    a sweep's ``a,b`` lists, which a plain compose refuses): only on the error path."""
    from hydra.core.global_hydra import GlobalHydra

    touched = [o for o in overrides if _section(o) in OPTIONAL_SECTIONS]
    if not touched:
        return None
    GlobalHydra.instance().clear()  # a failed hydra.main may leave it initialized
    try:
        cfg, _, _ = compose(experiment, [])
    except Refused:
        return None
    for override in touched:
        if cfg.get(_section(override)) is None:
            key, _, value = override.lstrip("+~").partition("=")
            return (
                f"{key}={value}: the {experiment} experiment has no {_section(override)} keys; allowed: "
                f"the keys `perflab +experiment={experiment} --help` lists"
            )
    return None


def _section(override: str) -> str:
    return override.lstrip("+~").partition("=")[0].split(".")[0]


def raised_by_omegaconf(err: BaseException) -> bool:
    """An assertion of OmegaConf's own (a bare one on a key under a section that is None), not
    one of ours or a plugin's, which must stay a traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{os.sep}omegaconf{os.sep}" in frames[-1].filename


def run(experiment: str, overrides: Sequence[str] = (), *, sweep_dir: str | Path | None = None, job_num: int = 0):
    """Run one job and return its rows as a pandas DataFrame.

    ``experiment`` is a preset name (``matmul``, ``quick/train``, ``lenet_scratch`` ...);
    ``overrides`` are the command line's ``key=value`` items. The rows are also on disk, in
    the run dir (``df.attrs["run_dir"]``), like any run's. A bad value raises
    :class:`perflab.errors.Refused` with the one-line reason; a crash inside the experiment
    is an ``error`` row, as on the command line (``df.attrs["outcome"]`` says what came of it).

    ``sweep_dir``: run the job as point ``job_num`` of that sweep dir (``<sweep_dir>/<job_num>``),
    as a ``-m`` sweep runs its points: a point completed before (same config) is reused, not
    measured again (``outcome`` ``done``), and a point being measured elsewhere is waited for.
    """
    import pandas as pd

    from perflab.app import experiment_name
    from perflab.job import Place, check_overrides, check_values, execute
    from perflab.results import load
    from perflab.rows import RESULTS

    cfg, run_dir, choice = compose(experiment, overrides)
    try:  # what the schema refutes, before the run dir (placed by results.store) is made
        check_overrides(overrides)
        check_values(cfg)
    except ConfigError as err:
        raise Refused(err.line()) from None
    point = Path(sweep_dir) if sweep_dir is not None else None
    place = Place(
        run_dir=point / str(job_num) if point else run_dir,
        experiment=experiment_name(choice, cfg),
        overrides=tuple(overrides),
        sweep_dir=point,
        job_num=job_num if point else 0,
    )
    run_dir = place.run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        from perflab.app import output_error

        raise Refused(output_error(err, [f"results.store={cfg.results.store}", *overrides])) from None
    _save_config(cfg, overrides, run_dir)
    with _job_log(run_dir):
        result = execute(cfg, place)
    if result.outcome == "refused":
        raise Refused(result.error)
    found = (run_dir / RESULTS).is_file() or result.outcome == "done"  # a reused point: the rows it stands on
    df = load(run_dir) if found else pd.DataFrame()  # typed as load() types them
    df.attrs.update(outcome=result.outcome, run_dir=str(run_dir))
    return df


def _save_config(cfg, overrides: Sequence[str], run_dir: Path) -> None:
    """``.hydra/config.yaml`` and ``overrides.yaml``, as a CLI run leaves them."""
    from omegaconf import OmegaConf

    folder = run_dir / ".hydra"
    folder.mkdir(exist_ok=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), folder / "overrides.yaml")


@contextlib.contextmanager
def _job_log(run_dir: Path) -> Iterator[None]:
    """The job's messages to ``<run dir>/perflab.log``, and to stdout if nothing else shows them."""
    handlers: list[logging.Handler] = [LogFile(run_dir / "perflab.log")]
    handlers[0].setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    if not logging.getLogger().handlers:
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(logging.Formatter("%(message)s"))
        handlers.append(console)
    level = log.level
    log.setLevel(logging.INFO)
    for h in handlers:
        log.addHandler(h)
    try:
        yield
    finally:
        for h in handlers:
            log.removeHandler(h)
            h.close()
        log.setLevel(level)
