"""Typed configuration: the schema Hydra composes into, with range checks.

OmegaConf checks types while Hydra composes; ``__post_init__`` checks ranges when
``validate`` turns the composed config into these dataclasses. Each experiment adds a
subclass of :class:`ExperimentConfig` next to its code (see ``experiments/``).
Experiment fields are flat (no nested dataclasses) so every knob sweeps as
``experiment.<name>=a,b``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from perflab.errors import ConfigError

DTYPES = ("float32", "float16", "bfloat16", "float64")
TIMERS = ("auto", "cuda_event", "wall_sync", "torch_utils_benchmark")
DEVICE_KINDS = ("auto", "cpu", "cuda", "mps")


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise a one-line ConfigError unless ``ok``."""
    if not ok:
        raise ConfigError(key, value, allowed)


def positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        require(value >= 1, name, value, "an integer >= 1")


def one_of(obj: Any, name: str, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    value = getattr(obj, name)
    require(value in choices, name, value, ", ".join(choices))


@dataclass
class ExperimentConfig:
    """Base of every experiment's parameters; ``name`` selects experiments/<name>.py."""

    name: str = MISSING


@dataclass
class DevicesConfig:
    """Which devices a job uses, resolved (and checked) before any work starts.

    spec: ``auto`` (all GPUs, else the CPU), ``cpu``, ``cuda``, ``mps``, or a list such as
    ``[cuda:0,cuda:1]`` / ``[cuda:0,cpu]``. count: take N devices of that kind; for the CPU,
    N workers that split its cores. on_missing: ``error`` (exit 2) or ``skip`` (write a
    ``skipped`` row and exit 0, so a sweep goes on).
    """

    spec: Any = "auto"
    count: Optional[int] = None
    on_missing: str = "error"

    def __post_init__(self) -> None:
        if self.count is not None:
            require(self.count >= 1, "count", self.count, "null or an integer >= 1")
        one_of(self, "on_missing", ("error", "skip"))
        if isinstance(self.spec, str):
            return
        require(
            isinstance(self.spec, (list, tuple)) and len(self.spec) > 0,
            "spec",
            self.spec,
            "auto, cpu, cuda, mps, or a non-empty list like [cuda:0,cuda:1]",
        )


@dataclass
class BenchConfig:
    """How every timed measurement is taken (see perflab.bench.measure)."""

    warmup: int = 1
    repeats: int = 5
    min_time_s: float = 0.0
    timer: str = "auto"
    noise_threshold: float = 0.10

    def __post_init__(self) -> None:
        require(self.warmup >= 0, "warmup", self.warmup, "an integer >= 0")
        positive(self, "repeats")
        require(self.min_time_s >= 0, "min_time_s", self.min_time_s, "a number >= 0")
        one_of(self, "timer", TIMERS)
        require(self.noise_threshold > 0, "noise_threshold", self.noise_threshold, "a number > 0")


@dataclass
class ResultsConfig:
    """Where rows go: every job writes <run dir>/results.csv; ``ledger`` (null: off) collects all."""

    ledger: Optional[str] = "outputs/results.csv"
    samples: bool = True
    table: bool = True


@dataclass
class PerflabConfig:
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)
    seed: int = 0


def validate(cfg: DictConfig) -> PerflabConfig:
    """Build the typed config, raising a ConfigError whose key is the full dotted path."""
    sections = {}
    for f in fields(PerflabConfig):
        node = cfg.get(f.name)
        if not isinstance(node, DictConfig):
            sections[f.name] = node
            continue
        try:
            sections[f.name] = OmegaConf.to_object(node)
        except ConfigError as err:
            raise err.under(f.name) from None
    return PerflabConfig(**sections)
