"""Automatic parallelism (book 13.3): devices alone vs together, and compute/copy overlap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.experiment import MISSING, ExperimentConfig, PerflabConfig, positive

if TYPE_CHECKING:
    from perflab.experiment import Context, Device

METRIC = "median_s"
COPY_NEEDS_GPU = "needs a CUDA device: on a CPU-only machine there is no device-to-host copy to overlap"


@dataclass
class Config(ExperimentConfig):
    size: int = MISSING  # N for K matmuls of N x N on a GPU (book: 4000)
    matmuls: int = MISSING  # K (book: 50)
    cpu_size: int = MISSING  # the same on CPU workers, sized to finish quickly
    cpu_matmuls: int = MISSING
    cpu_workers: int = MISSING  # CPU-only machine with devices.spec=auto: split the CPU this many ways

    def __post_init__(self) -> None:
        positive(self, "size", "matmuls", "cpu_size", "cpu_matmuls", "cpu_workers")


def check(settings: PerflabConfig, devices: Sequence[Device]) -> None:
    """``experiment.cpu_workers`` the machine can run: before anything runs."""
    from perflab.experiment import check_cpu_split

    p: Any = settings.experiment
    check_cpu_split(settings, devices, p.cpu_workers)


def run(ctx: Context) -> None:
    import torch

    from perflab.experiment import alone_then_together, on_device, split_cpu_if_fallback

    p = ctx.params
    split_cpu_if_fallback(ctx, p.cpu_workers)
    on_gpu = all(d.type == "cuda" for d in ctx.devices)
    n, k = (p.size, p.matmuls) if on_gpu else (p.cpu_size, p.cpu_matmuls)
    ctx.need_memory((k + 1) * n * n * 4, f"{k} products of {n}x{n} float32 matrices")  # x and its k products
    x = {d.name: torch.rand(n, n, device=d.torch) for d in ctx.devices}

    def run_matmuls(d) -> list:
        return [x[d.name].mm(x[d.name]) for _ in range(k)]

    alone_then_together(
        ctx,
        run_matmuls,
        flops=2 * n**3 * k,
        items=k,
        unit="matmuls",
        dtype="float32",
        columns={"intensity": 2 * n / (3 * 4)},
    )  # FLOP/byte, estimated

    gpu = next((d for d in ctx.devices if d.type == "cuda"), None)
    if gpu is None:
        ctx.skip("compute + copy to CPU", COPY_NEEDS_GPU)
        return
    with on_device(gpu):
        compute_and_copy(ctx, gpu, x[gpu.name], k)


def compute_and_copy(ctx: Context, gpu, x, k: int) -> None:
    """Compute K products, copy them to pinned host memory: one after the other vs overlapped.

    Overlap needs a second stream: each copy waits only for its own product (an event),
    so copies of early results run while later products are still being computed.
    """
    import torch

    from perflab.experiment import Part

    nbytes = x.numel() * x.element_size() * k
    host = [torch.empty_like(x, device="cpu").pin_memory() for _ in range(k)]
    copy_stream = torch.cuda.Stream(gpu.index)

    def compute() -> list:
        return [x.mm(x) for _ in range(k)]

    results = compute()

    def copy(ys: list = results) -> None:
        for y, h in zip(ys, host):
            h.copy_(y, non_blocking=True)

    def sequential() -> None:
        copy(compute())

    def overlapped() -> None:
        main = torch.cuda.current_stream(gpu.index)
        for h in host:
            y = x.mm(x)
            done = torch.cuda.Event()
            done.record(main)
            with torch.cuda.stream(copy_stream):
                copy_stream.wait_event(done)
                h.copy_(y, non_blocking=True)
                y.record_stream(copy_stream)
        main.wait_stream(copy_stream)  # so a timer on the main stream (CUDA events) waits for the copies

    n = x.shape[0]
    parts = {
        f"{gpu.name} compute": Part(compute, [gpu], flops=2 * n**3 * k),
        f"{gpu.name} copy to pinned CPU": Part(copy, [gpu], bytes=nbytes),
        f"{gpu.name} compute, then copy": Part(sequential, [gpu]),
        f"{gpu.name} compute + copy overlapped": Part(
            overlapped,
            [gpu],
            extra={"note": "copies on a second stream into pinned memory, each after its own product"},
        ),
    }

    def overlap(stats: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        parts_s = stats[f"{gpu.name} compute"].median + stats[f"{gpu.name} copy to pinned CPU"].median
        over = stats[f"{gpu.name} compute + copy overlapped"].median
        return {
            f"{gpu.name} compute, then copy": {"sum_parts_s": parts_s},
            f"{gpu.name} compute + copy overlapped": {"sum_parts_s": parts_s, "overlap_speedup": parts_s / over},
        }

    ctx.measure_rounds(parts, relate=overlap)


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.experiment import concurrency_headline, number

    lines = concurrency_headline(rows, "TFLOP/s", "tflops")
    for r in rows:
        if str(r.get("measurement", "")).endswith("overlapped") and r.get("status") == "ok":
            lines.append(
                f"compute + copy: overlapped {number(r.get('overlap_speedup')) or 0:.2f}x faster than their sum"
            )
    return lines
