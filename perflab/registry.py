"""Finds experiments (one module each in ``perflab.experiments``) and registers their typed
configs with Hydra's ConfigStore, so ``+experiment=NAME`` composes a checked schema.

An experiment module imports no torch at its top (torch is imported inside ``run`` and its
helpers), so composing and checking a config never waits for torch. It provides:

  Config(ExperimentConfig)   its knobs, typed, with range checks in ``__post_init__``
  run(ctx)                   the work: ctx.measure / ctx.record / ctx.skip
  check(settings, devices)   optional: refuse what only the resolved devices can refute
                             (TF32 on a CPU, a batch the devices cannot split), before the
                             job is recorded as running
  METRIC                     optional: compare's default metric ("median_s" if absent)
  WRITES_PEAKS               optional: True if it saves measured peaks (results.peaks)
  headline(rows) -> [str]    optional: the figures that matter, printed under the job's table
  progress(row) -> str|None  optional: its own line as each row is recorded
  label(row) -> str          optional: how its table names a row (training: "epoch 3")
  SUMMARY_ROWS, BESIDE       optional: the measurements compare uses by default, and the
                             columns it shows beside the metric (training: test_acc)
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

from perflab.schema import ExperimentConfig, PerflabConfig

PACKAGE = "perflab.experiments"


@dataclass(frozen=True)
class Experiment:
    name: str
    module: ModuleType

    @property
    def writes_peaks(self) -> bool:
        return bool(getattr(self.module, "WRITES_PEAKS", False))

    @property
    def metric(self) -> str:
        return getattr(self.module, "METRIC", "median_s")

    def label(self, row: Mapping[str, Any]) -> str:
        """How the job's table names a row (default: its measurement)."""
        fn = getattr(self.module, "label", None)
        return str(fn(row)) if fn else str(row.get("measurement", ""))

    def check(self, settings: PerflabConfig, devices: Sequence[Any]) -> None:
        """Raise ConfigError for a config these devices cannot run; before any work."""
        fn = getattr(self.module, "check", None)
        if fn:
            fn(settings, devices)

    def headline(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        fn = getattr(self.module, "headline", None)
        return list(fn(rows)) if fn else []


def config_dir() -> Path:
    """The ``perflab.conf`` package (the repo's top-level ``conf/``, installed or editable)."""
    return Path(str(resources.files("perflab.conf")))


def presets() -> dict[str, str]:
    """``+experiment=`` choices (conf/experiment/*.yaml) with the first line of their comment."""
    found = {}
    for path in sorted((config_dir() / "experiment").glob("*.yaml")):
        comments = [line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#")]
        found[path.stem] = next((c for c in comments if c and not c.startswith("@package")), "")
    return found


def names() -> list[str]:
    """Every experiment module's name (``_private`` ones skipped), without importing any."""
    package = importlib.import_module(PACKAGE)
    return sorted(i.name for i in pkgutil.iter_modules(package.__path__) if not i.name.startswith("_"))


@functools.cache
def get(name: str) -> Experiment:
    module = importlib.import_module(f"{PACKAGE}.{name}")
    if not (hasattr(module, "run") and issubclass(getattr(module, "Config", object), ExperimentConfig)):
        raise TypeError(f"experiments/{name}.py needs a Config(ExperimentConfig) and run(ctx)")
    return Experiment(name, module)


def discover() -> dict[str, Experiment]:
    return {name: get(name) for name in names()}


def register_configs() -> None:
    """Root schema as ``perflab_schema``; each experiment's as ``schema/experiment/<name>``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="perflab_schema", node=PerflabConfig)
    for exp in discover().values():
        cs.store(group="schema/experiment", name=exp.name, node=exp.module.Config)


def listing() -> str:
    choices = presets()
    width = max(map(len, choices), default=0)
    lines = [
        "perflab: choose an experiment with +experiment=NAME"
        "  [how long its default run and its quick/ variant take on a 2-core CPU]",
        "",
    ]
    lines += [f"  {name.ljust(width)}  {summary}" for name, summary in choices.items()]
    lines += [
        "",
        "Every experiment has a quick/ variant, small enough for a first look (seconds): +experiment=quick/NAME",
        "",
        "Examples:",
        "  perflab +experiment=auto_parallel",
        "  perflab +experiment=quick/train                    # 2 epochs on 2048 images",
        "  perflab +experiment=matmul --help                  # every key of that job and its value",
        "  perflab -m +experiment=matmul experiment.size=64,128   # a sweep",
        "  perflab +experiment=train strategy=ddp devices.count=2 trainer.epochs=2",
        "  python -m perflab.results                          # past runs",
    ]
    return "\n".join(lines)
