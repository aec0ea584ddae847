"""13.7, parameter servers: the book's allreduce figures beside the comm experiment's, its claims,
its size in the chapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perflab.analysis.table import human_bytes
from perflab.book import REFERENCE
from perflab.config.contract import Figure, Samples, Section, Table
from perflab.experiments.comm import SIZES

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.analysis.claims import Claim, Tree
    from perflab.measure.sizing import Calibration, Point


def report(rows: DataFrame, samples: Samples) -> Section:
    """13.7: the book's worked example beside the cost model; measured allreduce beside the ring model."""
    from perflab.analysis import plots
    from perflab.analysis.frames import measured, records, text
    from perflab.analysis.table import human_time

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
        reference=REFERENCE,
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


def chapter(machine: Calibration, seconds: float) -> list[Point]:
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
        f"{seconds:.0f} s of the budget: allreduce of 4 KiB to {human_bytes(size)} over 2 workers, {repeats} "
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
