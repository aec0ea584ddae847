"""Four ways to spread a batch over devices; the loop sees one interface.

``step(x, y)`` trains on one (global or, for DDP, per-rank) batch and returns the summed loss
and the number of correct predictions as device tensors: nothing here reads a value back to
the host, so the loop never waits on the devices in the middle of an epoch.

Gradients: every strategy takes the gradient of the *mean* loss over the global batch, so
with the same seed, data and global batch they produce the same parameters as ``single``
(BatchNorm aside: its statistics are per device by design).
"""

from __future__ import annotations

import copy
from typing import Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F

from perflab.devices import Device, synchronize

MakeOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class Single:
    """One device: the plain training step every other strategy must match."""

    name = "single"
    note = ""

    def __init__(self, model: nn.Module, devices: list[Device], make_optimizer: MakeOptimizer) -> None:
        self.devices = devices
        self.device = devices[0].torch
        self.model = self.wrap(model.to(self.device))
        self.optimizers = [make_optimizer(self.model.parameters())]

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        opt = self.optimizers[0]
        opt.zero_grad(set_to_none=True)
        out = self.model(x)
        loss = F.cross_entropy(out, y, reduction="sum")
        (loss / x.shape[0]).backward()
        opt.step()
        return loss.detach(), (out.argmax(1) == y).sum()

    def set_lr(self, lr: float) -> None:
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)

    @property
    def eval_model(self) -> nn.Module:
        return self.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.optimizers[0]

    def sync(self) -> None:
        synchronize(self.devices)

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return t  # one process holds every number already


class Scratch(Single):
    """Book 13.5 from scratch: a replica per device, the batch split, gradients summed on the
    first device and broadcast back (allreduce), then the same SGD step on every replica."""

    name = "scratch"

    def __init__(self, model: nn.Module, devices: list[Device], make_optimizer: MakeOptimizer) -> None:
        self.devices = devices
        self.device = devices[0].torch
        self.replicas = [copy.deepcopy(model).to(d.torch) for d in devices]
        self.model = self.replicas[0]
        self.optimizers = [make_optimizer(r.parameters()) for r in self.replicas]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = x.shape[0]
        losses, correct = [], []
        for replica, opt, d, xs, ys in zip(self.replicas, self.optimizers, self.devices,
                                          x.tensor_split(len(self.devices)), y.tensor_split(len(self.devices))):
            xs, ys = xs.to(d.torch, non_blocking=True), ys.to(d.torch, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            out = replica(xs)
            loss = F.cross_entropy(out, ys, reduction="sum")
            (loss / batch).backward()  # partial gradients: they sum to the global mean's gradient
            losses.append(loss.detach().to(self.device))
            correct.append((out.argmax(1) == ys).sum().to(self.device))
        with torch.no_grad():
            for params in zip(*(r.parameters() for r in self.replicas)):
                allreduce([p.grad for p in params])
        for opt in self.optimizers:
            opt.step()
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
            return nn.DataParallel(model, device_ids=[d.index for d in self.devices])
        self.note = "nn.DataParallel splits batches over CUDA devices only: on the CPU it runs the module once"
        # Without CUDA, nn.DataParallel is a pass-through; with CUDA it would claim the GPUs.
        return model if torch.cuda.is_available() else nn.DataParallel(model)


class DDP(Single):
    """``DistributedDataParallel`` in this worker process (one per device, started by the
    elastic launcher). Each rank gets its slice of the global batch; DDP averages gradients."""

    name = "ddp"

    def wrap(self, model: nn.Module) -> nn.Module:
        d = self.devices[0]
        return nn.parallel.DistributedDataParallel(model, device_ids=[d.index] if d.type == "cuda" else None)

    @property
    def eval_model(self) -> nn.Module:
        return self.model.module

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t


STRATEGIES = {s.name: s for s in (Single, Scratch, DataParallel, DDP)}
