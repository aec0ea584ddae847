"""Optimizers by name (``trainer.optimizer=sgd|adam|adamw``) or by class
(``trainer.optimizer=torch.optim.RMSprop``, a user's own), with the trainer's ``lr``,
``weight_decay``, ``momentum`` (SGD's, and a class's that takes it) and ``betas`` (Adam's);
and the split of a training step into forward, backward and optimizer time.

The split costs no sync: on the CPU (whose ops run as they are called) a clock reading between
the phases; on a GPU a CUDA event recorded on the stream between them, read once the epoch has
waited for the device anyway. The epoch's total is timed as before, around all of it."""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable, Iterable

import torch

from perflab.config.schema import OPTIMIZERS, TrainerConfig
from perflab.errors import ConfigError

PHASES = ("forward", "backward", "optimizer")
ALLOWED = f"{', '.join(OPTIMIZERS)}, or a torch.optim.Optimizer class's dotted path (torch.optim.RMSprop)"


def optimizer_class(name: str) -> Any:
    """The class ``trainer.optimizer`` names; one line if it is none."""
    builtin = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if name in builtin:
        return builtin[name]
    from perflab.models import locate

    try:
        found = locate(name)
    except ConfigError as err:
        raise ConfigError("trainer.optimizer", name, ALLOWED, problem=err.problem) from None
    if not (inspect.isclass(found) and issubclass(found, torch.optim.Optimizer)):
        raise ConfigError("trainer.optimizer", name, ALLOWED, problem="not a torch.optim.Optimizer class")
    return found


def factory(t: TrainerConfig, lr: float) -> Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]:
    """Make the configured optimizer for some parameters: ``lr`` and ``weight_decay`` always,
    ``momentum`` and ``betas`` where the class takes them."""
    cls = optimizer_class(t.optimizer)
    takes = inspect.signature(cls.__init__).parameters
    _refuse_what_it_does_not_take(t, cls, takes)
    args: dict[str, Any] = {"lr": lr, "weight_decay": t.weight_decay}
    if "momentum" in takes:
        args["momentum"] = t.momentum
    if "betas" in takes:
        args["betas"] = tuple(t.betas)
    args = {k: v for k, v in args.items() if k in takes}

    def make(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return cls(params, **args)  # type: ignore[no-any-return]

    return make


def _refuse_what_it_does_not_take(t: TrainerConfig, cls: Any, takes: Any) -> None:
    """An argument set away from its default for a class that takes none such (momentum for
    Adagrad, betas for SGD) is one line, not dropped in silence. At its default, or 0 (none, as
    lenet_scratch's momentum), it is no one's choice for that class: left out (a class that takes
    it gets it: RMSprop gets momentum 0.9, docs/training.md)."""
    import dataclasses

    from perflab.config.schema import default_of

    for f in dataclasses.fields(TrainerConfig):
        if f.name not in ("momentum", "betas", "weight_decay") or f.name in takes:
            continue
        value = getattr(t, f.name)
        default = default_of(f)
        if (list(value) if f.name == "betas" else value) not in (default, 0):  # 0: none (lenet_scratch's momentum)
            raise ConfigError(
                f"trainer.{f.name}",
                value,
                f"{default} (its default) with {cls.__name__}",
                problem=f"{cls.__name__} takes no {f.name}",
            )


def described(t: TrainerConfig) -> str:
    """The optimizer as rows name it, with the arguments it got: ``adamw(betas=0.9,0.999, wd=0.01)``."""
    cls = optimizer_class(t.optimizer)
    takes = inspect.signature(cls.__init__).parameters
    parts = []
    if "momentum" in takes:
        parts.append(f"momentum={t.momentum:g}")
    if "betas" in takes:
        parts.append(f"betas={','.join(f'{b:g}' for b in t.betas)}")
    if "weight_decay" in takes:
        parts.append(f"weight_decay={t.weight_decay:g}")
    return f"{t.optimizer}({', '.join(parts)})"


class Phases:
    """Where each step's time goes: ``start()`` then ``mark(phase)`` at the end of each phase.
    ``totals()`` (after the devices were synchronized) sums each phase over the marked steps."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.steps: list[list[Any]] = []

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def start(self) -> None:
        self.steps.append([self._now()])

    def mark(self, phase: str) -> None:
        if self.steps and len(self.steps[-1]) == PHASES.index(phase) + 1:
            self.steps[-1].append(self._now())

    def totals(self) -> dict[str, float]:
        """Seconds per phase, summed over the complete steps (call after a sync)."""
        sums = dict.fromkeys(PHASES, 0.0)
        for marks in self.steps:
            if len(marks) != len(PHASES) + 1:
                continue
            for phase, a, b in zip(PHASES, marks, marks[1:]):
                sums[phase] += a.elapsed_time(b) / 1e3 if self.cuda else b - a
        return sums

    @property
    def complete(self) -> int:
        return sum(1 for m in self.steps if len(m) == len(PHASES) + 1)


class NoPhases(Phases):
    """A strategy whose step has no one forward/backward/optimizer sequence (scratch's replicas)."""

    def __init__(self) -> None:
        self.steps = []
        self.cuda = False

    def start(self) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass


class Ranges(NoPhases):
    """The phases as profiler ranges (``record_function``, named ``RANGE``), for a profiled pass
    only: the profiler then sees each step's forward, backward and optimizer under perflab's
    names (``perflab.measure.operators``: kind ``range``). The timed pass never opens one."""

    RANGE = "train: {}"

    def __init__(self) -> None:
        super().__init__()
        self.open: tuple[int, Any] | None = None

    def start(self) -> None:
        self._close()
        self._enter(0)

    def mark(self, phase: str) -> None:
        i = PHASES.index(phase)
        if self.open is not None and self.open[0] == i:
            self._close()
            if i + 1 < len(PHASES):
                self._enter(i + 1)

    def _enter(self, i: int) -> None:
        r = torch.profiler.record_function(self.RANGE.format(PHASES[i]))
        r.__enter__()
        self.open = (i, r)

    def _close(self) -> None:
        if self.open is not None:
            self.open[1].__exit__(None, None, None)
            self.open = None
