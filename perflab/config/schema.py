"""Typed configuration: the schema Hydra composes into, its choices, defaults and range checks.

This module is the one source of truth for every key: its type, its default (YAML files only
set what a preset changes), the values it allows, and whether it defines *what is measured*
(the run identity) or only where and how results are kept (marked ``volatile``).

OmegaConf checks types while Hydra composes; ``__post_init__`` checks ranges when ``validate``
turns the composed config into these dataclasses. It imports no torch, so a config mistake is
answered in a fraction of a second. Each experiment adds a subclass of :class:`ExperimentConfig`
next to its code; its fields are flat so every knob sweeps as ``experiment.<name>=a,b``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, cast

from perflab.errors import ConfigError, KeyOnly, first_line, unknown_key

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from omegaconf.errors import InterpolationResolutionError

# omegaconf.MISSING (a test holds them equal), so that a config mistake the front door answers
# imports no omegaconf; the functions below import it when they run.
MISSING: Any = "???"

# Choice lists: the code that implements each choice checks against these (tests keep them in step).
DTYPES = ("float32", "float16", "bfloat16", "float64")
TIMERS = ("auto", "cuda_event", "wall_sync", "torch_utils_benchmark")
INITS = ("default", "book_normal", "xavier")
DATASETS = ("fashion_mnist", "synthetic", "tokens", "torchvision")
STRATEGIES = ("single", "scratch", "data_parallel", "ddp")
BACKENDS = ("auto", "nccl", "gloo")
PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")
OPTIMIZERS = ("sgd", "adam", "adamw")  # or a torch.optim.Optimizer class's dotted path
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

VOLATILE = {"volatile": True}  # field metadata: changing this key does not change what is measured
# Field metadata of a key added after runs were hashed: at its default it is left out of the hash,
# so that every run from before it measured, and hashes, the same as before.
LATER = {"later": True}


def volatile(default: Any) -> Any:
    """A field that says where/how results are kept, not what is measured (left out of the run's hash)."""
    return field(default=default, metadata=VOLATILE)


DEVICE_NAME = re.compile(r"^(cpu|mps|cuda)(?::(\d+))?$")
SPEC_ALLOWED = "auto, cpu, cuda, mps, or a list like [cuda:0,cuda:1], [cpu], [cuda:0,cpu]"


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


def some_of(obj: Any, name: str, choices: Iterable[str]) -> None:
    """A non-empty list of ``choices`` (an empty one would measure nothing and say nothing)."""
    choices = tuple(choices)
    value = list(getattr(obj, name))
    require(bool(value) and all(v in choices for v in value), name, value, f"a non-empty list of {', '.join(choices)}")


@dataclass(kw_only=True)
class ExperimentConfig:
    """Base of every experiment's parameters; ``name`` selects the experiment. Keyword-only, so
    that a subclass may declare fields without a default (``rows: int``: given in a preset or
    on the command line)."""

    name: str = MISSING


@dataclass
class DevicesConfig:
    """Which devices a job uses, resolved (and checked) before any work starts.

    spec: ``auto`` (all GPUs, else the CPU), ``cpu``, ``cuda``, ``mps``, or a list such as
    ``[cuda:0,cuda:1]`` / ``[cuda:0,cpu]``. count: take N devices of that kind; for the CPU,
    N workers that split its cores. on_missing: ``error`` (exit 2), ``skip`` (write a
    ``skipped`` row and exit 0), or ``auto``: error in a single run, skip in a sweep.
    threads: torch's intra-op threads for the job (CPU work; CPU workers split them); null:
    ``OMP_NUM_THREADS`` where set, else every CPU this process may use (its affinity mask),
    never more than those CPUs (:func:`perflab.measure.devices.intra_op_threads`).
    """

    spec: Any = "auto"
    count: Optional[int] = None
    on_missing: str = volatile("auto")
    threads: Optional[int] = field(default=None, metadata=LATER)

    def __post_init__(self) -> None:
        if self.count is not None:
            require(self.count >= 1, "count", self.count, "null or an integer >= 1")
        if self.threads is not None:
            require(self.threads >= 1, "threads", self.threads, "null or an integer >= 1")
        one_of(self, "on_missing", ("auto", "error", "skip"))
        if isinstance(self.spec, str) and self.spec in ("auto", "cpu", "cuda", "mps"):
            return
        if not isinstance(self.spec, str):
            require(
                isinstance(self.spec, (list, tuple)) and len(self.spec) > 0,
                "spec",
                self.spec,
                "auto, cpu, cuda, mps, or a non-empty list like [cuda:0,cuda:1]",
            )
        self.parsed()  # a name that is no device is a bad value on any machine: refused before any point runs

    def parsed(self) -> list[tuple[str, int | None]]:
        """An explicit spec as (type, index) pairs, checked without looking at the machine (no
        torch): every name a device name, each accelerator once, ``count`` the list's length."""
        names = [self.spec] if isinstance(self.spec, str) else [str(s) for s in self.spec]
        parsed: list[tuple[str, int | None]] = []
        for name in names:
            m = DEVICE_NAME.match(name.strip())
            if not m:
                raise ConfigError("spec", self.spec, SPEC_ALLOWED, problem=f"'{name}' is not a device name")
            kind, index = m.group(1), int(m.group(2)) if m.group(2) is not None else None
            parsed.append((kind, 0 if kind == "cuda" and index is None else index))
        accelerators = [p for p in parsed if p[0] != "cpu"]
        if len(set(accelerators)) != len(accelerators):
            raise ConfigError("spec", self.spec, "each GPU at most once", problem="a device is listed twice")
        if self.count is not None and self.count != len(names):
            raise ConfigError("count", self.count, f"null or {len(names)} (the length of devices.spec)")
        return parsed


MAX_PROCESSES = 1000  # bench.processes: more is a typo, not a plan


@dataclass
class BenchConfig:
    """How every timed measurement is taken (see perflab.measure.bench.measure)."""

    warmup: int = 2  # calls before the samples; timed and reported apart, never in the stats
    repeats: int = 5  # at least this many samples ...
    min_time_s: float = 0.5  # ... and at least this many seconds of samples (like blocked_autorange)
    timer: str = "auto"  # auto | cuda_event | wall_sync | torch_utils_benchmark
    noise_threshold: float = 0.10  # a row is noisy when IQR / median exceeds this
    busy_threshold: float = 0.25  # suspect when other processes took this share of the CPUs meanwhile
    profile: bool = volatile(False)  # true: one torch.profiler Chrome trace per measurement, beside the rows
    # each point in this many fresh processes (rows carry ``process``, 1..K): the unit compare judges by
    processes: int = volatile(1)
    # also count the instructions of each part's call under callgrind (CPU, one thread; valgrind):
    # the ``instructions`` column, a metric load does not move (perflab.measure.instructions)
    instructions: bool = field(default=False, metadata=LATER)

    def __post_init__(self) -> None:
        require(self.warmup >= 0, "warmup", self.warmup, "an integer >= 0")
        positive(self, "repeats")
        require(
            isinstance(self.processes, int) and 1 <= self.processes <= MAX_PROCESSES,
            "processes",
            self.processes,
            f"an integer from 1 to {MAX_PROCESSES}",
        )
        require(self.min_time_s >= 0, "min_time_s", self.min_time_s, "a number >= 0")
        one_of(self, "timer", TIMERS)
        require(self.noise_threshold > 0, "noise_threshold", self.noise_threshold, "a number > 0")
        require(0 < self.busy_threshold <= 1, "busy_threshold", self.busy_threshold, "a number in (0, 1]")


@dataclass
class ResultsConfig:
    """Where rows go. Each job's run dir is the truth; everything across runs derives from ``store``."""

    store: str = "outputs"  # the results tree: runs/, sweeps/, the index (perflab.results.load("outputs"))
    ledger: Optional[str] = None  # also append every row to this one CSV (a convenience; null: off)
    peaks: Optional[str] = "${results.store}/peaks.json"  # +experiment=hardware's peaks: pct_of_peak elsewhere
    samples: bool = True  # raw per-sample times in <run dir>/samples.csv
    table: bool = True  # print the job's table at the end
    redo: bool = False  # a sweep re-runs points that are already done (same config hash, complete)
    claim_stale_s: float = 900.0  # a sweep point's claim whose holder was silent this long may be taken over
    subject: Optional[str] = None  # the code under test (any tag); null: the git commit of the working directory
    note: str = ""  # free text kept in every row of the job (cfg.results.note): why it ran, how it was sized

    def __post_init__(self) -> None:
        require(bool(self.store), "store", self.store, "a directory path")
        require(self.claim_stale_s > 0, "claim_stale_s", self.claim_stale_s, "a number of seconds > 0")


@dataclass
class ModelConfig:
    """conf/model/: which network (any factory, Hydra's ``_target_``), how its weights start,
    and its memory layout. Keys the schema does not name (``+model.width=16``) are the
    factory's own arguments (``args``); what the data decides (``num_classes``, ``in_channels``,
    ``vocab_size``, ``seq_len``) reaches a factory that takes it by that name
    (perflab.models). perflab's keys here never reach the factory."""

    _target_: str = MISSING  # a callable returning an nn.Module: perflab.models.lenet, pkg.mod.Factory
    arch: Optional[str] = None  # model=torchvision / model=timm: which of their models (mobilenet_v3_small)
    init: str = "default"  # default (the factory's) | book_normal (N(0, 0.01)) | xavier
    channels_last: bool = False  # weights and inputs in NHWC (torch.channels_last): image data only
    args: Dict[str, Any] = field(default_factory=dict)  # the factory's own arguments (the keys added with +)
    # model=hf: a Hugging Face model by name (a local folder, a hub id), or random weights from a config
    name: Optional[str] = field(default=None, metadata=LATER)
    config: Dict[str, Any] = field(default_factory=dict, metadata=LATER)  # model_type: gpt2, n_layer: 2 ...
    task: Optional[str] = field(default=None, metadata=LATER)  # auto | causal-lm | image-classification ...

    def __post_init__(self) -> None:
        require(bool(self._target_), "_target_", self._target_, "a factory's dotted path, e.g. pkg.module.MyNet")
        one_of(self, "init", INITS)

    @property
    def label(self) -> str:
        """What rows call the model: perflab's by name, torchvision's / timm's as
        ``torchvision.ARCH``, a user's by its dotted path."""
        own, _, name = self._target_.rpartition(".")
        if own != MODELS_MODULE:
            return self._target_
        if name == "hf":  # hf.gpt2 (from a config), hf./models/tiny-gpt2 (a folder), hf.org/name
            typed = self.config.get("model_type") or str(self.config.get("_target_", "")).rpartition(".")[2]
            return f"hf.{self.name or typed or '?'}"
        return f"{name}.{self.arch}" if name in ("torchvision", "timm") else name


MODELS_MODULE = "perflab.models"
# Where perflab's factories were until 0.4.0: every config hashes them there, as runs were.
MOVED_MODELS_MODULE = "perflab.train.models"


@dataclass
class DataConfig:
    """conf/data/: synthetic images of any shape, token sequences, Fashion-MNIST, or any of
    torchvision's image datasets by name; what it decides (shape, classes, vocabulary) goes to
    the model (perflab.train.data.Spec)."""

    name: str = MISSING  # fashion_mnist | synthetic | tokens | torchvision
    root: str = "data"  # fashion_mnist, torchvision: the dataset's root folder (torchvision's layout)
    download: bool = False
    dataset: Optional[str] = None  # data=torchvision: a class of torchvision.datasets (MNIST, CIFAR10 ...)
    # null: the model's own (timm's, torchvision's, a Hugging Face config's), else the default after '/'
    shape: Optional[List[int]] = None  # synthetic: one item's shape (C, H, W) / [1, 28, 28]
    num_classes: Optional[int] = None  # synthetic: how many classes / 10
    vocab_size: Optional[int] = None  # tokens: ids 0 .. vocab_size - 1 / 256
    seq_len: Optional[int] = None  # tokens: the input length (T), targets the inputs shifted by one / 64 (positions)
    train_size: Optional[int] = None  # null: all (synthetic, tokens: 60000 / 10000 items)
    test_size: Optional[int] = None
    noise: float = 2.0  # synthetic: noise std on the class templates (2.0: best possible accuracy ~0.86)
    workers: int = 0  # DataLoader worker processes
    pin_memory: bool = False
    on_device: bool = False  # keep the whole set on the device: no input pipeline in the timing

    def __post_init__(self) -> None:
        one_of(self, "name", DATASETS)
        for name in ("train_size", "test_size"):
            value = getattr(self, name)
            require(value is None or value >= 1, name, value, "null or an integer >= 1")
        require(self.workers >= 0, "workers", self.workers, "an integer >= 0")
        require(self.noise >= 0, "noise", self.noise, "a number >= 0")
        if self.shape is not None:
            shape = list(self.shape)
            require(
                bool(shape) and all(n >= 1 for n in shape),
                "shape",
                shape,
                "a non-empty list of sizes >= 1, e.g. [3,32,32]",
            )
        for name, least, what in (("num_classes", 2, " (a classifier)"), ("vocab_size", 2, ""), ("seq_len", 1, "")):
            value = getattr(self, name)
            require(value is None or value >= least, name, value, f"an integer >= {least}{what}")
        require(
            self.name != "torchvision" or bool(self.dataset),
            "dataset",
            self.dataset,
            "a class of torchvision.datasets with data=torchvision, e.g. data.dataset=CIFAR10",
        )


@dataclass
class StrategyConfig:
    """conf/strategy/: how the devices share the work."""

    name: str = MISSING  # single | scratch | data_parallel | ddp
    backend: str = "auto"  # ddp: auto (nccl on GPUs, gloo on CPU) | nccl | gloo
    nnodes: int = 1  # ddp on several machines: run the same command on each, with ...
    rdzv_endpoint: str = volatile("")  # ... host:port of the rendezvous (empty: this machine)
    rdzv_id: str = volatile("perflab")  # ... and the same id
    max_restarts: int = 0

    def __post_init__(self) -> None:
        one_of(self, "name", STRATEGIES)
        one_of(self, "backend", BACKENDS)
        positive(self, "nnodes")
        require(self.max_restarts >= 0, "max_restarts", self.max_restarts, "an integer >= 0")
        require(self.nnodes == 1 or self.name == "ddp", "nnodes", self.nnodes, "1 unless strategy=ddp")
        if self.rdzv_endpoint:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            good = bool(host) and port.isdigit() and 0 < int(port) < 65536
            require(good, "rdzv_endpoint", self.rdzv_endpoint, "host:port, with a port from 1 to 65535")


@dataclass
class TrainerConfig:
    """The training loop: epochs, batch and learning-rate rule, the optimizer, precision, compile, checkpoints."""

    epochs: int = 10
    batch_size: int = 256  # scaling=strong: the global batch; weak: the batch per device
    scaling: str = "strong"  # strong (global batch fixed) | weak (per-device batch fixed)
    lr: float = 0.1  # the base learning rate, right for base_batch
    base_batch: int = 256
    lr_rule: str = "none"  # none | linear | sqrt: lr = lr * f(global batch / base_batch)
    warmup_epochs: float = 0.0  # ramp linearly from lr to the scaled lr (Goyal et al. 2017: 5)
    momentum: float = 0.9  # SGD's (and a class's that takes momentum)
    weight_decay: float = 0.0
    optimizer: str = field(default="sgd", metadata=LATER)  # sgd | adam | adamw | pkg.module.OptimizerClass
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999], metadata=LATER)  # adam, adamw
    eval_batch: int = 1024
    precision: str = "fp32"  # fp32 | tf32 (CUDA only) | bf16-mixed | fp16-mixed (torch.autocast)
    compile: bool = False  # torch.compile the model (compile time gets its own row)
    compile_mode: str = "default"
    compile_backend: str = "inductor"
    checkpoint_every: int = volatile(1)  # epochs between checkpoints (0: only the last)
    checkpoint_dir: str = volatile("${results.store}/checkpoints")  # <dir>/<checkpoint key>/<run id>.pt
    resume: Optional[bool] = volatile(None)  # null: a sweep re-run resumes killed points; true: always; false: never

    def __post_init__(self) -> None:
        positive(self, "epochs", "batch_size", "base_batch", "eval_batch")
        one_of(self, "scaling", ("strong", "weak"))
        one_of(self, "lr_rule", ("none", "linear", "sqrt"))
        one_of(self, "precision", PRECISIONS)
        one_of(self, "compile_mode", COMPILE_MODES)
        require(self.lr > 0, "lr", self.lr, "a number > 0")
        require(self.warmup_epochs >= 0, "warmup_epochs", self.warmup_epochs, "a number >= 0")
        require(0 <= self.momentum < 1, "momentum", self.momentum, "0 <= momentum < 1")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
        require(
            self.optimizer in OPTIMIZERS or _dotted(self.optimizer),
            "optimizer",
            self.optimizer,
            f"{', '.join(OPTIMIZERS)}, or an optimizer class's dotted path (torch.optim.RMSprop)",
        )
        betas = list(self.betas)
        require(
            len(betas) == 2 and all(0 <= b < 1 for b in betas),
            "betas",
            betas,
            "two numbers in [0, 1), e.g. [0.9,0.999]",
        )
        require(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, "an integer >= 0")
        require(bool(self.checkpoint_dir.strip()), "checkpoint_dir", self.checkpoint_dir, "a directory path")


