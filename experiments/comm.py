"""Communication (book 13.7): allreduce measured over a process group, beside the PS/ring cost model."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from omegaconf import MISSING

from perflab import costmodel, launch
from perflab.bench import Stats
from perflab.context import Context
from perflab.devices import synchronize
from perflab.errors import ConfigError
from perflab.parallel import cpu_workers_if_fallback
from perflab.schema import ExperimentConfig, positive, require


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
        require(self.max_bytes >= self.min_bytes, "max_bytes", self.max_bytes, f"an integer >= min_bytes ({self.min_bytes})")
        require(self.backend in ("auto", "gloo", "nccl"), "backend", self.backend, "auto, gloo, nccl")
        require(self.link_gbps > 0, "link_gbps", self.link_gbps, "a number > 0")
        require(self.latency_us >= 0, "latency_us", self.latency_us, "a number >= 0")


def run(ctx: Context) -> None:
    p = ctx.params
    for case in costmodel.book_cases():
        ctx.record(f"model: {case.name}", model_s=case.model_s, book_s=case.book_s,
                   note=f"model {case.model_s * 1e3:.3g} ms; book {case.book_s * 1e3:g} ms")
    cpu_workers_if_fallback(ctx, p.cpu_workers)
    if len({d.type for d in ctx.devices}) > 1:
        raise ConfigError("devices.spec", ctx.resolved.names, "devices of one kind for comm")
    if len(ctx.devices) < 2:
        ctx.skip("allreduce", "needs 2 or more workers (devices.count=2)")
        return
    launch.elastic(_worker, ctx, nproc=len(ctx.devices), run_id=ctx.base_row["run_id"].replace("/", "-"))


def message_sizes(lo: int, hi: int) -> list[int]:
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= 4
    return sizes


def _worker(ctx: Context) -> None:
    p, bench = ctx.params, ctx.settings.bench
    rank, world, local = launch.init_process_group(ctx.devices, p.backend)
    if rank == 0:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = ctx.devices[local]
    bandwidth, latency = p.link_gbps * 1e9, p.latency_us * 1e-6
    try:
        for nbytes in message_sizes(p.min_bytes, p.max_bytes):
            t = torch.ones(max(1, nbytes // 4), device=device.torch)
            warm = [_timed_allreduce(t, device) for _ in range(bench.warmup)]
            times = torch.tensor([_timed_allreduce(t, device) for _ in range(bench.repeats)], dtype=torch.float64)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
            if rank != 0:
                continue
            stats = Stats(times.tolist(), "wall_sync", warm, torch.get_num_threads(),
                          noise_threshold=bench.noise_threshold)
            size = t.numel() * 4
            ctx.record(f"allreduce {_human_bytes(size)}", stats, devices=ctx.devices, bytes_per_rank=size,
                       world_size=world, backend=dist.get_backend(), gbps=size / stats.median / 1e9,
                       bus_gbps=costmodel.bus_bandwidth(size, stats.median, world) / 1e9,
                       model_ring_s=costmodel.ring_s(size, world, bandwidth, latency=latency),
                       model_one_device_s=costmodel.aggregate_on_one_device_s(size, world, bandwidth, latency),
                       model_split_s=costmodel.split_n_ways_s(size, world, bandwidth, latency),
                       note=f"ring model {costmodel.ring_s(size, world, bandwidth, latency=latency) * 1e3:.3g} ms "
                            f"at {p.link_gbps:g} GB/s")
    finally:
        dist.destroy_process_group()


def _timed_allreduce(t: torch.Tensor, device) -> float:
    dist.barrier()
    synchronize([device])
    t0 = time.perf_counter()
    dist.all_reduce(t)
    synchronize([device])
    return time.perf_counter() - t0


def _human_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.3g} {unit}"
