"""Communication (book 13.7): allreduce measured over a process group, beside the PS/ring cost model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.config.contract import Figure, Samples, Section, Table
from perflab.config.schema import BACKENDS, MISSING, ExperimentConfig, PerflabConfig, one_of, positive, require
from perflab.errors import ConfigError
from perflab.measure import costmodel

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.analysis.claims import Claim, Tree
    from perflab.job.context import Context
    from perflab.measure.devices import Device
    from perflab.measure.sizing import Machine, Point

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
    from perflab.measure.alone_together import check_cpu_split

    p: Any = settings.experiment
    check_cpu_split(settings, devices, p.cpu_workers)
    if len({d.type for d in devices}) > 1:
        raise ConfigError("devices.spec", [d.name for d in devices], "devices of one kind for comm")
    if p.backend == "nccl" and devices[0].type != "cuda":
        raise ConfigError("experiment.backend", "nccl", "auto or gloo on CPU workers", problem="NCCL needs GPUs")


def run(ctx: Context) -> None:
    from perflab.measure.alone_together import split_cpu_if_fallback

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
                f"allreduce {_human_bytes(size)}",
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


def _human_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:.3g} {unit}"


def work(rows: Sequence[Mapping[str, Any]]) -> str:
    """How much each timed allreduce moved, beside the book's worked example."""
    from perflab.store.rows import number

    r = rows[0] if rows else {}
    lo, hi = number(r.get("cfg.experiment.min_bytes")), number(r.get("cfg.experiment.max_bytes"))
    if lo is None or hi is None:
        return ""
    sizes = message_sizes(int(lo), int(hi))
    return (
        f"work per sample: one allreduce of {_human_bytes(sizes[0])} to {_human_bytes(sizes[-1])} per rank "
        f"({len(sizes)} sizes); the book: {costmodel.BOOK_GRADIENTS / 1e6:.0f} MB of gradients"
    )


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.store.rows import number

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


def report(rows: DataFrame, samples: Samples) -> Section:
    """13.7: the book's worked example beside the cost model; measured allreduce beside the ring model."""
    from perflab.analysis import plots
    from perflab.analysis.frames import measured, records, text
    from perflab.analysis.table import human_time
    from perflab.experiments import _book

    seen, book = set(), []
    for r in records(measured(rows, prefix="model: ")):
        key = (r.get("measurement"), r.get("model_s"), r.get("book_s"))
        if key not in seen:
            seen.add(key)
            case = str(r["measurement"]).removeprefix("model: ")
            book.append([case, human_time(r.get("book_s")), human_time(r.get("model_s"))])
    ring = []
    for r in records(measured(rows, prefix="allreduce ")):
        if r.get("model_ring_s") is not None:
            link = text(r.get("cfg.experiment.link_gbps"))
            ring.append(
                [
                    str(r["measurement"]),
                    f"{r.get('world_size', '')} x {r.get('backend', '')}",
                    human_time(r.get("median_s")),
                    human_time(r.get("model_ring_s")) + (f" at {link} GB/s" if link else ""),
                ]
            )
    tables = []
    if book:
        intro = (
            "Book 13.7's worked example (160 MB of gradients; PCIe at 16 GB/s; NVLink at 18 GB/s a link, V100s): "
            "its figures beside the cost model's."
        )
        tables.append(Table(["case", "the book", "the cost model"], book, intro))
    if ring:
        intro = "Measured here beside the ring model at the configured link (experiment.link_gbps):"
        tables.append(Table(["allreduce", "workers", "measured (median)", "ring model"], ring, intro))
    return Section(
        number="13.7",
        title="Parameter servers",
        reference=_book.REFERENCE,
        tables=tables,
        figures=[
            Figure(
                "allreduce",
                plots.allreduce,
                measured(rows, prefix="allreduce ").drop(columns=SIZES, errors="ignore"),  # the x axis
                why_none="allreduce: no ok allreduce rows (it needs 2 or more workers: devices.count=2)",
            )
        ],
    )


# --- the chapter (perflab chapter): its size and its claims -----------------------------------

CHAPTER_SHARE = 0.08
START_S = 8.0  # starting two worker processes (each imports torch) and their process group, on 2 busy cores
BOOK_RING = "13.7: ring allreduce takes 2(n-1) steps of S/n each: its time grows linearly with the gradients' size"
BOOK_CASES = "13.7's worked example: 160 MB over PCIe 10 ms; 4 GPUs 60 / 80 / 15 ms; 8 V100s, 3 NVLink rings ~6 ms"
MODEL_WITHIN = 0.15  # the cost model reproduces the book's figures within this share


