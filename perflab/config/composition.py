"""Composing a job's config: Hydra's and perflab's resolvers, every experiment's schema, our
launcher, then ``+experiment=NAME`` plus overrides composed into one config and its run dir.
The command line (:mod:`perflab.app`), ``perflab.run()`` (:mod:`perflab.api`) and the SLURM
launcher (``hydra_plugins/perflab_slurm``) all compose through here, and turn its mistakes into
the same one line.
"""

from __future__ import annotations

import os
import re
import secrets
import traceback
from dataclasses import fields
from pathlib import Path
from typing import Sequence

from perflab.config import registry
from perflab.config.schema import OPTIONAL_SECTIONS, PerflabConfig
from perflab.errors import ConfigError, KeyOnly, Refused, did_you_mean, one_line, preset_named_like
from perflab.store import files


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
    """The job config for ``+experiment=NAME`` plus ``overrides``, and its run dir; every
    mistake (in a value, a key, a preset, a config dir, an experiment's module) is a Refused."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    try:  # before Hydra: an experiment that does not register, a config dir, no experiment at all
        if not isinstance(experiment, str) or not experiment.strip():
            said = "no experiment named" if not experiment else f"a {type(experiment).__name__}, not a name"
            raise ConfigError("experiment", experiment, experiments_allowed(), problem=said)
        register()
        registry.check_chosen(experiment)
        check_search_path(overrides)
    except ConfigError as err:
        raise Refused(err.line()) from None
    try:
        with initialize_config_dir(str(registry.config_dir()), version_base="1.3", job_name="perflab"):
            cfg = hydra_compose("config", overrides=[f"+experiment={experiment}", *overrides], return_hydra_config=True)
        run_dir = Path(str(cfg.hydra.run.dir))
        choice = cfg.hydra.runtime.choices.get("experiment")
    except composing_errors() as err:
        if not users_mistake(err):
            raise
        raise Refused(absent_section(experiment, overrides) or explain(err, overrides)) from None
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.set_readonly(cfg, False)
    return cfg, run_dir, choice


def composing_errors() -> tuple[type[BaseException], ...]:
    """What composing raises for a user's mistake, if :func:`users_mistake` says so; everything
    else is a bug, a traceback."""
    import yaml
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return (ConfigError, HydraException, OmegaConfBaseException, yaml.YAMLError, AssertionError)


def users_mistake(err: BaseException) -> bool:
    """One of :func:`composing_errors` that a user's config made: an AssertionError only when
    OmegaConf's own (:func:`raised_by_omegaconf`), a YAML error only when Hydra was reading a
    config file (not one the job itself reads)."""
    if isinstance(err, AssertionError):
        return raised_by_omegaconf(err)
    if type(err).__module__.startswith("yaml"):
        frames = traceback.extract_tb(err.__traceback__)
        callers = [f.filename for f in frames if f"{os.sep}yaml{os.sep}" not in f.filename]
        return bool(callers) and any(f"{os.sep}{lib}{os.sep}" in callers[-1] for lib in ("hydra", "omegaconf"))
    return True


def experiments_allowed() -> str:
    """What ``+experiment=`` takes, as the end of a line."""
    return f"{', '.join(registry.choices())} (and quick/NAME)"


# --- the user's config dirs -----------------------------------------------------------------


def config_dirs(overrides: Sequence[str]) -> list[Path] | None:
    """The folders of ``hydra.searchpath=[file://...]`` (``--config-dir`` reaches here as one);
    None when the search path holds what cannot be listed here (``pkg://``)."""
    found = []
    for arg in overrides:
        key, _, value = arg.lstrip("+~").partition("=")
        if key == "hydra.searchpath":
            for entry in value.strip("[]").split(","):
                if not entry.strip().startswith("file://"):
                    return None
                found.append(Path(entry.strip().removeprefix("file://")))
    return found


def check_search_path(overrides: Sequence[str]) -> None:
    """The user's config dirs, before Hydra reads them: each one is a folder, and none of its
    presets is named like an experiment or one of perflab's presets (Hydra would recurse into
    one that lists itself, or use perflab's in its place) or lists itself through others."""
    dirs = config_dirs(overrides) or []
    for folder in dirs:
        if not folder.is_dir():
            raise KeyOnly(
                f"config dir {folder}",
                folder,
                "a folder of presets, FOLDER/experiment/NAME.yaml (--config-dir FOLDER or hydra.searchpath=[file://FOLDER])",
                problem="no such folder" if not folder.exists() else "not a folder",
            )
    if not dirs:
        return
    ours = registry.config_dir() / "experiment"
    taken = set(registry.choices()) | {p.relative_to(ours).with_suffix("").as_posix() for p in ours.rglob("*.yaml")}
    for folder in dirs:  # Hydra reads these: a FIFO would block it, a device never end
        for path in sorted(folder.rglob("*.yaml")):
            kind = files.not_regular(path)
            if kind is not None:
                raise KeyOnly(str(path), path.name, "a YAML file (a preset or a config group's option)", f"{kind}")
            try:  # Hydra reads it as UTF-8: anything else is its traceback
                files.read_text(path)
            except UnicodeDecodeError as err:
                problem = f"not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start})"
                raise KeyOnly(str(path), path.name, "a YAML file in UTF-8 (save it as UTF-8)", problem) from None
            except OSError as err:
                raise KeyOnly(str(path), path.name, "a YAML file perflab can read", files.os_line(err)) from None
    found: dict[str, Path] = {}
    for folder in dirs:
        for path in sorted((folder / "experiment").rglob("*.yaml")):
            name = path.relative_to(folder / "experiment").with_suffix("").as_posix()
            if name in taken:
                problem, allowed = preset_named_like(name, experiment=name in registry.declared())
                raise KeyOnly(str(path), name, allowed, problem)
            found.setdefault(name, path)  # the first folder's, as Hydra finds it
    lists = {name: _defaults(path, name) for name, path in found.items()}
    for name, path in found.items():
        loop = _loop(name, lists)
        if loop:
            raise KeyOnly(
                str(path),
                name,
                "defaults lists that never lead back (a preset's starts with its experiment: - NAME)",
                problem=f"its defaults list comes back to it: {' -> '.join(loop)}",
            )


def _defaults(path: Path, name: str) -> list[str]:
    """The presets of the experiment group a preset's defaults list names (``- rmsnorm``,
    ``- /experiment/quick/matmul``), by name; [] for a file that does not load (Hydra says
    what is wrong with it when it is used)."""
    import yaml

    try:
        data = yaml.safe_load(files.read_text(path))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    entries = data.get("defaults") if isinstance(data, dict) else None
    group = name.rpartition("/")[0]
    found = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, str) or entry.strip() == "_self_":
            continue
        entry = entry.partition("@")[0].strip()
        if entry.startswith("/"):
            if entry.startswith("/experiment/"):
                found.append(entry.removeprefix("/experiment/"))
        else:
            found.append(f"{group}/{entry}" if group else entry)
    return found


def _loop(start: str, lists: dict[str, list[str]]) -> list[str] | None:
    """The names from ``start`` back to it through the presets' defaults lists, or None."""
    todo, seen = [[start]], {start}
    while todo:
        path = todo.pop()
        for name in lists.get(path[-1], []):
            if name == start:
                return [*path, name]
            if name in lists and name not in seen:
                seen.add(name)
                todo.append([*path, name])
    return None


# --- a composing mistake as one line ----------------------------------------------------------


def explain(err: BaseException, overrides: Sequence[str]) -> str:
    """The one line for a mistake Hydra or OmegaConf raised while composing: :func:`one_line`,
    with a config file named by its path (``In 'experiment/mine'`` -> the file), a preset
    that names an experiment not installed here, and a preset without its package header."""
    line = one_line(err)
    inside = re.match(r"In '([^']+)': ", line)
    path = _config_file(inside.group(1), config_dirs(overrides) or []) if inside else None
    if inside is None or path is None:
        return line
    where, said = f"In {path}", line[inside.end() :]
    gone = re.match(r"Could not load 'experiment/([^']+)'", said)
    if gone:
        name = gone.group(1)
        package = _declaring_package(name, path)
        hint = f" (pip install -e {package} declares it)" if package else did_you_mean(name, registry.choices())
        hint = hint or " (pip install the package that declares it)"
        return (
            f"{where}: its defaults list names {name}, and experiment {name} is not installed here{hint}; "
            f"allowed: an installed experiment or preset: {experiments_allowed()}"
        )
    top = re.match(r"experiment\.(\w+): unknown key", said)
    if top and top.group(1) in PERFLAB_KEYS and _header(path).get("package") != "_global_":
        return (
            f"{where}: no `# @package _global_` first line, so its {top.group(1)}: went under experiment: "
            f"({said.partition(';')[0]}); allowed: `# @package _global_` as the first line of a preset that "
            "sets experiment.NAME, bench.NAME ... (docs/bring-your-own.md)"
        )
    return f"{where}: {said}"


# The keys at the top of a job's config (a preset without its header puts them under experiment).
PERFLAB_KEYS = ("defaults", *(f.name for f in fields(PerflabConfig)))


def _config_file(config: str, dirs: Sequence[Path]) -> Path | None:
    """The file Hydra read for ``experiment/NAME``: the user's, or perflab's own."""
    return next((p for d in (*dirs, registry.config_dir()) if (p := d / f"{config}.yaml").is_file()), None)


def _header(path: Path) -> dict:
    """A config file's header (``# @package _global_``), read as Hydra reads it."""
    from hydra.plugins.config_source import ConfigSource

    try:
        return ConfigSource._get_header_dict(files.read_text(path))
    except (OSError, ValueError):
        return {}


def _declaring_package(name: str, preset: Path) -> str | None:
    """The folder of the package beside a preset whose pyproject.toml declares experiment
    ``name`` (examples/userpkg for examples/userpkg/conf/experiment/rmsnorm_llm.yaml), if any."""
    import tomllib

    for folder in list(preset.resolve().parents)[:4]:
        try:
            project = tomllib.loads(files.read_text(folder / "pyproject.toml")).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if name in project.get("entry-points", {}).get(registry.GROUP, {}):
            relative = os.path.relpath(folder)
            return folder.as_posix() if relative.startswith("..") else relative
    return None


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
    overrides = dict(a.lstrip("+").split("=", 1) for a in args if "=" in a)
    key = next((k for k in ("hydra.run.dir", "hydra.sweep.dir", "results.store") if k in overrides), "results.store")
    value = overrides.get(key, "outputs")
    try:
        files.check_dir(key, Path(value))
    except ConfigError as found:
        return found.line()
    what = err.filename or f"the run's folder under {value}"
    return f"{key}={value}: cannot write {what} ({err.strerror}); allowed: a folder you can write to"
