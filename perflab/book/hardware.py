"""13.4, hardware: the book's figures beside what the hardware experiment measures, its claims, its
size in the chapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, cast

from perflab.book import REFERENCE
from perflab.config.contract import Figure, Samples, Section, Table

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.analysis.claims import Claim, Tree
    from perflab.analysis.plots import Roof
    from perflab.measure.sizing import Calibration, Point


# Book 13.4's figures, shown beside what this machine measures (and on which hardware the book's came from).
BOOK = {
    "host_copy": (100.0, "book 13.4: main memory up to 100 GB/s (a server CPU)"),
    "device_copy": (500.0, "book 13.4: GDDR6 GPU memory over 500 GB/s"),
    "host_device": (12.0, "book 13.4: PCIe 3.0 x16, 1 MB in ~80 us, ~12 GB/s"),
    "peer": (33.0, "book 13.4: NVLink, 1 MB in ~30 us, ~33 GB/s (V100)"),
    "launch": (10.0, "book 13.4: launching a CUDA kernel ~10 us"),
}


def report(rows: DataFrame, samples: Samples) -> Section:
    """13.4: the book's figures beside this machine's, and the roofline of every point in the
    report under the roofs measured here (for the precision of the points drawn)."""
    from functools import partial

    from perflab.analysis import plots
    from perflab.analysis.frames import ok, records, text
    from perflab.store.rows import number

    body = []
    for r in records(ok(rows)):
        ref, value, unit = number(r.get("book_reference")), number(r.get("gbps")), "GB/s"
        if value is None or "latency" in str(r.get("measurement")):
            value, unit = number(r.get("latency_us")), "us"
        if ref is not None and value is not None:
            where = text(r.get("device_name")) or "this machine"
            body.append(
                [str(r["measurement"]), where, f"{value:.3g} {unit}", f"{ref:g} {unit}", text(r.get("book_note"))]
            )
    header = ["measurement", "this machine", "here", "the book", "the book's hardware and where it says so"]
    return Section(
        number="13.4",
        title="Hardware",
        reference=REFERENCE,
        tables=[Table(header, body, "The book's figures beside this machine's.")] if body else [],
        figures=[
            Figure(
                "roofline",
                partial(plots.roofline, roofs=roofs(rows)),
                None,  # every point of the report, under this machine's roofs
                caption="Every measured op or training step of the report on a device whose roofs were measured here.",
                why_none="roofline: no ok rows with an arithmetic intensity on a device and precision measured here",
            )
        ],
    )


def roofs(rows: DataFrame) -> list[Roof]:
    """Per device and precision: the memory copy bandwidth and the peak matmul measured here, and
    beside it the datasheet's peak (a CPU's derived from its own description) over the same
    measured bandwidth: no datasheet gives a CPU's memory bandwidth."""
    from perflab.analysis.frames import ok
    from perflab.analysis.plots import Roof

    found = ok(rows)
    if not {"device_name", "measurement", "gbps", "peak_tflops"} <= set(found.columns):
        return []
    out = []
    for device, part in found.groupby("device_name", observed=True):
        copy = part[part["measurement"].astype("string").str.endswith(" memory copy").fillna(False)]
        peaks = part.dropna(subset=["peak_tflops"])
        if copy["gbps"].isna().all() or peaks.empty:
            continue
        for dtype, group in peaks.groupby(peak_dtype(peaks)):
            gbps = float(copy["gbps"].max())
            out.append(Roof(str(device), str(dtype), gbps, float(group["peak_tflops"].max())))
            sheet = group["datasheet_tflops"].max() if "datasheet_tflops" in group else None
            if sheet is not None and sheet > 0:  # the datasheet's peak (a CPU's derived), over the same bandwidth
                out.append(Roof(str(device), str(dtype), gbps, float(sheet), source="datasheet"))
    return out


def peak_dtype(peaks: DataFrame) -> Any:
    """The precision of each peak matmul row: its flops_dtype, else its name ("... peak matmul tf32")."""
    named = peaks["measurement"].astype("string").str.extract(r"peak matmul (\w+)", expand=False)
    return peaks["flops_dtype"].astype("string").fillna(named) if "flops_dtype" in peaks else named


# --- the chapter (perflab chapter): its size and its claims -----------------------------------

CHAPTER_SHARE = 0.08  # of the chapter's budget
BOOK_PEAK = "13.4: a core's peak is clock x SIMD lanes x 2 (FMA) x its FMA units; large matmuls run near it"
BOOK_LAUNCH = f"13.4: {BOOK['launch'][1].removeprefix('book 13.4: ')}"
PEAK_SHARE = 0.5  # a large float32 matmul reaches at least this share of the datasheet peak ...
PEAK_ABOVE = 1.05  # ... and a share above this says the datasheet's assumptions are low (a peak is the best sample),
PEAK_ABOVE_TURBO = 1.5  # ... or above this where the clock counted is no maximum (the cores may run that much faster)