def _dotted(text: str) -> bool:
    parts = str(text).split(".")
    return len(parts) >= 2 and all(p.isidentifier() for p in parts)


@dataclass
class PerflabConfig:
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig, metadata=VOLATILE)
    seed: int = 0
    # Training experiments fill these from conf/model, conf/data, conf/strategy; others leave them null.
    model: Optional[ModelConfig] = None
    data: Optional[DataConfig] = None
    strategy: Optional[StrategyConfig] = None
    trainer: Optional[TrainerConfig] = None

    def __post_init__(self) -> None:
        require(0 <= self.seed < 2**32, "seed", self.seed, "an integer from 0 to 4294967295 (numpy's seed range)")


# Sections only some experiments have (training: model, data, strategy, trainer).
OPTIONAL_SECTIONS = tuple(f.name for f in fields(PerflabConfig) if f.default is None)

SECTIONS: dict[str, type] = {
    "devices": DevicesConfig,
    "bench": BenchConfig,
    "results": ResultsConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "strategy": StrategyConfig,
    "trainer": TrainerConfig,
}


def validate(cfg: DictConfig, experiment_config: type | None = None) -> PerflabConfig:
    """Build the typed config from Hydra's composed one, raising a ConfigError whose key is
    the full dotted path.

    Keys that no schema knows (``+bench.repeat=3``) are refused with a did-you-mean, since
    Hydra's ``+`` would otherwise add them and they would be silently ignored.
    """
    from omegaconf import OmegaConf

    sections: dict[str, Any] = {}
    known = {f.name: f for f in fields(PerflabConfig)}
    removed = next((name for name in known if name not in cfg and name not in OPTIONAL_SECTIONS), None)
    if removed is not None:  # ~seed, ~devices: OmegaConf lets a top-level key go
        allowed = f"{removed}.KEY=VALUE" if removed in SECTIONS else f"{removed}=VALUE"
        raise ConfigError(removed, f"(removed by ~{removed})", allowed, problem="this key cannot be removed")
    _refuse_unknown(cfg, known, "")
    for name in known:
        node = _section_node(cfg, name)
        if not isinstance(node, Mapping):
            sections[name] = node
            continue
        schema: Any = experiment_config if name == "experiment" and experiment_config else OmegaConf.get_type(node)
        args: dict[str, Any] = {}
        if schema is ModelConfig:
            node, args = _factory_args(cast("DictConfig", node), cast("DictConfig", cfg))
        if is_dataclass(schema):
            _refuse_unknown(node, {f.name: f for f in fields(schema)}, f"{name}.")
        sections[name] = _to_object(schema, node, name, cfg)
        if args:
            sections[name].args = {**sections[name].args, **args}
    settings = PerflabConfig(**sections)
    _refuse_out_of_range(settings)
    return settings


