"""13.2, asynchronous computation: the book's setup beside the async_compute experiment's, its
claims, its size in the chapter.
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
    """13.2: the book's work per timed block beside ours; host dispatch vs device time."""
    from functools import partial

    from perflab.analysis import plots
    from perflab.analysis.frames import per_run, with_samples

    def work(r: Sequence[Mapping[str, Any]]) -> str:
        n = r[-1].get("cfg.experiment.size", "?")
        return f"{r[-1].get('cfg.experiment.steps', '?')} x ({n} x {n})"

    def where(r: Sequence[Mapping[str, Any]]) -> str:
        return ", ".join(sorted({str(x["device_name"]) for x in r if x.get("device_name")}))

    return Section(
        number="13.2",
        title="Asynchronous computation",
        reference=REFERENCE,
        notes=[SETUP_ONLY],
        setup=[
            Setup(
                "work per timed block", "10 x (a random 1000 x 1000 matrix, multiplied by itself)", per_run(rows, work)
            ),
            Setup("where", "NumPy on the CPU vs PyTorch on a GPU, without and with a sync", per_run(rows, where)),
        ],
        figures=[
            Figure(
                "timings",
                partial(plots.timings, title="Host dispatch vs device time"),
                with_samples(rows, samples, "median_s"),
                caption="Error bars: interquartile range of the raw samples.",
                why_none="timings: no ok rows",
            )
        ],
    )


# --- the chapter (perflab chapter): its size and its claims -----------------------------------

CHAPTER_SHARE = 0.07
BOOK = "13.2: the frontend returns control to Python at once and the backend computes later"
ON_CPU = "on a CPU the host is the device: torch's CPU ops run synchronously, so a call returns when its work is done"


def chapter(machine: Calibration, seconds: float) -> list[Point]:
    """The book's 10 x 1000² where the budget allows (smaller matrices where it does not), and a
    short LeNet training A/B; samples fill the seconds."""
    from perflab import models
    from perflab.measure import sizing

    steps, repeats_min = 10, 5
    call = seconds / (repeats_min + 2)  # at least this many samples (and warm-up) of each variant
    per_matrix = call / 2 / (3 * 1.3 * steps)  # half of a call: numpy, torch without and with a sync
    n = 1000
    if machine.matmul_s(1000) > per_matrix:
        n = sizing.round_to((per_matrix * machine.matmul_tflops * 1e12 / 2) ** (1 / 3), 50, 100, 1000)
    batch = 256
    rate = sizing.training_rate(machine, "lenet", models.lenet, (1, 28, 28), batch)
    train_steps = int(max(1, min(20, call / 2 * rate / (3 * batch))))  # the other half: the training A/B
    call = 3 * 1.3 * steps * machine.matmul_s(n) + 3 * train_steps * batch / rate
    repeats = sizing.repeats_within(seconds - sizing.JOB_OVERHEAD_S, call, lo=repeats_min, hi=30)
    why = (
        f"{seconds:.0f} s of the budget: {steps} x {n}² per call ({'as' if n == 1000 else 'smaller than'} the book; "
        f"one matmul ~{machine.matmul_s(n) * 1e3:.0f} ms here), {train_steps} LeNet steps of {batch} in the "
        f"training A/B ({rate:.0f} images/s calibrated), {repeats} samples"
    )
    overrides = [
        f"experiment.size={n}",
        f"experiment.steps={steps}",
        f"experiment.train_steps={train_steps}",
        f"experiment.train_batch={batch}",
    ]
    return [
        sizing.Point(
            "13.2",
            "async_compute",
            overrides + sizing.bench(repeats),
            (repeats + 2) * call + sizing.JOB_OVERHEAD_S,
            why,
        )
    ]


def claims(rows: DataFrame, tree: Tree) -> list[Claim]:
    """13.2 on a GPU: without a sync the host returns at least 2x sooner than the device is done;
    a .item() every step slows training; torch on the GPU beats NumPy on the CPU. On a CPU the
    three are NOT APPLICABLE (why, with what was measured)."""
    from perflab.analysis import checks

    out = []
    for _, run in rows.groupby("run_id", sort=False) if "run_id" in rows else [("", rows)]:
        ok = {str(r["measurement"]): r for r in run.to_dict("records") if r.get("status") == "ok"}
        numpy = ok.get("numpy (CPU)")
        for name, nosync in ok.items():
            if not name.endswith("no sync (host dispatch)"):
                continue
            synced = ok.get(name.replace("no sync (host dispatch)", "synced (device time)"))
            device = name.removeprefix("torch ").split(",")[0]
            gpu = str(nosync.get("devices", "")).startswith("cuda")
            if synced is None:
                continue
            pairs = [
                (
                    f"Without a sync, torch returns to Python at least 2x sooner than {device} finishes the work",
                    synced,
                    nosync,
                    2.0,
                    "host time without a sync ≤ half the synced time",
                ),
            ]
            free, item = _training_pair(ok, device)
            if free is not None and item is not None:
                pairs.append(
                    (
                        f"A .item() after every training step on {device} makes the host wait: training runs slower",
                        item,
                        free,
                        1.0,
                        "the free-running steps faster than with .item()",
                    )
                )
            if numpy is not None:
                pairs.append(
                    (
                        f"torch on {device} runs the book's work faster than NumPy on the CPU",
                        numpy,
                        synced,
                        1.0,
                        "torch faster than NumPy",
                    )
                )
            for statement, base, new, at_least, expected in pairs:
                if not gpu:
                    out.append(checks.not_applicable("13.2", statement, BOOK, ON_CPU, _ratio(base, new)))
                    continue
                outcome = checks.claim(
                    "13.2", statement, BOOK, expected, "the 95% interval of the speedup above the line"
                )
                out.append(checks.faster(outcome, tree, base, new, at_least=at_least))
    return out


def _training_pair(ok: Mapping[str, Mapping[str, Any]], device: str) -> tuple[Any, Any]:
    free = next(
        (r for n, r in ok.items() if n.startswith(f"lenet {device} ") and n.endswith("free-running (device time)")),
        None,
    )
    item = next(
        (r for n, r in ok.items() if n.startswith(f"lenet {device} ") and n.endswith(".item() every step")), None
    )
    return free, item


def _ratio(base: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    from perflab.store.rows import number

    b, n = number(base.get("median_s")), number(new.get("median_s"))
    return f"{b / n:.2f}x ({new.get('measurement')} vs {base.get('measurement')})" if b and n else ""
