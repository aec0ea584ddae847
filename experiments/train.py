"""Data-parallel training by config: the book's LeNet / ResNet-18 on Fashion-MNIST (13.5, 13.6),
or any model (``model._target_``, torchvision's, timm's) on any data (images of any shape,
token sequences, torchvision's datasets)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.experiment import ConfigError, ExperimentConfig, PerflabConfig

if TYPE_CHECKING:
    from perflab.experiment import Context, Device

METRIC = "items_per_s"  # compare: global items/s (images/s, tokens/s: the row's items_unit) ...
SUMMARY_ROWS = ("train",)  # ... of the one summary row per run, not of every epoch ...
BESIDE = ("test_acc",)  # ... with the final test accuracy beside it: "faster but worse" shows


@dataclass
class Config(ExperimentConfig):
    """No knobs of its own: model, data, strategy and trainer are top-level config groups."""


def check(s: PerflabConfig, devices: Sequence[Device]) -> None:
    """Strategy, precision and batch against the resolved devices: before anything runs."""
    from perflab import models
    from perflab.measure import dynamo, precision
    from perflab.train import data, loop, optim
    from perflab.train.strategies import NOT_COMPILABLE

    for section in ("model", "data", "strategy", "trainer"):
        if getattr(s, section) is None:
            raise ConfigError(section, None, f"a {section} config (conf/{section}/ or the experiment's defaults)")
    assert s.strategy is not None and s.trainer is not None
    if s.strategy.name == "single" and len(devices) != 1:
        raise ConfigError(
            "devices.count", len(devices), "1 for strategy=single (scratch, data_parallel or ddp for more)"
        )
    if s.strategy.name in ("data_parallel", "ddp") and len({d.type for d in devices}) > 1:
        raise ConfigError(
            "devices.spec", [d.name for d in devices], f"devices of one kind for strategy={s.strategy.name}"
        )
    if s.trainer.compile and s.strategy.name in NOT_COMPILABLE:
        raise ConfigError("trainer.compile", True, "false with this strategy", problem=NOT_COMPILABLE[s.strategy.name])
    precision.check("trainer.precision", s.trainer.precision, devices)
    optim.optimizer_class(s.trainer.optimizer)  # one that imports and is an optimizer
    if s.trainer.compile:
        dynamo.check_backend("trainer.compile_backend", s.trainer.compile_backend)
    if s.strategy.name == "ddp" and s.strategy.backend == "nccl" and any(d.type != "cuda" for d in devices):
        raise ConfigError("strategy.backend", "nccl", "auto or gloo on CPU devices", problem="NCCL needs GPUs")
    if s.strategy.name == "ddp" and all(d.type == "cpu" for d in devices):
        from perflab.measure.devices import allowed_cpus

        threads, cpus = ddp_cpu_threads(s), allowed_cpus()
        if threads * len(devices) > cpus:
            raise ConfigError(
                "devices.threads",
                threads,
                f"null or at most {max(1, cpus // len(devices))}",
                problem=f"strategy=ddp on the CPU runs {len(devices)} workers of devices.threads threads each, "
                f"on the {cpus} CPUs this process may use",
            )
    if s.strategy.nnodes > 1 and not (s.strategy.rdzv_endpoint or rendezvous_from_slurm()):
        raise ConfigError(
            "strategy.rdzv_endpoint",
            s.strategy.rdzv_endpoint,
            "host:port reachable from every node",
            problem=f"strategy.nnodes={s.strategy.nnodes} needs a rendezvous (or run it under SLURM)",
        )
    planned = loop.plan(s.trainer, len(devices) * s.strategy.nnodes)  # bad batch/device combinations
    data.check(models.fitted_data(s.model, s.data), s.trainer.batch_size, planned.global_batch)
    check_model(s)


def check_model(s: PerflabConfig) -> None:
    """The model against the data, before anything is timed: its factory imports and takes
    its arguments, it takes the data's input and its output fits the data (a dry forward on
    two items), and ``channels_last`` only where the inputs are images."""
    from perflab import models
    from perflab.train import data

    assert s.model is not None and s.data is not None
    spec = data.spec(models.fitted_data(s.model, s.data))
    if s.model.channels_last and not spec.images:
        raise ConfigError(
            "model.channels_last",
            True,
            "false with this data",
            problem=f"NHWC is a layout of images (C, H, W); the inputs here are {spec.describe()}",
        )
    models.check(s.model, spec, train=True)


def run(ctx: Context) -> None:
    from perflab.train import loop

    s = ctx.settings
    assert s.strategy is not None and s.trainer is not None
    if s.strategy.name != "ddp":
        loop.Trainer(ctx).fit()
        return
    st = s.strategy
    if all(d.type == "cpu" for d in ctx.devices):
        from dataclasses import replace

        ctx.devices = [replace(d, threads=ddp_cpu_threads(s)) for d in ctx.devices]
    endpoint = st.rdzv_endpoint or (rendezvous_from_slurm() if st.nnodes > 1 else "")
    # Rank 0 writes the rows from its own process, into this job's files.
    ctx.launch_workers(
        _ddp_worker,
        nproc=len(ctx.devices),
        nnodes=st.nnodes,
        rdzv_endpoint=endpoint,
        rdzv_id=st.rdzv_id if st.nnodes > 1 else "",
        max_restarts=st.max_restarts,
    )


def ddp_cpu_threads(s: PerflabConfig) -> int:
    """A DDP worker's threads on the CPU: ``devices.threads``, else one (a worker per core, as
    torchrun gives each worker), the same at every device count, so that a sweep over
    ``devices.count`` compares like with like: with the job's threads split instead, one worker
    ran both cores' threads and two ran one each, and a busy machine made 2 workers "3.5x" one."""
    return s.devices.threads or 1


