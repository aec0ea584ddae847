"""Asynchronous execution (book 13.2): NumPy vs torch, host dispatch time vs device time, and
what a per-step ``.item()`` costs a training loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.experiment import MISSING, ExperimentConfig, positive

if TYPE_CHECKING:
    from perflab.experiment import Context

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

    from perflab.experiment import Part, on_device

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
    from perflab.experiment import Part

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
    from perflab.experiment import human_time, number

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