def _section_node(cfg: Any, name: str) -> Any:
    from omegaconf.errors import InterpolationResolutionError

    try:
        return cfg.get(name)
    except InterpolationResolutionError as err:
        raise unresolved(cfg, err) from None


def _to_object(schema: Any, node: Any, name: str, cfg: Any) -> Any:
    """A composed section as its dataclass (OmegaConf calls ``__post_init__``: the range checks)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue, OmegaConfBaseException

    try:
        return OmegaConf.to_object(node)
    except ConfigError as err:
        raise err.under(name) from None
    except MissingMandatoryValue as err:  # a field without a default, set nowhere
        raise missing(schema, str(err.key), f"{name}.{err.key}") from None
    except InterpolationResolutionError as err:
        raise unresolved(cfg, err) from None
    except OmegaConfBaseException:  # a value of the wrong type: composing's errors say it
        raise
    except Exception as err:  # a bug in its __post_init__ (a user's Config): named, not a traceback
        raise broken(schema, name, err) from None


def broken(schema: Any, name: str, err: Exception) -> KeyOnly:
    """The one line for a Config whose ``__post_init__`` raised something other than a
    ConfigError (a bug in it): which class, what it raised."""
    where = f"{schema.__module__}.{schema.__qualname__}"
    return KeyOnly(
        name,
        "",
        "a Config whose __post_init__ raises perflab.errors.ConfigError for a bad value (fix the bug in it)",
        problem=f"its Config ({where}) raised {type(err).__name__}: {first_line(err)}",
    )


def missing(schema: Any, field_name: str, key: str) -> KeyOnly:
    """The one line for a field no preset and no override gave a value: its key and its type."""
    try:
        hint: Any = typing.get_type_hints(schema).get(field_name)
    except Exception:  # a hint that does not resolve: say "a value"
        hint = None
    hint = next((a for a in typing.get_args(hint) if a is not type(None)), hint)  # Optional[int] -> int
    what = TYPE_NAMES.get(hint, f"a {getattr(hint, '__name__', 'value')}" if hint else "a value")
    where = f"set in a preset (under {key.rpartition('.')[0]}:) or on the command line: {key}=..."
    return KeyOnly(key, "???", f"{what}, {where}", problem="no value given")


# The words for a field's type in a line that asks for a value.
TYPE_NAMES: dict[Any, str] = {int: "an integer", float: "a number", str: "a text", bool: "true or false"}


def _factory_args(node: DictConfig, cfg: DictConfig) -> tuple[DictConfig, dict[str, Any]]:
    """The model section without the keys the schema does not name, and those keys: the
    factory's own arguments (``+model.width=16``), checked against its signature later
    (perflab.models.check), where the factory is imported."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    known = {f.name for f in fields(ModelConfig)}
    extra = [str(k) for k in node if k not in known]
    if not extra:
        return node, {}
    try:
        plain = cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))
    except InterpolationResolutionError as err:
        raise unresolved(cfg, err) from None
    kept = OmegaConf.structured(ModelConfig)
    OmegaConf.set_struct(kept, False)  # any field may be MISSING until merged
    kept = OmegaConf.merge(kept, {k: v for k, v in plain.items() if k in known})
    return cast("DictConfig", kept), {k: plain[k] for k in extra}