def rendezvous_from_slurm() -> str:
    """host:port on the first node of this SLURM allocation (every task computes the same)."""
    from perflab.cluster.slurm import first_node

    host = first_node(os.environ.get("SLURM_JOB_NODELIST", ""))
    port = 29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000
    return f"{host}:{port}" if host else ""


def _ddp_worker(ctx: Context) -> None:
    import torch.distributed as dist

    from perflab.cluster import workers
    from perflab.train import loop

    rank, world, local = workers.init_process_group(ctx.devices, ctx.settings.strategy.backend)
    try:
        loop.Trainer(ctx, rank=rank, world=world, local_rank=local).fit()
    finally:
        dist.destroy_process_group()


def progress(row: Mapping[str, Any]) -> str | None:
    """Each epoch's line; other rows get the generic one."""
    from perflab.experiment import per_s

    if row.get("measurement") != "epoch" or row.get("status") != "ok":
        return None
    return (
        f"epoch {row['epoch']}: {row['train_s']:.2f} s train, {row['eval_s']:.2f} s eval, "
        f"{per_s(row['items_per_s'], (row.get('items_unit') or 'items') + '/s')}, loss {row['train_loss']:.4f}, "
        f"train acc {row['train_acc']:.3f}, "
        f"test acc {row['test_acc']:.3f}, lr {row['lr']:.4g}, waiting for data {row['data_wait_frac']:.0%}"
    )


def label(row: Mapping[str, Any]) -> str:
    """An epoch row is "epoch N" in the job's table."""
    from perflab.experiment import number

    epoch = number(row.get("epoch"))
    return f"epoch {int(epoch)}" if row.get("measurement") == "epoch" and epoch is not None else str(row["measurement"])


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.analysis.table import human_time, per_s, rate
    from perflab.experiment import number
    from perflab.measure import flops

    summary = next((r for r in reversed(rows) if r.get("measurement") == "train" and r.get("status") == "ok"), None)
    if summary is None:
        return []
    n = int(number(summary.get("n_devices")) or 1)
    unit = summary.get("items_unit") or "items"
    line = (
        f"{summary.get('model')} x {summary.get('strategy')} on {n} device{'s' if n > 1 else ''}: "
        f"{per_s(number(summary['items_per_s']) or 0, f'{unit}/s')} "
        f"({per_s(number(summary.get('per_device_items_per_s')) or 0, 'per device')}), "
        f"epoch {human_time(summary.get('median_s'))}, final test acc {number(summary.get('test_acc')) or 0:.3f}"
        + (f", optimizer {summary.get('optimizer')}" if summary.get("optimizer") else "")
        + (f"; input {summary['input']}" if summary.get("input") else "")
    )
    tflops = number(summary.get("tflops"))
    why = next((n for n in str(summary.get("note", "")).split("; ") if n.startswith("FLOPs not estimated")), "")
    lines = [
        line,
        f"model FLOPs: {rate(summary, 'tflops')} achieved"
        + (
            f", {flops.mfu_words(float(summary['mfu']), summary.get('datasheet_basis'))}"
            if number(summary.get("mfu")) is not None
            else f", {summary['mfu_note']}"
            if isinstance(summary.get("mfu_note"), str) and summary["mfu_note"]
            else ""
        )
        + (
            f", {float(summary['pct_of_peak']):.0f}% of the measured peak"
            if number(summary.get("pct_of_peak")) is not None
            else ""
        )
        if tflops is not None
        else f"model FLOPs: unknown ({why or 'not counted'})",  # unknown is said, never 0
    ]
    wait = number(summary.get("data_wait_frac"))
    if wait is not None:
        lines.append(
            f"input pipeline: {wait:.0%} of the step time waiting for data" + (" (input-bound)" if wait >= 0.5 else "")
        )
    return lines
