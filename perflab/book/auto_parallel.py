"""13.3, automatic parallelism: the book's setup beside the auto_parallel experiment's, its claims,
its size in the chapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.book import REFERENCE, SETUP_ONLY
from perflab.config.contract import Figure, Samples, Section, Setup

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.analysis.claims import Claim, Tree
    from perflab.measure.sizing import Calibration, Point


def report(rows: DataFrame, samples: Samples) -> Section:
    """13.3: the book's work per device beside ours; each device alone, then all together."""
    from perflab.analysis.frames import per_run

    def work(r: Sequence[Mapping[str, Any]]) -> str:
        alone = {str(x.get("devices")) for x in r if str(x.get("measurement", "")).endswith(" alone")}
        gpus = bool(alone) and all(d.startswith("cuda") for d in alone)
        n, k = ("size", "matmuls") if gpus else ("cpu_size", "cpu_matmuls")
        size = r[-1].get(f"cfg.experiment.{n}", "?")
        return f"{r[-1].get(f'cfg.experiment.{k}', '?')} matmuls of {size} x {size} on each of {len(alone)} device(s)"

    return Section(
        number="13.3",
        title="Automatic parallelism",
        reference=REFERENCE,
        notes=[SETUP_ONLY],
        setup=[Setup("work per device", "50 matmuls of 4000 x 4000 on each of 2 GPUs", per_run(rows, work))],
        figures=[alone_together(rows, samples)],
    )


def alone_together(rows: DataFrame, samples: Samples) -> Figure:
    """Each device alone, then all together, in TFLOP/s where the rows have it (13.3's figure,
    of the auto_parallel and the matmul experiments alike)."""
    from perflab.analysis import plots
    from perflab.analysis.frames import with_samples

    return Figure(
        "alone_together",
        plots.alone_together,
        with_samples(rows, samples, "tflops" if "tflops" in rows else "median_s"),
        caption="Error bars: interquartile range of the raw samples.",
        why_none="alone vs together: no ok alone/together rows",
    )


# --- the chapter (perflab chapter): its size and its claims -----------------------------------

CHAPTER_SHARE = 0.07
BOOK = "13.3: work on two devices at once takes about as long as on one: the frontend runs them in parallel"
BOOK_COPY = "13.3: computing and copying results to the CPU overlap: together faster than one after the other"
NEAR = 0.8  # "near k": at least this share of the ideal concurrency


def chapter(machine: Calibration, seconds: float) -> list[Point]:
    """GPUs: the book's 50 x 4000². The CPU: two workers (half the cores each) stand in for two
    GPUs, with 10 matmuls per call sized to ~50 ms on a worker; samples fill the seconds."""
    from perflab.measure import sizing

    if machine.gpu:
        n, k, share, keys = 4000, 50, 1.0, ("size", "matmuls")
    else:
        k, share, keys = 10, 1 / min(2, machine.count), ("cpu_size", "cpu_matmuls")
        n = sizing.round_to((0.05 / k * machine.matmul_tflops * 1e12 * share / 2) ** (1 / 3), 64, 128, 2048)
    call = k * machine.matmul_s(n, share)
    repeats = sizing.repeats_within(seconds - sizing.JOB_OVERHEAD_S, 3.5 * call, lo=10, hi=60)
    where = (
        f"{machine.count} GPUs"
        if machine.gpu
        else f"2 CPU workers of {max(1, machine.count // 2)} thread(s) standing in for 2 GPUs"
    )
    why = (
        f"{seconds:.0f} s of the budget: {k} x {n}² per device per call "
        f"({'the book' if machine.gpu else '~50 ms on a worker'}) on {where}; {repeats} samples of each part"
    )
    overrides = [f"experiment.{keys[0]}={n}", f"experiment.{keys[1]}={k}"] + (
        [] if machine.gpu else [f"experiment.cpu_workers={min(2, machine.count)}"]
    )
    return [
        sizing.Point("13.3", "auto_parallel", overrides + sizing.bench(repeats), (repeats + 1) * 3.5 * call + 2, why)
    ]


def claims(rows: DataFrame, tree: Tree) -> list[Claim]:
    """13.3: k devices together reach a concurrency near k (the sum of their alone times over the
    together time, with a bootstrap interval); on a GPU, compute and copy overlap."""
    from perflab.analysis import checks
    from perflab.store.rows import number

    out = []
    for _, run in rows.groupby("run_id", sort=False) if "run_id" in rows else [("", rows)]:
        records = run.to_dict("records")
        ok = [r for r in records if r.get("status") == "ok"]
        alone = [r for r in ok if str(r.get("measurement", "")).endswith(" alone")]
        together = next((r for r in ok if str(r.get("measurement", "")).endswith(" together")), None)
        statement = "Devices working at once reach a concurrency near their number (each as fast as alone)"
        if together is None:
            if alone:
                out.append(
                    checks.not_applicable(
                        "13.3", statement, BOOK, f"one device ({alone[0].get('devices')}): nothing runs beside it"
                    )
                )
        else:
            k = len(alone)
            outcome = checks.claim(
                "13.3",
                f"{k} devices ({together.get('devices')}) working at once reach a concurrency near {k}",
                BOOK,
                f"concurrency {k} (sum of the alone times / the together time)",
                f"at least {NEAR:.0%} of {k} ({NEAR * k:.2g}); above {1.1 * k:.2g}: impossible",
            )
            samples = [tree.samples_of(r) for r in alone] + [tree.samples_of(together)]

            def concurrency(*xs: Any, axis: int = -1) -> Any:
                import numpy as np

                return sum(np.median(x, axis=axis) for x in xs[:-1]) / np.median(xs[-1], axis=axis)

            out.append(
                checks.at_least(
                    outcome,
                    samples,
                    concurrency,
                    floor=NEAR * k,
                    ceiling=1.1 * k,
                    unit="",
                    doubt=checks.problems([*alone, together]),
                    ceiling_why="above the ideal: the alone runs were slowed by something else (a busy machine)",
                )
            )
        copy = next((r for r in records if "copy" in str(r.get("measurement", ""))), None)
        if copy is not None and copy.get("status") == "skipped":
            out.append(
                checks.not_applicable(
                    "13.3", "Computing and copying to the CPU overlap", BOOK_COPY, str(copy.get("error"))
                )
            )
        overlapped = next((r for r in ok if str(r.get("measurement", "")).endswith("compute + copy overlapped")), None)
        sequential = next((r for r in ok if str(r.get("measurement", "")).endswith("compute, then copy")), None)
        if overlapped is not None and sequential is not None:
            outcome = checks.claim(
                "13.3",
                f"On {overlapped.get('devices')}, computing and copying results to the CPU overlap",
                BOOK_COPY,
                "overlapped faster than one after the other",
                "the 95% interval of the speedup above 1",
            )
            speedup = number(overlapped.get("overlap_speedup"))
            detail = f"; {speedup:.2f}x the sum of the parts" if speedup is not None else ""
            out.append(checks.faster(outcome, tree, sequential, overlapped, detail=detail))
    return out
