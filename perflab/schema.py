"""Typed configuration: the schema Hydra composes into, with range checks.

OmegaConf checks types while Hydra composes; ``__post_init__`` checks ranges when
``validate`` turns the composed config into these dataclasses. Each experiment adds a
subclass of :class:`ExperimentConfig` next to its code (see ``experiments/``).
Experiment fields are flat (no nested dataclasses) so every knob sweeps as
``experiment.<name>=a,b``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Optional

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
    N workers that split its cores. on_missing: ``error`` (exit 2), ``skip`` (write a
    ``skipped`` row and exit 0), or ``auto``: error in a single run, skip in a sweep.
    """

    spec: Any = "auto"
    count: Optional[int] = None
    on_missing: str = "auto"

    def __post_init__(self) -> None:
        if self.count is not None:
            require(self.count >= 1, "count", self.count, "null or an integer >= 1")
        one_of(self, "on_missing", ("auto", "error", "skip"))
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
    redo: bool = False  # run a config again even if the ledger has it done (same config hash)
    peaks: Optional[str] = "outputs/peaks.json"  # the hardware experiment's peaks: pct_of_peak elsewhere


@dataclass
class ModelConfig:
    """conf/model/: which network and how its weights start."""

    name: str = MISSING  # lenet | resnet18 | resnet18_tv
    init: str = "default"  # default (torch's) | book_normal (N(0, 0.01)) | xavier
    num_classes: int = 10

    def __post_init__(self) -> None:
        one_of(self, "name", ("lenet", "resnet18", "resnet18_tv"))
        one_of(self, "init", ("default", "book_normal", "xavier"))
        positive(self, "num_classes")


@dataclass
class DataConfig:
    """conf/data/: Fashion-MNIST (torchvision) or a synthetic learnable set of the same shapes."""

    name: str = MISSING  # fashion_mnist | synthetic
    root: str = "data"  # fashion_mnist: torchvision's root (holds FashionMNIST/raw/)
    download: bool = False
    train_size: Optional[int] = None  # null: all (synthetic: 60000 / 10000, as Fashion-MNIST)
    test_size: Optional[int] = None
    noise: float = 2.0  # synthetic: noise std on the class templates (2.0: best possible accuracy ~0.86)
    workers: int = 0  # DataLoader worker processes
    pin_memory: bool = False
    on_device: bool = False  # keep the whole set on the device: no input pipeline in the timing

    def __post_init__(self) -> None:
        one_of(self, "name", ("fashion_mnist", "synthetic"))
        for name in ("train_size", "test_size"):
            value = getattr(self, name)
            require(value is None or value >= 1, name, value, "null or an integer >= 1")
        require(self.workers >= 0, "workers", self.workers, "an integer >= 0")
        require(self.noise >= 0, "noise", self.noise, "a number >= 0")


@dataclass
class StrategyConfig:
    """conf/strategy/: how the devices share the work."""

    name: str = MISSING  # single | scratch | data_parallel | ddp
    backend: str = "auto"  # ddp: auto (nccl on GPUs, gloo on CPU) | nccl | gloo
    nnodes: int = 1  # ddp on several machines: run the same command on each, with ...
    rdzv_endpoint: str = ""  # ... host:port of the rendezvous (empty: this machine, a free port)
    rdzv_id: str = "perflab"  # ... and the same id
    max_restarts: int = 0

    def __post_init__(self) -> None:
        one_of(self, "name", ("single", "scratch", "data_parallel", "ddp"))
        one_of(self, "backend", ("auto", "nccl", "gloo"))
        positive(self, "nnodes")
        require(self.max_restarts >= 0, "max_restarts", self.max_restarts, "an integer >= 0")
        require(self.nnodes == 1 or bool(self.rdzv_endpoint), "rdzv_endpoint", self.rdzv_endpoint,
                "host:port of the rendezvous when nnodes > 1")


@dataclass
class TrainerConfig:
    """The training loop: epochs, batch and learning-rate rule, SGD, checkpoints."""

    epochs: int = 10
    batch_size: int = 256  # scaling=strong: the global batch; weak: the batch per device
    scaling: str = "strong"  # strong (global batch fixed) | weak (per-device batch fixed)
    lr: float = 0.1  # the base learning rate, right for base_batch
    base_batch: int = 256
    lr_rule: str = "none"  # none | linear | sqrt: lr = lr * f(global batch / base_batch)
    warmup_epochs: float = 0.0  # ramp linearly from lr to the scaled lr (Goyal et al. 2017: 5)
    momentum: float = 0.0
    weight_decay: float = 0.0
    eval_batch: int = 1024
    checkpoint_every: int = 1  # epochs between checkpoints (0: only the last); one is kept
    checkpoint_dir: str = "outputs/checkpoints"  # <dir>/<config hash>/last.pt
    resume: bool = False  # continue from the checkpoint of this same config, if there is one

    def __post_init__(self) -> None:
        positive(self, "epochs", "batch_size", "base_batch", "eval_batch")
        one_of(self, "scaling", ("strong", "weak"))
        one_of(self, "lr_rule", ("none", "linear", "sqrt"))
        require(self.lr > 0, "lr", self.lr, "a number > 0")
        require(self.warmup_epochs >= 0, "warmup_epochs", self.warmup_epochs, "a number >= 0")
        require(0 <= self.momentum < 1, "momentum", self.momentum, "0 <= momentum < 1")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
        require(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, "an integer >= 0")


@dataclass
class PerflabConfig:
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)
    seed: int = 0
    # Training experiments fill these from conf/model, conf/data, conf/strategy; others leave them null.
    model: Optional[ModelConfig] = None
    data: Optional[DataConfig] = None
    strategy: Optional[StrategyConfig] = None
    trainer: Optional[TrainerConfig] = None


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


def config_hash(cfg: Mapping[str, Any], ignore: Iterable[str] = ("results",)) -> str:
    """A short, stable hash of a resolved config (dotted keys in ``ignore`` left out).

    Two jobs with the same hash measure the same thing: sweeps use it to skip points the
    ledger already has, checkpoints to find the run to resume.
    """
    skip = set(ignore) | {"hydra"}

    def keep(node: Any, path: str = "") -> Any:
        if not isinstance(node, Mapping):
            return node
        return {k: keep(v, f"{path}{k}.") for k, v in node.items() if f"{path}{k}" not in skip}

    text = json.dumps(keep(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