def chapter(machine: Calibration, seconds: float) -> list[Point]:
    """Sized so that one peak matmul takes ~20 ms (a "large" one, see sizing.large_matmul), the
    copy stays large (256 MiB, fewer where the budget is short), and the repeats fill the rest."""
    from perflab.measure import sizing

    n = sizing.large_matmul(machine)
    copy_mb = 256
    copy_s = 2 * copy_mb * 2**20 / (machine.copy_gbps * 1e9)
    if copy_s > seconds / 40:
        copy_mb = max(16, int(copy_mb * seconds / 40 / copy_s))
        copy_s = 2 * copy_mb * 2**20 / (machine.copy_gbps * 1e9)
    dtypes = ["float32", "bfloat16", "float16"] if machine.gpu else ["float32", "bfloat16"]
    launches = 1000
    per_round = copy_s + launches * machine.op_us * 1e-6 + len(dtypes) * machine.matmul_s(n)
    if machine.gpu:
        per_round += 4 * 64 * 2**20 / 10e9 + launches * machine.op_us * 1e-6  # transfers at ~10 GB/s, CUDA graph
    repeats = sizing.repeats_within(seconds - sizing.JOB_OVERHEAD_S, per_round, lo=10, hi=50)
    size = f"experiment.{'matmul_size' if machine.gpu else 'cpu_matmul_size'}={n}"
    why = (
        f"{seconds:.0f} s of the budget: one {n}² float32 matmul takes ~{machine.matmul_s(n) * 1e3:.0f} ms at the "
        f"calibrated {machine.matmul_tflops:.3g} TFLOP/s (large enough to run near the peak); copies of {copy_mb} MiB; "
        f"{repeats} samples each"
    )
    return [
        sizing.Point(
            "13.4",
            "hardware",
            [
                size,
                f"experiment.copy_mb={copy_mb}",
                f"experiment.launches={launches}",
                f"experiment.dtypes=[{','.join(dtypes)}]",
            ]
            + sizing.bench(repeats),
            (repeats + 1) * per_round + sizing.JOB_OVERHEAD_S,
            why,
        )
    ]


def claims(rows: DataFrame, tree: Tree) -> list[Claim]:
    """13.4: a large float32 matmul reaches at least half the datasheet peak (a CPU's derived
    from its own description, with its assumptions); a kernel launch costs about the book's
    10 us (GPUs; a CPU launches none)."""
    from perflab.analysis import checks
    from perflab.measure import flops, sizing
    from perflab.store.rows import number

    out = []
    ok = [cast(dict, r) for r in rows.to_dict("records") if r.get("status") == "ok"]
    for r in ok:
        name = str(r.get("measurement", ""))
        if "peak matmul float32" not in name:
            continue
        n = number(
            r.get(
                "cfg.experiment.cpu_matmul_size"
                if str(r.get("devices")).startswith("cpu")
                else "cfg.experiment.matmul_size"
            )
        )
        device = str(r.get("device_name", ""))
        statement = (
            f"{sizing.matmul_words(n or 0).capitalize()} (float32) on {device} reaches at least half its datasheet peak"
        )
        sheet = number(r.get("datasheet_tflops"))
        basis = str(r.get("datasheet_basis") or "") if isinstance(r.get("datasheet_basis"), str) else ""
        turbo = flops.is_lower_bound(basis)
        expected = f"≥ {PEAK_SHARE:.0%} of {sheet:.3g} TFLOP/s" if sheet else "-"
        if sheet and turbo:
            expected += ", a lower bound on the peak"
        if basis:
            expected += f" ({basis})"
        above = PEAK_ABOVE_TURBO if turbo else PEAK_ABOVE
        tolerance = f"at least {PEAK_SHARE:.0%}; above {above:.0%}: the datasheet's assumptions are low" + (
            " (the clock counted is no maximum)" if turbo else ""
        )
        if sheet is None:
            out.append(
                checks.not_applicable(
                    "13.4", statement, BOOK_PEAK, f"no datasheet peak for {device} (float32)", _tflops(r)
                )
            )
            continue
        outcome = checks.claim("13.4", statement, BOOK_PEAK, expected, tolerance)
        out.append(
            checks.share(
                outcome,
                number(r.get("peak_tflops")),
                sheet,
                floor=PEAK_SHARE,
                ceiling=above,
                doubt=checks.problems([r]),
                above_why="the measured peak is above the datasheet peak derived here: its clock or FMA count is "
                "lower than the chip's (turbo, or a virtual machine's reported clock)",
                what=" TFLOP/s",
            )
        )
    for r in ok:
        name = str(r.get("measurement", ""))
        if name.endswith("op dispatch latency"):
            out.append(
                checks.not_applicable(
                    "13.4",
                    "Launching a kernel costs about 10 us",
                    BOOK_LAUNCH,
                    "a CPU launches no kernels: its ops run in the calling thread",
                    f"a tiny op costs {number(r.get('latency_us')) or 0:.3g} us of framework overhead here",
                )
            )
        elif name.endswith("kernel launch latency"):
            us = number(r.get("latency_us"))
            outcome = checks.claim(
                "13.4",
                f"Launching a kernel on {r.get('device_name')} costs about 10 us",
                BOOK_LAUNCH,
                "at most 20 us per launch",
                "up to 2x the book's 10 us",
            )
            out.append(checks.at_most(outcome, us, 20.0, unit=" us", doubt=checks.problems([r])))
    return out


def _tflops(r: Mapping[str, Any]) -> str:
    from perflab.store.rows import number

    peak = number(r.get("peak_tflops"))
    return f"{peak:.3g} TFLOP/s" if peak is not None else ""
