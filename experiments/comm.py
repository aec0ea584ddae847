"""Communication (book 13.7): allreduce measured over a process group, beside the PS/ring cost model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.experiment import (
    BACKENDS,
    MISSING,
    ConfigError,
    ExperimentConfig,
    PerflabConfig,
    human_bytes,
    one_of,
    positive,
    require,
)
from perflab.measure import costmodel

if TYPE_CHECKING:
    from perflab.experiment import Context, Device

METRIC = "bus_gbps"
SIZES = ["cfg.experiment.min_bytes", "cfg.experiment.max_bytes"]  # the message sizes a run spans


@dataclass
class Config(ExperimentConfig):
    min_bytes: int = MISSING  # message sizes: min_bytes, x4, ... up to max_bytes
    max_bytes: int = MISSING
    backend: str = MISSING  # auto (nccl on GPUs, gloo on the CPU) | gloo | nccl
    cpu_workers: int = MISSING  # CPU-only machine with devices.spec=auto: this many gloo workers
    link_gbps: float = MISSING  # the model's link bandwidth for the measured rows (GB/s)
    latency_us: float = MISSING  # the model's per-transfer latency (us)

    def __post_init__(self) -> None:
        positive(self, "min_bytes", "max_bytes", "cpu_workers")
        require(
            self.max_bytes >= self.min_bytes, "max_bytes", self.max_bytes, f"an integer >= min_bytes ({self.min_bytes})"
        )
        one_of(self, "backend", BACKENDS)
        require(self.link_gbps > 0, "link_gbps", self.link_gbps, "a number > 0")
        require(self.latency_us >= 0, "latency_us", self.latency_us, "a number >= 0")


def check(settings: PerflabConfig, devices: Sequence[Device]) -> None:
    """Workers the machine can run, of one kind, NCCL only on GPUs: before anything runs."""
    from perflab.experiment import check_cpu_split

    p: Any = settings.experiment
    check_cpu_split(settings, devices, p.cpu_workers)
    if len({d.type for d in devices}) > 1:
        raise ConfigError("devices.spec", [d.name for d in devices], "devices of one kind for comm")
    if p.backend == "nccl" and devices[0].type != "cuda":
        raise ConfigError("experiment.backend", "nccl", "auto or gloo on CPU workers", problem="NCCL needs GPUs")


def run(ctx: Context) -> None:
    from perflab.experiment import split_cpu_if_fallback

    p = ctx.params
    for case in costmodel.book_cases():
        ctx.record(
            f"model: {case.name}",
            model_s=case.model_s,
            book_s=case.book_s,
            note=f"model {case.model_s * 1e3:.3g} ms; book {case.book_s * 1e3:g} ms",
        )
    split_cpu_if_fallback(ctx, p.cpu_workers)
    if len(ctx.devices) < 2:
        ctx.skip("allreduce", "needs 2 or more workers (devices.count=2)")
        return
    ctx.launch_workers(_worker, nproc=len(ctx.devices))


def message_sizes(lo: int, hi: int) -> list[int]:
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= 4
    return sizes


def _worker(ctx: Context) -> None:
    """In each worker: time allreduce of each size; a collective ends when its slowest rank
    does, so each sample is the maximum over ranks (every rank starts it after a barrier)."""
    import contextlib

    import torch
    import torch.distributed as dist

    from perflab.cluster import workers
    from perflab.measure import bench

    p, b = ctx.params, ctx.settings.bench
    rank, world, local = workers.init_process_group(ctx.devices, p.backend)
    device = ctx.devices[local]
    bandwidth, latency = p.link_gbps * 1e9, p.latency_us * 1e-6

    @contextlib.contextmanager
    def after_barrier(name: str) -> Any:
        dist.barrier()
        yield

    try:
        for nbytes in message_sizes(p.min_bytes, p.max_bytes):
            t = torch.ones(max(1, nbytes // 4), device=device.torch)
            # Every rank takes the same number of samples (no min_time_s): collectives go in lockstep.
            mine = bench.measure(
                lambda t=t: dist.all_reduce(t),
                [device],
                warmup=b.warmup,
                repeats=b.repeats,
                timer="wall_sync",
                around=after_barrier,
            )
            slowest = torch.tensor(mine.samples, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank != 0:
                continue
            stats = bench.stats_of(slowest.tolist(), mine.warmup, noise_threshold=b.noise_threshold)
            size = t.numel() * 4
            ring = costmodel.ring_s(size, world, bandwidth, latency=latency)
            ctx.record(
                f"allreduce {human_bytes(size)}",
                stats,
                devices=ctx.devices,
                bytes_per_rank=size,
                world_size=world,
                backend=dist.get_backend(),
                gbps=size / stats.median / 1e9,
                bus_gbps=costmodel.bus_bandwidth(size, stats.median, world) / 1e9,
                model_ring_s=ring,
                model_one_device_s=costmodel.aggregate_on_one_device_s(size, world, bandwidth, latency),
                model_split_s=costmodel.split_n_ways_s(size, world, bandwidth, latency),
                suspect=stats.suspect,
                note=f"ring model {ring * 1e3:.3g} ms at {p.link_gbps:g} GB/s; each sample: the slowest rank",
            )
    finally:
        dist.destroy_process_group()


def work(rows: Sequence[Mapping[str, Any]]) -> str:
    """How much each timed allreduce moved, beside the book's worked example."""
    from perflab.experiment import number

    r = rows[0] if rows else {}
    lo, hi = number(r.get("cfg.experiment.min_bytes")), number(r.get("cfg.experiment.max_bytes"))
    if lo is None or hi is None:
        return ""
    sizes = message_sizes(int(lo), int(hi))
    return (
        f"work per sample: one allreduce of {human_bytes(sizes[0])} to {human_bytes(sizes[-1])} per rank "
        f"({len(sizes)} sizes); the book: {costmodel.BOOK_GRADIENTS / 1e6:.0f} MB of gradients"
    )


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.experiment import number

    lines: list[str] = []
    measured = [r for r in rows if str(r.get("measurement", "")).startswith("allreduce ") and r.get("status") == "ok"]
    if not measured:
        return lines
    best = max(measured, key=lambda r: number(r.get("bus_gbps")) or 0)
    return lines + [
        f"allreduce over {number(best.get('world_size')) or 0:g} {best.get('backend')} workers: bus bandwidth up to "
        f"{number(best.get('bus_gbps')) or 0:.3g} GB/s ({best['measurement'].removeprefix('allreduce ')} messages)",
        "cost model: book 13.7's worked example reproduced (model: rows; 60 / 80 / 15 ms; ring ~6 ms)",
    ]
