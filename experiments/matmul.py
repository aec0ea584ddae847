"""Matrix-multiply throughput: each device alone, then all devices issued together (TFLOP/s).

The template for an experiment of your own: a ``Config`` of its knobs and ``run(ctx)`` that
measures, both from :mod:`perflab.experiment`; the book's section and claims on it live in
:mod:`perflab.book.matmul`, beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.experiment import DTYPES, MISSING, ExperimentConfig, number, one_of, positive

if TYPE_CHECKING:
    from perflab.experiment import Context

METRIC = "tflops"
COUNTS_INSTRUCTIONS = True  # bench.instructions=true: its call, said as source text, is counted


@dataclass
class Config(ExperimentConfig):
    size: int = MISSING  # n for n x n @ n x n
    iterations: int = MISSING  # matmuls per timed call
    dtype: str = MISSING

    def __post_init__(self) -> None:
        positive(self, "size", "iterations")
        one_of(self, "dtype", DTYPES)


def run(ctx: Context) -> None:
    import torch

    from perflab.experiment import Counted, alone_then_together

    p = ctx.params
    dtype = getattr(torch, p.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    # per device: two float32 randn operands, their copies in dtype (unless float32), the product
    ctx.need_memory(
        p.size**2 * (2 * 4 + (2 * itemsize if itemsize != 4 else 0) + itemsize), f"{p.size}x{p.size} matmuls"
    )
    operands = {
        d.name: (
            torch.randn(p.size, p.size, device=d.torch).to(dtype),
            torch.randn(p.size, p.size, device=d.torch).to(dtype),
        )
        for d in ctx.devices
    }

    def work(d) -> None:
        a, b = operands[d.name]
        for _ in range(p.iterations):
            torch.mm(a, b)

    alone_then_together(
        ctx,
        work,
        flops=2 * p.size**3 * p.iterations,
        items=p.iterations,
        unit="matmuls",
        dtype=p.dtype,
        columns={"intensity": 2 * p.size / (3 * itemsize)},  # 2n^3 FLOPs over 3 n^2 elements moved (estimated)
        count=Counted(  # the same call, for callgrind (a fresh python: its operands built in the setup)
            stmt=f"for _ in range({p.iterations}):\n    torch.mm(a, b)",
            setup=f"import torch\na = torch.randn({p.size}, {p.size}).to(torch.{p.dtype})\nb = a.clone()",
        ),
    )


def work(rows: Sequence[Mapping[str, Any]]) -> str:
    """How much work each timed call did."""
    r = rows[0] if rows else {}
    n, k = number(r.get("cfg.experiment.size")), number(r.get("cfg.experiment.iterations"))
    if n is None or k is None:
        return ""
    return f"work per call: {k:.0f} x {n:.0f}² {r.get('cfg.experiment.dtype', '')} matmuls per device"


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.experiment import concurrency_headline

    return concurrency_headline(rows, "TFLOP/s", "tflops")
