"""Finds experiments (one module each in the ``experiments`` package) and registers their
typed configs with Hydra's ConfigStore, so ``+experiment=NAME`` composes a checked schema."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType

from hydra.core.config_store import ConfigStore

import experiments
from perflab.schema import ExperimentConfig, PerflabConfig


@dataclass(frozen=True)
class Experiment:
    name: str
    module: ModuleType

    @property
    def summary(self) -> str:
        return (self.module.__doc__ or "").strip().splitlines()[0] if self.module.__doc__ else ""


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
    exps = discover()
    width = max(map(len, exps), default=0)
    lines = ["perflab: choose an experiment with +experiment=NAME", ""]
    lines += [f"  {name.ljust(width)}  {exp.summary}" for name, exp in exps.items()]
    first = next(iter(exps), "matmul")
    lines += [
        "",
        "Examples:",
        "  python -m perflab +experiment=auto_parallel",
        f"  python -m perflab +experiment={first} --cfg job       # show every key and its value",
        "  python -m perflab -m +experiment=matmul experiment.size=64,128   # a sweep",
    ]
    return "\n".join(lines)
