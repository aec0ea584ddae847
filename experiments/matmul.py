"""Matrix-multiply throughput: each device alone, then all devices issued together (TFLOP/s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from omegaconf import MISSING

from perflab.contract import Figure, Samples, Section
from perflab.schema import DTYPES, ExperimentConfig, one_of, positive

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.context import Context

METRIC = "tflops"


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

    from perflab.parallel import alone_then_together

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
    )


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.parallel import concurrency_headline

    return concurrency_headline(rows, "TFLOP/s", "tflops")


def report(rows: DataFrame, samples: Samples) -> Section:
    """Beside 13.3: the same alone-vs-together question on plain matmuls, in TFLOP/s."""
    from perflab import plots
    from perflab.frames import with_samples

    return Section(
        number="13.3",
        title="Automatic parallelism: matmul throughput",
        figures=[
            Figure(
                "alone_together",
                plots.alone_together,
                with_samples(rows, samples, "tflops" if "tflops" in rows else "median_s"),
                caption="Error bars: interquartile range of the raw samples.",
                why_none="alone vs together: no ok alone/together rows",
            )
        ],
        notes=["Its points are drawn on the roofline of the hardware section (13.4) when the tree holds its rows."],
    )
