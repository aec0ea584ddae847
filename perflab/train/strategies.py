"""Four ways to spread a batch over devices; the loop sees one interface.

``step(x, y)`` trains on one (global or, for DDP, per-rank) batch and returns the summed loss
and the number of correct predictions as device tensors: nothing here reads a value back to
the host, so the loop never waits on the devices in the middle of an epoch.

Gradients: every strategy takes the gradient of the *mean* loss over the global batch, so
with the same seed, data and global batch they produce the same parameters as ``single``
(BatchNorm aside: its statistics are per device by design). Precision (autocast, and a
GradScaler for fp16) and the memory layout apply inside ``step``, the same for all four.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import nn

from perflab.measure import precision as precisions
from perflab.measure.devices import Device, synchronize
from perflab.train.objectives import CLASSES, Objective
from perflab.train.optim import NoPhases, Phases

MakeOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class Knobs:
    """How each step runs: precision (perflab.measure.precision), NHWC inputs, torch.compile."""

    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    compile_mode: str = "default"
    compile_backend: str = "inductor"


class Single:
    """One device: the plain training step every other strategy must match."""

    name = "single"
    note = ""
    phases: Phases = NoPhases()  # where each step's time goes (the loop sets one per epoch)
    splits_step = True  # one forward, backward and optimizer phase per step, to be timed apart

    def __init__(
        self,
        model: nn.Module,
        devices: list[Device],
        make_optimizer: MakeOptimizer,
        knobs: Knobs = Knobs(),
        objective: Objective = CLASSES,
    ) -> None:
        self.devices, self.knobs, self.objective = devices, knobs, objective
        self.device = devices[0].torch
        self.bare = self.layout(model.to(self.device))
        self.model = self.compiled(self.wrap(self.bare))
        self.optimizers = [make_optimizer(self.bare.parameters())]
        self.scaler = precisions.scaler(knobs.precision, self.device.type)

    def layout(self, model: nn.Module) -> nn.Module:
        return model.to(memory_format=torch.channels_last) if self.knobs.channels_last else model

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def compiled(self, model: nn.Module) -> Any:
        if not self.knobs.compile:
            return model
        return torch.compile(model, mode=self.knobs.compile_mode, backend=self.knobs.compile_backend)

    def inputs(self, x: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
        x = x.to(device or self.device, non_blocking=True)
        return x.contiguous(memory_format=torch.channels_last) if self.knobs.channels_last else x

    def forward_loss(
        self, model: Any, x: torch.Tensor, y: torch.Tensor, batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed loss (for the epoch's total) and correct count, with the backward pass run on
        this slice's share of the global batch's mean loss. ``batch`` counts the global batch's
        targets the objective scores (perflab.train.objectives): images, tokens (all, or the
        masked ones), utterances, image-caption pairs."""
        with precisions.applied(self.knobs.precision, x.device.type):
            loss, right = self.objective.loss(model, x, y)
        self.phases.mark("forward")
        self.scaler.scale(loss / batch).backward()
        self.phases.mark("backward")
        return loss.detach(), right

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        opt = self.optimizers[0]
        opt.zero_grad(set_to_none=True)
        self.phases.start()  # forward: the batch onto the device, the model, the loss
        x, y = self.inputs(x), y.to(self.device, non_blocking=True)
        loss, right = self.forward_loss(self.model, x, y, self.objective.count(y))
        self.scaler.step(opt)
        self.scaler.update()
        self.phases.mark("optimizer")
        return loss, right

    def set_lr(self, lr: float) -> None:
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)

    @property
    def eval_model(self) -> nn.Module:
        """Evaluation runs the plain (uncompiled, unwrapped) module: no recompiles for eval."""
        return self.bare

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.optimizers[0]

    def load_optimizer(self, state: dict[str, Any]) -> None:
        """Every optimizer gets its *own* copy of the saved state: replicas must not share one
        momentum buffer (it would be updated once per replica per step)."""
        for opt in self.optimizers:
            opt.load_state_dict(copy.deepcopy(state))

    def sync(self) -> None:
        synchronize(self.devices)

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return t  # one process holds every number already


class Scratch(Single):
    """Book 13.5 from scratch: a replica per device, the batch split, gradients summed on the
    first device and broadcast back (allreduce), then the same SGD step on every replica."""

    name = "scratch"
    splits_step = False  # each replica's forward and backward in turn, then the allreduce

    def __init__(
        self,
        model: nn.Module,
        devices: list[Device],
        make_optimizer: MakeOptimizer,
        knobs: Knobs = Knobs(),
        objective: Objective = CLASSES,
    ) -> None:
        self.devices, self.knobs, self.objective = devices, knobs, objective
        self.device = devices[0].torch
        self.replicas = [self.layout(copy.deepcopy(model).to(d.torch)) for d in devices]
        self.bare = self.replicas[0]
        self.model = self.bare
        self.runners = [self.compiled(r) for r in self.replicas]
        self.optimizers = [make_optimizer(r.parameters()) for r in self.replicas]
        self.scaler = precisions.scaler(knobs.precision, self.device.type)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.objective.count(y)  # the global batch's targets
        losses, correct = [], []
        for runner, opt, d, xs, ys in zip(
            self.runners,
            self.optimizers,
            self.devices,
            x.tensor_split(len(self.devices)),
            y.tensor_split(len(self.devices)),
        ):
            opt.zero_grad(set_to_none=True)
            loss, right = self.forward_loss(runner, self.inputs(xs, d.torch), ys.to(d.torch, non_blocking=True), batch)
            losses.append(loss.to(self.device))
            correct.append(right.to(self.device))
        with torch.no_grad():
            for params in zip(*(r.parameters() for r in self.replicas)):
                allreduce([p.grad for p in params])  # partial gradients sum to the global mean's
        for opt in self.optimizers:
            self.scaler.step(opt)
        self.scaler.update()
        return torch.stack(losses).sum(), torch.stack(correct).sum()

    def train(self, mode: bool = True) -> None:
        for r in self.replicas:
            r.train(mode)


def allreduce(tensors: list[torch.Tensor]) -> None:
    """Sum into the first tensor, then copy the sum back to every other (the book's version)."""
    for t in tensors[1:]:
        tensors[0].add_(t.to(tensors[0].device))
    for t in tensors[1:]:
        t.copy_(tensors[0].to(t.device))


class DataParallel(Single):
    """``nn.DataParallel`` (legacy, single process; kept because the book uses it)."""

    name = "data_parallel"

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.devices[0].type == "cuda":
            return nn.DataParallel(model, device_ids=[int(d.index or 0) for d in self.devices])
        self.note = "nn.DataParallel splits batches over CUDA devices only: on the CPU it runs the module once"
        # Without CUDA, nn.DataParallel is a pass-through; with CUDA it would claim the GPUs.
        return model if torch.cuda.is_available() else nn.DataParallel(model)


class DDP(Single):
    """``DistributedDataParallel`` in this worker process (one per device, started by the
    worker launcher). Each rank gets its slice of the global batch; DDP averages gradients."""

    name = "ddp"

    def wrap(self, model: nn.Module) -> nn.Module:
        d = self.devices[0]
        return nn.parallel.DistributedDataParallel(model, device_ids=[d.index] if d.type == "cuda" else None)

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t


STRATEGIES = {s.name: s for s in (Single, Scratch, DataParallel, DDP)}
# Why a strategy cannot be compiled (perflab refuses the combination before training).
NOT_COMPILABLE = {
    "data_parallel": "nn.DataParallel replicates the module every step, which torch.compile "
    "does not support; use strategy=ddp (or single) with trainer.compile=true"
}
