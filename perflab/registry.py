"""Finds experiments (one module each in the ``experiments`` package) and registers their
typed configs with Hydra's ConfigStore, so ``+experiment=NAME`` composes a checked schema."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType

from hydra.core.config_store import ConfigStore

import experiments
from perflab.schema import ExperimentConfig, PerflabConfig


@dataclass(frozen=True)
class Experiment:
    name: str
    module: ModuleType


def config_dir() -> Path:
    """The installed ``perflab.conf`` package, else ``conf/`` of a source checkout."""
    try:
        path = Path(str(resources.files("perflab.conf")))
        if (path / "config.yaml").is_file():
            return path
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent / "conf"


def presets() -> dict[str, str]:
    """``+experiment=`` choices (conf/experiment/*.yaml) with the first line of their comment."""
    found = {}
    for path in sorted((config_dir() / "experiment").glob("*.yaml")):
        comments = [line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#")]
        found[path.stem] = next((c for c in comments if c and not c.startswith("@package")), "")
    return found


@functools.cache
def discover() -> dict[str, Experiment]:
    """Every ``experiments/<name>.py`` with a ``Config`` and a ``run(ctx)``; ``_private`` ones skipped."""
    found = {}
    for info in sorted(pkgutil.iter_modules(experiments.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"experiments.{info.name}")
        if not (hasattr(module, "run") and issubclass(getattr(module, "Config", object), ExperimentConfig)):
            raise TypeError(f"experiments/{info.name}.py needs a Config(ExperimentConfig) and run(ctx)")
        found[info.name] = Experiment(info.name, module)
    return found


def register_configs() -> None:
    """Root schema as ``perflab_schema``; each experiment's as ``schema/experiment/<name>``."""
    cs = ConfigStore.instance()
    cs.store(name="perflab_schema", node=PerflabConfig)
    for exp in discover().values():
        cs.store(group="schema/experiment", name=exp.name, node=exp.module.Config)


def listing() -> str:
    choices = presets()
    width = max(map(len, choices), default=0)
    lines = ["perflab: choose an experiment with +experiment=NAME", ""]
    lines += [f"  {name.ljust(width)}  {summary}" for name, summary in choices.items()]
    lines += [
        "",
        "Examples:",
        "  python -m perflab +experiment=auto_parallel",
        "  python -m perflab +experiment=matmul --cfg job      # show every key and its value",
        "  python -m perflab -m +experiment=matmul experiment.size=64,128   # a sweep",
        "  python -m perflab +experiment=train strategy=ddp devices.count=2 trainer.epochs=2",
    ]
    return "\n".join(lines)
