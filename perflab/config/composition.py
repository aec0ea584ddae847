"""Composing a job's config: Hydra's and perflab's resolvers, every experiment's schema, our
launcher, then ``+experiment=NAME`` plus overrides composed into one config and its run dir.
The command line (:mod:`perflab.app`), ``perflab.run()`` (:mod:`perflab.api`) and the SLURM
launcher (``hydra_plugins/perflab_slurm``) all compose through here, and turn its mistakes into
the same one line.
"""

from __future__ import annotations

import os
import secrets
import traceback
from pathlib import Path
from typing import Sequence

from perflab.config import registry
from perflab.config.schema import OPTIONAL_SECTIONS
from perflab.errors import ConfigError, Refused, one_line


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
    from perflab.config.session import CURRENT

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

    source = Path(__file__).resolve().parents[2] / "hydra_plugins"
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


def experiment_name(choice: str | None, cfg) -> str:
    """What rows call the experiment: the preset chosen (``quick/`` variants under their own name)."""
    return str(choice or cfg.experiment.name).removeprefix("quick/")


def output_error(err: OSError, args: Sequence[str]) -> str:
    """One line for an output folder that cannot be made, naming the key that placed it there."""
    from perflab.store import files

    overrides = dict(a.lstrip("+").split("=", 1) for a in args if "=" in a)
    key = next((k for k in ("hydra.run.dir", "hydra.sweep.dir", "results.store") if k in overrides), "results.store")
    value = overrides.get(key, "outputs")
    try:
        files.check_dir(key, Path(value))
    except ConfigError as found:
        return found.line()
    what = err.filename or f"the run's folder under {value}"
    return f"{key}={value}: cannot write {what} ({err.strerror}); allowed: a folder you can write to"
