"""Asynchronous execution (book 13.2): NumPy vs torch, host dispatch time vs device time, and
what a per-step ``.item()`` costs a training loop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F
from omegaconf import MISSING

from perflab.context import Context
from perflab.devices import on_device
from perflab.schema import ExperimentConfig, positive
from perflab.train import models

CPU_NOTE = "CPU ops run synchronously: the time without a sync already includes the compute"


@dataclass
class Config(ExperimentConfig):
    size: int = MISSING   # n x n random matrix per step
    steps: int = MISSING  # steps of (randn + matmul) per timed call
    train_steps: int = MISSING  # LeNet SGD steps per timed call in the training A/B
    train_batch: int = MISSING

    def __post_init__(self) -> None:
        positive(self, "size", "steps", "train_steps", "train_batch")


def run(ctx: Context) -> None:
    p = ctx.params
    flops = 2 * p.size**3 * p.steps
    rng = np.random.default_rng(ctx.settings.seed)

    def numpy_steps() -> None:
        for _ in range(p.steps):
            a = rng.standard_normal((p.size, p.size), dtype=np.float32)
            a @ a

    ctx.measure("numpy (CPU)", numpy_steps, [], flops=flops, items=p.steps, device_name="host CPU (NumPy)",
                note="float32 on the host CPU, NumPy's own threads")

    for d in ctx.devices:
        def torch_steps(device: torch.device = d.torch) -> None:
            for _ in range(p.steps):
                a = torch.normal(0.0, 1e-3, size=(p.size, p.size), device=device)
                torch.mm(a, a)

        note = CPU_NOTE if d.type == "cpu" else ""
        with on_device(d):
            ctx.measure(f"torch {d.name}, no sync (host dispatch)", torch_steps, [d], sync=False, items=p.steps,
                        note=note or "host time to queue the work; the device may still be running it")
            ctx.measure(f"torch {d.name}, synced (device time)", torch_steps, [d], flops=flops, items=p.steps,
                        note=note or "the device is synchronized before the clock is read")
            training_ab(ctx, d, p.train_steps, p.train_batch, note)


def training_ab(ctx: Context, d, steps: int, batch: int, cpu_note: str) -> None:
    """LeNet SGD steps left free-running vs forced to sync by ``loss.item()`` after each step."""
    torch.manual_seed(ctx.settings.seed)
    model = models.build("lenet").to(d.torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 1, 28, 28, device=d.torch)
    y = torch.randint(0, 10, (batch,), device=d.torch)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def free_running() -> None:
        for _ in range(steps):
            step()

    def item_every_step() -> None:
        for _ in range(steps):
            step().item()  # a host read: waits for the device every step

    label = f"lenet {d.name} x{steps} steps"
    ctx.measure(f"{label}, free-running (host dispatch)", free_running, [d], sync=False, items=steps * batch,
                note=cpu_note or "host time to queue the steps")
    free = ctx.measure(f"{label}, free-running (device time)", free_running, [d], items=steps * batch,
                       note=cpu_note or "synchronized once at the end").median
    ctx.measure(f"{label}, .item() every step", item_every_step, [d], items=steps * batch,
                derive=lambda s: {"slowdown_vs_free": s.median / free},
                note=cpu_note or "the host waits for the device after every step")