def chapter(machine: Machine, seconds: float) -> list[Point]:
    """Message sizes from 4 KiB by 4x up to what the seconds allow (at most 64 MiB; a guess of
    the link: gloo between CPU workers moved ~1/40 of the memory copy bandwidth here, 10 GB/s
    between GPUs), 10 samples each, after the workers' start."""
    from perflab.measure import sizing

    link = 10e9 if machine.gpu else machine.copy_gbps * 1e9 / 40
    latency = 20e-6 if machine.gpu else 200e-6
    repeats, spare = 10, max(1.0, seconds - START_S - sizing.JOB_OVERHEAD_S)
    size, spent = 4096, 0.0
    while size * 4 <= 64 * 2**20:
        step = (repeats + 2) * (2 * latency + 2 * size * 4 / link)
        if spent + step > spare:
            break
        spent, size = spent + step, size * 4
    spent += (repeats + 2) * (2 * latency + 2 * size / link)
    why = (
        f"{seconds:.0f} s of the budget: allreduce of 4 KiB to {_human_bytes(size)} over 2 workers, {repeats} "
        f"samples each (a link of ~{link / 1e9:.3g} GB/s assumed for sizing), after ~{START_S:.0f} s to start them"
    )
    overrides = ["experiment.min_bytes=4096", f"experiment.max_bytes={size}"] + (
        [] if machine.gpu else [f"experiment.cpu_workers={min(2, machine.count)}"]
    )
    bench = [f"bench.repeats={repeats}", "bench.warmup=2", "bench.min_time_s=0"]
    return [sizing.Point("13.7", "comm", overrides + bench, START_S + spent + sizing.JOB_OVERHEAD_S, why)]


def claims(rows: DataFrame, tree: Tree) -> list[Claim]:
    """13.7: allreduce time follows the ring model's line in the message size (fitted: its
    bandwidth and latency); the cost model reproduces the book's worked example."""
    from perflab.analysis import checks
    from perflab.analysis.claims import INVALID, VALID
    from perflab.store.rows import number

    out = []
    for _, run in rows.groupby("run_id", sort=False) if "run_id" in rows else [("", rows)]:
        records = run.to_dict("records")
        cases = [r for r in records if str(r.get("measurement", "")).startswith("model: ") and r.get("status") == "ok"]
        if cases:
            worst = max(cases, key=lambda r: abs((number(r.get("model_s")) or 0) / (number(r.get("book_s")) or 1) - 1))
            off = abs((number(worst.get("model_s")) or 0) / (number(worst.get("book_s")) or 1) - 1)
            outcome = checks.claim(
                "13.7",
                "The cost model of parameter servers and ring allreduce reproduces the book's worked example",
                BOOK_CASES,
                "the book's figures",
                f"each within {MODEL_WITHIN:.0%}",
            )
            words = ", ".join(f"{(number(r.get('model_s')) or 0) * 1e3:.3g}" for r in cases) + " ms"
            measured = (
                f"{words}; furthest from the book: {off:.0%} ({str(worst.get('measurement')).removeprefix('model: ')})"
            )
            if off <= MODEL_WITHIN:
                out.append(outcome(measured, VALID))
            else:
                out.append(outcome(measured, INVALID, f"{off:.0%} from the book's figure"))
        measured_rows = [
            r for r in records if str(r.get("measurement", "")).startswith("allreduce") and r.get("status") == "ok"
        ]
        statement = "Allreduce time grows linearly with the message size, as the ring model says: t = a + S / B"
        skipped = next(
            (r for r in records if r.get("measurement") == "allreduce" and r.get("status") == "skipped"), None
        )
        if skipped is not None:
            out.append(checks.not_applicable("13.7", statement, BOOK_RING, str(skipped.get("error"))))
            continue
        if not measured_rows:
            continue
        world = number(measured_rows[0].get("world_size")) or 2
        xs = [number(r.get("bytes_per_rank")) or 0.0 for r in measured_rows]
        ys = [number(r.get("median_s")) or 0.0 for r in measured_rows]

        def describe(slope: float, intercept: float, n: float = world) -> str:
            bandwidth = 2 * (n - 1) / n / slope / 1e9 if slope > 0 else float("nan")
            return f"fitted: {intercept * 1e6:.3g} us + S / {bandwidth:.3g} GB/s (ring over {n:.0f} workers)"

        outcome = checks.claim(
            "13.7",
            statement,
            BOOK_RING,
            "a line in S (the ring's 2(n-1) latencies + 2(n-1)/n S/B), B and the latency fitted here",
            "R² ≥ 0.95 over 4 or more message sizes",
        )
        out.append(
            checks.affine(outcome, xs, ys, doubt=checks.problems(measured_rows), describe=describe, intercept="latency")
        )
    return out
