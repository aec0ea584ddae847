"""Asynchronous execution (book 13.2): NumPy vs torch, host dispatch time vs device time, and
what a per-step ``.item()`` costs a training loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.config.contract import Figure, Samples, Section, Setup
from perflab.config.schema import MISSING, ExperimentConfig, positive

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.analysis.claims import Claim, Tree
    from perflab.job.context import Context
    from perflab.measure.sizing import Machine, Point

METRIC = "median_s"
CPU_NOTE = "CPU ops run synchronously: the time without a sync already includes the compute"


@dataclass
class Config(ExperimentConfig):
    size: int = MISSING  # n x n random matrix per step
    steps: int = MISSING  # steps of (randn + matmul) per timed call
    train_steps: int = MISSING  # LeNet SGD steps per timed call in the training A/B
    train_batch: int = MISSING

    def __post_init__(self) -> None:
        positive(self, "size", "steps", "train_steps", "train_batch")


def run(ctx: Context) -> None:
    import numpy as np
    import torch

    from perflab.measure.bench import Part
    from perflab.measure.devices import on_device

    p = ctx.params
    flops = 2 * p.size**3 * p.steps
    rng = np.random.default_rng(ctx.settings.seed)

    def numpy_steps() -> None:
        for _ in range(p.steps):
            a = rng.standard_normal((p.size, p.size), dtype=np.float32)
            a @ a

    ctx.measure(
        "numpy (CPU)",
        numpy_steps,
        [],
        flops=flops,
        items=p.steps,
        items_unit="steps",
        device_name="host CPU (NumPy)",
        note="float32 on the host CPU, NumPy's own threads",
    )

    for d in ctx.devices:

        def torch_steps(device: Any = d.torch) -> None:
            for _ in range(p.steps):
                a = torch.normal(0.0, 1e-3, size=(p.size, p.size), device=device)
                torch.mm(a, a)

        note = CPU_NOTE if d.type == "cpu" else ""
        with on_device(d):
            ctx.measure_rounds(
                {
                    f"torch {d.name}, no sync (host dispatch)": Part(
                        torch_steps,
                        [d],
                        sync=False,
                        items=p.steps,
                        extra={
                            "items_unit": "steps",
                            "note": note or "host time to queue the work; the device may still be running it",
                        },
                    ),
                    f"torch {d.name}, synced (device time)": Part(
                        torch_steps,
                        [d],
                        flops=flops,
                        items=p.steps,
                        extra={
                            "items_unit": "steps",
                            "note": note or "the device is synchronized before the clock is read",
                        },
                    ),
                }
            )
            training_ab(ctx, d, p.train_steps, p.train_batch, note)


def training_ab(ctx: Context, d: Any, steps: int, batch: int, cpu_note: str) -> None:
    """LeNet SGD steps left free-running vs forced to sync by ``loss.item()`` after each step,
    measured in interleaved rounds so that neither variant gets the warmer machine."""
    import torch
    from torch.nn import functional as F

    from perflab import models
    from perflab.measure.bench import Part

    torch.manual_seed(ctx.settings.seed)
    model = models.lenet().to(d.torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 1, 28, 28, device=d.torch)
    y = torch.randint(0, 10, (batch,), device=d.torch)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def free_running() -> None:
        for _ in range(steps):
            step()

    def item_every_step() -> None:
        for _ in range(steps):
            step().item()  # a host read: waits for the device every step

    label = f"lenet {d.name} x{steps} steps"
    dispatch, free, item = (
        f"{label}, free-running (host dispatch)",
        f"{label}, free-running (device time)",
        f"{label}, .item() every step",
    )

    def images(note: str) -> dict[str, Any]:
        return {"items_unit": "images", "note": cpu_note or note}

    parts = {
        dispatch: Part(
            free_running, [d], sync=False, items=steps * batch, extra=images("host time to queue the steps")
        ),
        free: Part(free_running, [d], items=steps * batch, extra=images("synchronized once at the end")),
        item: Part(
            item_every_step, [d], items=steps * batch, extra=images("the host waits for the device after every step")
        ),
    }

    def slowdown(stats: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        return {item: {"slowdown_vs_free": stats[item].median / stats[free].median}}

    ctx.measure_rounds(parts, relate=slowdown)


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.analysis.table import human_time
    from perflab.store.rows import number

    by = {str(r.get("measurement")): r for r in rows if r.get("status") == "ok"}
    lines: list[str] = []
    for name, r in by.items():
        if name.endswith("no sync (host dispatch)"):
            synced = by.get(name.replace("no sync (host dispatch)", "synced (device time)"), {})
            lines.append(
                f"{name.split(',')[0]}: host dispatch {human_time(r['median_s'])}, "
                f"device time {human_time(synced.get('median_s'))}"
            )
        if "slowdown_vs_free" in r and number(r.get("slowdown_vs_free")) is not None:
            lines.append(f"{name}: {float(r['slowdown_vs_free']):.2f}x the free-running time")
    if "numpy (CPU)" in by:
        lines.append(f"numpy: {human_time(by['numpy (CPU)']['median_s'])}")
    return lines


def report(rows: DataFrame, samples: Samples) -> Section:
    """13.2: the book's work per timed block beside ours; host dispatch vs device time."""
    from functools import partial

    from perflab.analysis import plots
    from perflab.analysis.frames import per_run, with_samples
    from perflab.experiments import _book

    def work(r: Sequence[Mapping[str, Any]]) -> str:
        n = r[-1].get("cfg.experiment.size", "?")
        return f"{r[-1].get('cfg.experiment.steps', '?')} x ({n} x {n})"

    def where(r: Sequence[Mapping[str, Any]]) -> str:
        return ", ".join(sorted({str(x["device_name"]) for x in r if x.get("device_name")}))

    return Section(
        number="13.2",
        title="Asynchronous computation",
        reference=_book.REFERENCE,
        notes=[_book.SETUP_ONLY],
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


def chapter(machine: Machine, seconds: float) -> list[Point]:
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