def resolve_all(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain data with every ``${...}`` resolved; one that does not resolve
    (``${oops}``, ``${oc.env:UNSET}``, a loop) is a one-line ConfigError, not a traceback."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    try:
        return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    except InterpolationResolutionError as err:
        raise unresolved(cfg, err) from None


def unresolved(cfg: DictConfig, err: InterpolationResolutionError) -> ConfigError:
    """The ConfigError for an interpolation that does not resolve, naming its key."""
    key = getattr(err, "full_key", None) or _first_unresolved(cfg)
    return ConfigError(key, _raw(cfg, key), "a value, or a ${...} that resolves", problem=first_line(err))


def _first_unresolved(cfg: DictConfig) -> str:
    """The key of the first ``${...}`` that fails (OmegaConf does not always say which)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    todo: list[tuple[str, Any]] = [("", OmegaConf.to_container(cfg, resolve=False))]
    while todo:
        prefix, node = todo.pop(0)
        if isinstance(node, dict):
            todo += [(f"{prefix}{k}.", v) for k, v in node.items() if k != "hydra"]
        elif isinstance(node, str) and "${" in node:
            try:
                OmegaConf.select(cfg, prefix[:-1], throw_on_resolution_failure=True)
            except InterpolationResolutionError:
                return prefix[:-1]
    return "config"


def _raw(cfg: DictConfig, key: str) -> Any:
    """The value at a dotted key as written (``${oops}``), without resolving it."""
    from omegaconf import OmegaConf

    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _refuse_out_of_range(obj: Any, prefix: str = "") -> None:
    """inf or nan passes ``x > 0``-style checks (inf) and means nothing for any knob here; an
    integer torch cannot hold (>= 2**63) would crash the job instead of being refused."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            _refuse_out_of_range(value, f"{prefix}{f.name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{f.name}", value, "a finite number")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            raise ConfigError(f"{prefix}{f.name}", value, "an integer below 2**63")


def _refuse_unknown(node: Mapping[str, Any], known: Mapping[str, Any], prefix: str) -> None:
    for key in node:
        if key == "hydra" or key in known:
            continue
        if isinstance(node, dict):
            value = node[key]
        else:
            from omegaconf import OmegaConf

            value = OmegaConf.to_container(node, resolve=False).get(key)  # type: ignore[union-attr]
        raise unknown_key(f"{prefix}{key!s}", value, list(known))


def volatile_keys() -> list[str]:
    """Dotted keys marked volatile in the schema: they do not change what a job measures."""
    keys = [f.name for f in fields(PerflabConfig) if f.metadata.get("volatile")]
    for name, section in SECTIONS.items():
        if name not in keys:
            keys += [f"{name}.{f.name}" for f in fields(section) if f.metadata.get("volatile")]
    return keys


def default_of(f: dataclasses.Field) -> Any:
    """A field's default (its factory's value), or ``dataclasses.MISSING`` where it has none."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def later_defaults() -> dict[str, Any]:
    """Dotted keys added after runs were hashed (``LATER``), with their defaults."""
    found: dict[str, Any] = {}
    for name, section in SECTIONS.items():
        for f in fields(section):
            if f.metadata.get("later"):
                found[f"{name}.{f.name}"] = default_of(f)
    return found


def as_hashed(key: str, value: Any) -> Any:
    """A value as runs hashed it before it was renamed: perflab's model factories under
    MOVED_MODELS_MODULE, so that a point measured before the move is the same point after it."""
    if key == "model._target_" and isinstance(value, str) and value.startswith(f"{MODELS_MODULE}."):
        return MOVED_MODELS_MODULE + value.removeprefix(MODELS_MODULE)
    return value


def config_hash(cfg: Mapping[str, Any], ignore: Iterable[str] = ()) -> str:
    """A short, stable hash of a resolved config, without the volatile keys (and ``ignore``).

    Two jobs with the same hash measure the same thing: a sweep skips points already done,
    compare matches rows of two trees by it.
    """
    skip = set(volatile_keys()) | set(ignore) | {"hydra"}
    later = later_defaults()

    def keep(node: Any, path: str = "") -> Any:
        if not isinstance(node, Mapping):
            return as_hashed(path.rstrip("."), node)
        return {
            k: keep(v, f"{path}{k}.")
            for k, v in node.items()
            if f"{path}{k}" not in skip and not (f"{path}{k}" in later and v == later[f"{path}{k}"])
        }

    text = json.dumps(keep(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
