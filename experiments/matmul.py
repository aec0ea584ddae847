"""Matrix-multiply throughput: each device alone, then all devices issued together (TFLOP/s)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import MISSING

from perflab.context import Context
from perflab.devices import Device
from perflab.parallel import alone_then_together
from perflab.schema import DTYPES, ExperimentConfig, one_of, positive


@dataclass
class Config(ExperimentConfig):
    size: int = MISSING        # n for n x n @ n x n
    iterations: int = MISSING  # matmuls per timed call
    dtype: str = MISSING

    def __post_init__(self) -> None:
        positive(self, "size", "iterations")
        one_of(self, "dtype", DTYPES)


def run(ctx: Context) -> None:
    p = ctx.params
    dtype = getattr(torch, p.dtype)
    operands = {d.name: (torch.randn(p.size, p.size, device=d.torch).to(dtype),
                         torch.randn(p.size, p.size, device=d.torch).to(dtype)) for d in ctx.devices}

    def work(d: Device) -> None:
        a, b = operands[d.name]
        for _ in range(p.iterations):
            torch.mm(a, b)

    alone_then_together(ctx, work, flops=2 * p.size**3 * p.iterations, items=p.iterations, peak=f"matmul_{p.dtype}")
