"""The hardware (book 13.4): memory and link bandwidth, launch latency and peak matmul, measured here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.experiment import DTYPES, MISSING, ExperimentConfig, positive, some_of

if TYPE_CHECKING:
    from perflab.experiment import Context

METRIC = "median_s"
WRITES_PEAKS = True  # results.peaks: later rows on the same device get pct_of_peak


@dataclass
class Config(ExperimentConfig):
    copy_mb: int = MISSING  # buffer size for memory copies
    transfer_mb: int = MISSING  # buffer size for host <-> device transfers
    launches: int = MISSING  # tiny ops per timed call, for the launch latency
    matmul_size: int = MISSING  # n for the peak matmul on a GPU ...
    cpu_matmul_size: int = MISSING  # ... and on the CPU
    dtypes: list[str] = MISSING

    def __post_init__(self) -> None:
        positive(self, "copy_mb", "transfer_mb", "launches", "matmul_size", "cpu_matmul_size")
        some_of(self, "dtypes", DTYPES)


def run(ctx: Context) -> None:
    from perflab.experiment import on_device

    p = ctx.params
    for d in ctx.devices:
        with on_device(d):
            found = memory_copy(ctx, d, p.copy_mb)
            found |= launch_latency(ctx, d, p.launches)
            if d.type == "cuda":
                found |= host_device(ctx, d, p.transfer_mb)
            found |= peak_matmul(ctx, d, p.cpu_matmul_size if d.type == "cpu" else p.matmul_size, p.dtypes)
        ctx.peaks.save(d.description(), found)
    cuda = [d for d in ctx.devices if d.type == "cuda"]
    if len(cuda) >= 2:
        peer_copy(ctx, cuda[0], cuda[1], p.transfer_mb)
    elif not cuda:
        for part in ("host <-> device transfers", "peer copy between GPUs", "CUDA graph launch latency"):
            ctx.skip(part, "needs a CUDA device")


def _book(key: str) -> dict:
    """The book's figure for what a row measures (book_reference, book_note columns)."""
    from perflab.book.hardware import BOOK

    value, words = BOOK[key]
    return {"book_reference": value, "book_note": words}


