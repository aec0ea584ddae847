"""The hardware (book 13.4): memory and link bandwidth, launch latency and peak matmul, measured here."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from omegaconf import MISSING

from perflab import peaks
from perflab.context import Context
from perflab.devices import Device, on_device
from perflab.schema import DTYPES, ExperimentConfig, positive, require

# Book 13.4's figures, shown beside what this machine measures.
BOOK = {
    "host_copy": (100.0, "main memory: up to 100 GB/s"),
    "device_copy": (500.0, "GDDR6 GPU memory: over 500 GB/s"),
    "host_device": (12.0, "PCIe 3.0 x16: 1 MB in ~80 us, ~12 GB/s"),
    "peer": (33.0, "NVLink: 1 MB in ~30 us, ~33 GB/s"),
    "launch": (10.0, "launching a CUDA kernel: ~10 us"),
}


@dataclass
class Config(ExperimentConfig):
    copy_mb: int = MISSING  # buffer size for memory copies
    transfer_mb: int = MISSING  # buffer size for host <-> device transfers
    launches: int = MISSING  # tiny ops per timed call, for the launch latency
    matmul_size: int = MISSING  # n for the peak matmul on a GPU ...
    cpu_matmul_size: int = MISSING  # ... and on the CPU
    dtypes: list[str] = field(default_factory=lambda: ["float32", "bfloat16", "float16"])

    def __post_init__(self) -> None:
        positive(self, "copy_mb", "transfer_mb", "launches", "matmul_size", "cpu_matmul_size")
        for d in self.dtypes:
            require(d in DTYPES, "dtypes", list(self.dtypes), ", ".join(DTYPES))


def run(ctx: Context) -> None:
    p = ctx.params
    for d in ctx.devices:
        with on_device(d):
            found = memory_copy(ctx, d, p.copy_mb)
            found |= launch_latency(ctx, d, p.launches)
            if d.type == "cuda":
                found |= host_device(ctx, d, p.transfer_mb)
            found |= peak_matmul(ctx, d, p.cpu_matmul_size if d.type == "cpu" else p.matmul_size, p.dtypes)
        if ctx.peaks_file:
            peaks.save(ctx.peaks_file, d.description(), found)
    cuda = [d for d in ctx.devices if d.type == "cuda"]
    if len(cuda) >= 2:
        peer_copy(ctx, cuda[0], cuda[1], p.transfer_mb)
    elif not cuda:
        for part in ("host <-> device transfers", "peer copy between GPUs", "CUDA graph launch latency"):
            ctx.skip(part, "needs a CUDA device")


def _book(key: str) -> dict:
    value, words = BOOK[key]
    return {"book_reference": value, "book_note": words}


def memory_copy(ctx: Context, d: Device, mb: int) -> dict[str, float]:
    src = torch.ones(mb * 2**20 // 4, device=d.torch)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 4  # read + write, as STREAM counts a copy
    where = "host" if d.type == "cpu" else "device"
    stats = ctx.measure(f"{d.name} {where} memory copy", lambda: dst.copy_(src), [d], bytes=nbytes,
                        note="bytes read + written", **_book(f"{where}_copy"))
    return {f"{where}_copy": nbytes / stats.median / 1e9}


def launch_latency(ctx: Context, d: Device, n: int) -> dict[str, float]:
    x = torch.zeros(1, device=d.torch)

    def tiny_ops() -> None:
        for _ in range(n):
            x.add_(1)

    def per_op(s) -> dict:
        us = s.median / n * 1e6
        return {"latency_us": us, "note": f"{us:.3g} us per op; " + note}

    note = "tiny kernels issued back to back, then one sync" if d.type == "cuda" else \
        "a tiny torch op on the CPU: framework overhead per op"
    if d.type != "cuda":
        stats = ctx.measure(f"{d.name} op dispatch latency", tiny_ops, [d], items=n, derive=per_op)
        return {"op_latency_us": stats.median / n * 1e6}
    stats = ctx.measure(f"{d.name} kernel launch latency", tiny_ops, [d], items=n, derive=per_op, **_book("launch"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiny_ops()
    note = "the same kernels replayed from one captured graph"
    ctx.measure(f"{d.name} kernel launch latency (CUDA graph)", graph.replay, [d], items=n, derive=per_op,
                **_book("launch"))
    return {"launch_latency_us": stats.median / n * 1e6}


def host_device(ctx: Context, d: Device, mb: int) -> dict[str, float]:
    found = {}
    dev = torch.ones(mb * 2**20 // 4, device=d.torch)
    for kind in ("pageable", "pinned"):
        host = torch.ones(dev.numel(), pin_memory=kind == "pinned")
        nbytes = host.numel() * 4
        up = ctx.measure(f"{d.name} host -> device ({kind})", lambda h=host: dev.copy_(h, non_blocking=True), [d],
                         bytes=nbytes, **_book("host_device"))
        down = ctx.measure(f"{d.name} device -> host ({kind})", lambda h=host: h.copy_(dev, non_blocking=True), [d],
                           bytes=nbytes, **_book("host_device"))
        found[f"h2d_{kind}"], found[f"d2h_{kind}"] = nbytes / up.median / 1e9, nbytes / down.median / 1e9
    return found


def peer_copy(ctx: Context, a: Device, b: Device, mb: int) -> None:
    src = torch.ones(mb * 2**20 // 4, device=a.torch)
    dst = torch.empty_like(src, device=b.torch)
    ctx.measure(f"{a.name} -> {b.name} copy", lambda: dst.copy_(src, non_blocking=True), [a, b],
                bytes=src.numel() * 4, **_book("peer"))


def peak_matmul(ctx: Context, d: Device, n: int, dtypes: list[str]) -> dict[str, float]:
    found = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        if d.type == "cpu" and dtype == torch.float16:
            ctx.skip(f"{d.name} peak matmul {name}", "float16 matmul on the CPU is emulated: no peak to speak of")
            continue
        a, b = (torch.randn(n, n, device=d.torch).to(dtype) for _ in range(2))
        tf32 = [False, True] if d.type == "cuda" and dtype == torch.float32 else [None]
        for allow in tf32:
            label = name if allow is None else ("tf32" if allow else "float32 (no tf32)")
            before = torch.backends.cuda.matmul.allow_tf32
            if allow is not None:
                torch.backends.cuda.matmul.allow_tf32 = allow
            try:
                stats = ctx.measure(f"{d.name} peak matmul {label}", lambda: torch.mm(a, b), [d], flops=2 * n**3,
                                    derive=lambda s: {"peak_tflops": 2 * n**3 / s.min / 1e12},
                                    note=f"{n}x{n}; the peak is the best sample")
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before
            found["matmul_" + ("tf32" if allow else name)] = 2 * n**3 / stats.min / 1e12
    return found
