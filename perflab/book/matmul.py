"""13.3 and 13.4 on plain matmuls: the matmul experiment's report section, the book's claim, its
size in the chapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perflab.config.contract import Samples, Section

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.analysis.claims import Claim, Tree
    from perflab.measure.sizing import Calibration, Point


def report(rows: DataFrame, samples: Samples) -> Section:
    """Beside 13.3: the same alone-vs-together question on plain matmuls, in TFLOP/s."""
    from perflab.book.auto_parallel import alone_together

    return Section(
        number="13.3",
        title="Automatic parallelism: matmul throughput",
        figures=[alone_together(rows, samples)],
        notes=["Its points are drawn on the roofline of the hardware section (13.4) when the tree holds its rows."],
    )


# --- the chapter (perflab chapter): its size and its claims -----------------------------------

CHAPTER_SHARE = 0.04
PEAK_SHARE = 0.8  # a large matmul sustains at least this share of the measured peak
BOOK = "13.4: large matrix multiplications are compute-bound: they run near the processor's peak"


def chapter(machine: Calibration, seconds: float) -> list[Point]:
    """The hardware section's large matmul (the same n, so its peak is this work's peak), a few
    per call, repeated to fill the seconds."""
    from perflab.measure import sizing

    n = sizing.large_matmul(machine)
    k = 4
    call = k * machine.matmul_s(n)
    repeats = sizing.repeats_within(seconds - sizing.JOB_OVERHEAD_S, call, lo=10, hi=50)
    why = (
        f"{seconds:.0f} s of the budget: the hardware section's {n}² matmul ({machine.matmul_s(n) * 1e3:.0f} ms each "
        f"at the calibrated {machine.matmul_tflops:.3g} TFLOP/s), {k} per call, {repeats} samples"
    )
    overrides = [f"experiment.size={n}", f"experiment.iterations={k}", "experiment.dtype=float32"]
    return [sizing.Point("13.4", "matmul", overrides + sizing.bench(repeats), (repeats + 1) * call + 1, why)]


def claims(rows: DataFrame, tree: Tree) -> list[Claim]:
    """13.4: a large matmul sustains most of the peak the hardware section measured."""
    from perflab.analysis import checks
    from perflab.analysis.table import rate
    from perflab.measure import sizing
    from perflab.store.rows import number

    if "status" not in rows or "measurement" not in rows:
        return []
    # the ok "... alone" rows picked before each row becomes a dict: a user's own experiment named
    # matmul has tens of thousands of rows in a history, and none of them is the book's
    alone = (rows["status"].astype("string") == "ok") & rows["measurement"].astype("string").str.endswith(" alone")
    out = []
    for r in rows[alone.fillna(False)].to_dict("records"):
        n = number(r.get("cfg.experiment.size")) or 0
        dtype, device = r.get("cfg.experiment.dtype"), r.get("device_name")
        statement = f"{sizing.matmul_words(n).capitalize()} ({dtype}) on {device} sustains most of the measured peak"
        if n < sizing.LARGE_MATMUL_MIN:
            why = f"{n:.0f}² is no large matmul (from {sizing.LARGE_MATMUL_MIN}²): too small to be compute-bound"
            out.append(checks.not_applicable("13.4", statement, BOOK, why, rate(r, "tflops")))
            continue
        pct = number(r.get("pct_of_peak"))
        if pct is None:
            why = r.get("peak_not_taken") if isinstance(r.get("peak_not_taken"), str) else ""
            out.append(
                checks.not_applicable(
                    "13.4",
                    statement,
                    BOOK,
                    why or f"no measured peak for {r.get('device_name')} (+experiment=hardware measures it)",
                    rate(r, "tflops"),
                )
            )
            continue
        tflops = number(r.get("tflops")) or 0.0
        peak = tflops * 100 / pct if pct else None
        outcome = checks.claim(
            "13.4",
            statement,
            BOOK,
            f"≥ {PEAK_SHARE:.0%} of the {peak or 0:.3g} TFLOP/s the hardware section measured",
            f"at least {PEAK_SHARE:.0%} (median against the best sample); above 100 % the peak is no peak",
        )
        out.append(
            checks.share(
                outcome,
                tflops,
                peak,
                floor=PEAK_SHARE,
                ceiling=1.0,
                doubt=checks.problems([r]),
                above_why="above the measured peak: that peak was measured on smaller work or a busier machine",
                what=" TFLOP/s",
            )
        )
    return out