def memory_copy(ctx: Context, d: Any, mb: int) -> dict[str, float]:
    import torch

    src = torch.ones(mb * 2**20 // 4, device=d.torch)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 4  # read + write, as STREAM counts a copy
    where = "host" if d.type == "cpu" else "device"
    stats = ctx.measure(
        f"{d.name} {where} memory copy",
        lambda: dst.copy_(src),
        [d],
        bytes=nbytes,
        note="bytes read + written",
        **_book(f"{where}_copy"),
    )
    return {f"{where}_copy": nbytes / stats.median / 1e9}


def launch_latency(ctx: Context, d: Any, n: int) -> dict[str, float]:
    import torch

    from perflab.experiment import Part

    x = torch.zeros(1, device=d.torch)

    def tiny_ops() -> None:
        for _ in range(n):
            x.add_(1)

    def per_op(note: str) -> Any:
        def derive(s: Any) -> dict:
            us = s.median / n * 1e6
            return {"latency_us": us, "note": f"{us:.3g} us per op; {note}"}

        return derive

    unit = {"items_unit": "ops"}
    if d.type != "cuda":
        stats = ctx.measure(
            f"{d.name} op dispatch latency",
            tiny_ops,
            [d],
            items=n,
            **unit,
            derive=per_op("a tiny torch op on the CPU: framework overhead per op"),
        )
        return {"op_latency_us": stats.median / n * 1e6}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiny_ops()
    stats = ctx.measure_rounds(
        {
            f"{d.name} kernel launch latency": Part(
                tiny_ops,
                [d],
                items=n,
                extra={**unit, **_book("launch")},
                derive=per_op("tiny kernels issued back to back, then one sync"),
            ),
            f"{d.name} kernel launch latency (CUDA graph)": Part(
                graph.replay,
                [d],
                items=n,
                extra={**unit, **_book("launch")},
                derive=per_op("the same kernels replayed from one captured graph"),
            ),
        }
    )
    return {"launch_latency_us": stats[f"{d.name} kernel launch latency"].median / n * 1e6}


def host_device(ctx: Context, d: Any, mb: int) -> dict[str, float]:
    import torch

    from perflab.experiment import Part

    dev = torch.ones(mb * 2**20 // 4, device=d.torch)
    hosts = {kind: torch.ones(dev.numel(), pin_memory=kind == "pinned") for kind in ("pageable", "pinned")}
    nbytes = dev.numel() * 4
    parts = {}
    for kind, host in hosts.items():
        parts[f"{d.name} host -> device ({kind})"] = Part(
            lambda h=host: dev.copy_(h, non_blocking=True), [d], bytes=nbytes, extra=_book("host_device")
        )
        parts[f"{d.name} device -> host ({kind})"] = Part(
            lambda h=host: h.copy_(dev, non_blocking=True), [d], bytes=nbytes, extra=_book("host_device")
        )
    stats = ctx.measure_rounds(parts)
    found = {}
    for kind in hosts:
        found[f"h2d_{kind}"] = nbytes / stats[f"{d.name} host -> device ({kind})"].median / 1e9
        found[f"d2h_{kind}"] = nbytes / stats[f"{d.name} device -> host ({kind})"].median / 1e9
    return found


def peer_copy(ctx: Context, a: Any, b: Any, mb: int) -> None:
    import torch

    src = torch.ones(mb * 2**20 // 4, device=a.torch)
    dst = torch.empty_like(src, device=b.torch)
    ctx.measure(
        f"{a.name} -> {b.name} copy",
        lambda: dst.copy_(src, non_blocking=True),
        [a, b],
        bytes=src.numel() * 4,
        **_book("peer"),
    )


def peak_matmul(ctx: Context, d: Any, n: int, dtypes: list[str]) -> dict[str, float]:
    import torch

    from perflab.measure.precision import applied

    found = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        if d.type == "cpu" and dtype == torch.float16:
            ctx.skip(f"{d.name} peak matmul {name}", "float16 matmul on the CPU is emulated: no peak to speak of")
            continue
        a, b = (torch.randn(n, n, device=d.torch).to(dtype) for _ in range(2))
        modes = (
            [("float32 (no tf32)", "fp32", "float32"), ("tf32", "tf32", "tf32")]
            if d.type == "cuda" and dtype == torch.float32
            else [(name, "fp32", name)]
        )
        for label, precision, key in modes:
            with applied(precision, d.type):
                stats = ctx.measure(
                    f"{d.name} peak matmul {label}",
                    lambda a=a, b=b: torch.mm(a, b),
                    [d],
                    flops=2 * n**3,
                    dtype=key,
                    derive=lambda s: {"peak_tflops": 2 * n**3 / s.min / 1e12},
                    note=f"{n}x{n}; the peak is the best sample",
                )
            found[f"matmul_{key}"] = 2 * n**3 / stats.min / 1e12
            found[f"matmul_{key}_n"] = n  # the size it was measured at (perflab.measure.peaks)
    return found


def work(rows: Sequence[Mapping[str, Any]]) -> str:
    """How much work each sample timed, on the device the rows ran on."""
    from perflab.experiment import number

    r = rows[0] if rows else {}
    gpu = any(str(x.get("devices", "")).startswith("cuda") for x in rows)
    n = number(r.get("cfg.experiment.matmul_size" if gpu else "cfg.experiment.cpu_matmul_size"))
    copy, ops = number(r.get("cfg.experiment.copy_mb")), number(r.get("cfg.experiment.launches"))
    if n is None or copy is None or ops is None:
        return ""
    return (
        f"work per sample: a copy of {copy:.0f} MiB, {ops:.0f} tiny ops, one {n:.0f}² matmul per dtype; "
        "the book (13.4) gives figures, not a setup"
    )


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.experiment import number

    lines: list[str] = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        ref, value = number(r.get("book_reference")), number(r.get("gbps"))
        if value is None and number(r.get("latency_us")) is not None:
            value = number(r.get("latency_us"))
        if ref is not None and value is not None:
            unit = "us" if "latency" in str(r["measurement"]) else "GB/s"
            lines.append(f"{r['measurement']}: {value:.3g} {unit} here; {r.get('book_note')}")
        elif number(r.get("peak_tflops")) is not None:
            lines.append(f"{r['measurement']}: {float(r['peak_tflops']):.3g} TFLOP/s")
    return lines
