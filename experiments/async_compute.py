"""Asynchronous execution (book 13.2): NumPy vs torch, host dispatch time vs device time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import MISSING

from perflab.context import Context
from perflab.devices import on_device
from perflab.schema import ExperimentConfig, positive

CPU_NOTE = "CPU ops run synchronously: the time without a sync already includes the compute"


@dataclass
class Config(ExperimentConfig):
    size: int = MISSING   # n x n random matrix per step
    steps: int = MISSING  # steps of (randn + matmul) per timed call

    def __post_init__(self) -> None:
        positive(self, "size", "steps")


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
