"""Data-parallel training by config: the book's LeNet / ResNet-18 on Fashion-MNIST (13.5, 13.6),
or any model (``model._target_``, torchvision's, timm's) on any data (images of any shape,
token sequences, torchvision's datasets)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from perflab.contract import Figure, Samples, Section, Setup, Table
from perflab.errors import ConfigError
from perflab.schema import ExperimentConfig, PerflabConfig

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.context import Context
    from perflab.devices import Device

METRIC = "items_per_s"  # compare: global items/s (images/s, tokens/s: the row's items_unit) ...
SUMMARY_ROWS = ("train",)  # ... of the one summary row per run, not of every epoch ...
BESIDE = ("test_acc",)  # ... with the final test accuracy beside it: "faster but worse" shows

# The book's sections of its training presets (rows' experiment column), and their setups:
# (what, the book's, the summary row's column that holds ours).
LENET = [
    ("model", "LeNet, data parallelism from scratch", "model"),
    ("devices", "1 GPU, then 2 GPUs", "n_devices"),
    ("global batch", "256 on 1 and on 2 GPUs", "global_batch"),
    ("learning rate", "0.2", "lr"),
    ("epochs", "10", "epochs"),
]
BOOK = {
    "lenet_scratch": ("13.5", "Training on multiple GPUs", "", LENET),
    "train": (
        "13.5",
        "Training on multiple GPUs",
        "This preset is the generic trainer: compare the settings before the figures.",
        LENET,
    ),
    "resnet18_concise": (
        "13.6",
        "Concise multi-GPU",
        "",
        [
            ("model", "ResNet-18 (the book's small-input variant), nn.DataParallel", "model"),
            ("devices", "1 GPU, then 2 GPUs", "n_devices"),
            ("global batch", "256 on 1 GPU, 512 on 2", "global_batch"),
            ("learning rate", "0.1 on 1 GPU, 0.2 on 2", "lr"),
            ("epochs", "10", "epochs"),
        ],
    ),
}


@dataclass
class Config(ExperimentConfig):
    """No knobs of its own: model, data, strategy and trainer are top-level config groups."""


def check(s: PerflabConfig, devices: Sequence[Device]) -> None:
    """Strategy, precision and batch against the resolved devices: before anything runs."""
    from perflab import dynamo, precision
    from perflab.train import data, loop
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
    if s.trainer.compile:
        dynamo.check_backend("trainer.compile_backend", s.trainer.compile_backend)
    if s.strategy.name == "ddp" and s.strategy.backend == "nccl" and any(d.type != "cuda" for d in devices):
        raise ConfigError("strategy.backend", "nccl", "auto or gloo on CPU devices", problem="NCCL needs GPUs")
    if s.strategy.nnodes > 1 and not (s.strategy.rdzv_endpoint or rendezvous_from_slurm()):
        raise ConfigError(
            "strategy.rdzv_endpoint",
            s.strategy.rdzv_endpoint,
            "host:port reachable from every node",
            problem=f"strategy.nnodes={s.strategy.nnodes} needs a rendezvous (or run it under SLURM)",
        )
    planned = loop.plan(s.trainer, len(devices) * s.strategy.nnodes)  # bad batch/device combinations
    data.check(s.data, s.trainer.batch_size, planned.global_batch)
    check_model(s)


def check_model(s: PerflabConfig) -> None:
    """The model against the data, before anything is timed: its factory imports and takes
    its arguments, it takes the data's input and its output fits the data (a dry forward on
    two items), and ``channels_last`` only where the inputs are images."""
    from perflab.train import data, models

    assert s.model is not None and s.data is not None
    spec = data.spec(s.data)
    if s.model.channels_last and not spec.images:
        raise ConfigError(
            "model.channels_last",
            True,
            "false with this data",
            problem=f"NHWC is a layout of images (C, H, W); the inputs here are {spec.describe()}",
        )
    models.check(s.model, spec)


def run(ctx: Context) -> None:
    from perflab.train import loop

    s = ctx.settings
    assert s.strategy is not None and s.trainer is not None
    if s.strategy.name != "ddp":
        loop.Trainer(ctx).fit()
        return
    st = s.strategy
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


def rendezvous_from_slurm() -> str:
    """host:port on the first node of this SLURM allocation (every task computes the same)."""
    from perflab.slurm import first_node

    host = first_node(os.environ.get("SLURM_JOB_NODELIST", ""))
    port = 29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000
    return f"{host}:{port}" if host else ""


def _ddp_worker(ctx: Context) -> None:
    import torch.distributed as dist

    from perflab import workers
    from perflab.train import loop

    rank, world, local = workers.init_process_group(ctx.devices, ctx.settings.strategy.backend)
    try:
        loop.Trainer(ctx, rank=rank, world=world, local_rank=local).fit()
    finally:
        dist.destroy_process_group()


def progress(row: Mapping[str, Any]) -> str | None:
    """Each epoch's line; other rows get the generic one."""
    if row.get("measurement") != "epoch" or row.get("status") != "ok":
        return None
    return (
        f"epoch {row['epoch']}: {row['train_s']:.2f} s train, {row['eval_s']:.2f} s eval, "
        f"{row['items_per_s']:.4g} {row.get('items_unit') or 'items'}/s, loss {row['train_loss']:.4f}, "
        f"train acc {row['train_acc']:.3f}, "
        f"test acc {row['test_acc']:.3f}, lr {row['lr']:.4g}, waiting for data {row['data_wait_frac']:.0%}"
    )


def label(row: Mapping[str, Any]) -> str:
    """An epoch row is "epoch N" in the job's table."""
    from perflab.rows import number

    epoch = number(row.get("epoch"))
    return f"epoch {int(epoch)}" if row.get("measurement") == "epoch" and epoch is not None else str(row["measurement"])


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.rows import number
    from perflab.table import human_time

    summary = next((r for r in reversed(rows) if r.get("measurement") == "train" and r.get("status") == "ok"), None)
    if summary is None:
        return []
    n = int(number(summary.get("n_devices")) or 1)
    unit = summary.get("items_unit") or "items"
    line = (
        f"{summary.get('model')} x {summary.get('strategy')} on {n} device{'s' if n > 1 else ''}: "
        f"{number(summary['items_per_s']) or 0:.4g} {unit}/s ({number(summary.get('per_device_items_per_s')) or 0:.4g} "
        f"per device), epoch {human_time(summary.get('median_s'))}, final test acc "
        f"{number(summary.get('test_acc')) or 0:.3f}"
    )
    lines = [
        line,
        f"model FLOPs: {number(summary.get('tflops')) or 0:.3g} TFLOP/s achieved"
        + (f", MFU {float(summary['mfu']):.1%}" if number(summary.get("mfu")) is not None else "")
        + (
            f", {float(summary['pct_of_peak']):.0f}% of the measured peak"
            if number(summary.get("pct_of_peak")) is not None
            else ""
        ),
    ]
    wait = number(summary.get("data_wait_frac"))
    if wait is not None:
        lines.append(
            f"input pipeline: {wait:.0%} of the step time waiting for data" + (" (input-bound)" if wait >= 0.5 else "")
        )
    return lines


def report(rows: DataFrame, samples: Samples) -> Section:
    """13.5 / 13.6 (by preset): the book's setup beside ours; the runs compared point by point,
    with their scaling and batch-size plots."""
    from perflab import plots
    from perflab.experiments import _book
    from perflab.frames import per_run, text

    names = rows["experiment"].dropna().unique() if "experiment" in rows else []
    number_, title, words, setup = BOOK.get(text(names[0]) if len(names) else "", ("", "Training", "", []))

    def ours(column: str) -> Callable[[Sequence[Mapping[str, Any]]], str]:
        def value(r: Sequence[Mapping[str, Any]]) -> str:
            summary = [x for x in r if x.get("measurement") == "train"]
            return text(summary[-1].get(column)) if summary else ""

        return value

    table, notes = compared(rows, samples)
    figures = [
        Figure(
            "scaling",
            plots.scaling,
            table,
            caption="Dashed: ideal linear scaling. Error bars (3 or more timed epochs): interquartile range "
            "of the epoch rates.",
            why_none="scaling: needs runs over devices.count (a sweep: devices.count=1,2)",
        ),
        Figure(
            "batch_size",
            plots.batch_size,
            table,
            why_none="speed and accuracy vs batch size: needs runs over trainer.batch_size",
        ),
    ]
    return Section(
        number=number_,
        title=title,
        headline=fastest(table) if table is not None and len(table) > 1 else (),
        reference=_book.REFERENCE,
        notes=[x for x in (words, _book.SETUP_ONLY if setup else "") if x],
        setup=[Setup(what, theirs, per_run(rows, ours(column))) for what, theirs, column in setup],
        tables=[points(table, notes)] if (table is not None and len(table) > 1) or notes else [],
        figures=figures if table is not None else [],
    )


def compared(rows: DataFrame, samples: Samples) -> tuple[DataFrame | None, list[str]]:
    """compare()'s table of the runs (S(n), E(n) when the device count varies), each point with
    its raw values for error bars, and what compare says about it."""
    from perflab import compare
    from perflab.frames import ok

    found = ok(rows)
    if found.empty:
        return None, []
    try:
        table = compare.compare(rows=found, samples=dict(samples))
    except compare.CompareError as err:
        return None, [str(err)]
    notes = list(table.attrs.get("notes", []))
    return (None if table.empty else table), notes


def _point(e: Mapping[str, Any], count: str | None) -> str:
    from perflab.frames import label

    return label([c for c in e if str(c).startswith("cfg.") and c != count], e) or str(e.get("measurement", ""))


def points(table: DataFrame | None, notes: Sequence[str]) -> Table:
    """The compared points: throughput, per device, S(n), E(n), test accuracy; throughput's
    unit in the header, or in each cell where the points count different items."""
    from perflab.frames import text, unit
    from perflab.rows import number

    intro = "Compared point by point (perflab compare)" + (": " + " ".join(notes) if notes else ".")
    if table is None:
        return Table([], [], intro)
    count = next((c for c in ("cfg.devices.count", "n_devices") if c in table), None)
    metric = str(table["metric"].iloc[0])
    shared = unit(table, default="")  # "" where points count different items: each cell says its unit
    each = metric == "items_per_s" and not shared
    rate = "throughput" if each else f"{shared}/s" if metric == "items_per_s" else metric
    body = []
    for e in table.to_dict("records"):

        def fmt(column: str, pattern: str = "{:.4g}", e: Mapping[str, Any] = e) -> str:
            x = number(e.get(column))
            return pattern.format(x) if x is not None else ""

        body.append(
            [
                _point(e, count),
                text(e.get(count)) if count else "",
                fmt(metric) + (f" {text(e.get('items_unit')) or 'items'}/s" if each else ""),
                fmt("per_device_items_per_s"),
                fmt("speedup", "{:.2f}x"),
                fmt("efficiency", "{:.0%}"),
                fmt("test_acc", "{:.3f}"),
                text(e.get("runs")),
                text(e.get("suspect")),
            ]
        )
    header = ["point", "devices", rate, "per device", "S(n)", "E(n)", "test acc", "runs", "suspect"]
    return Table(header, body, intro)


def fastest(table: DataFrame) -> list[str]:
    """A sweep's headline: its fastest point, and how far the device count scaled."""
    from perflab.frames import text
    from perflab.rows import number

    metric = str(table["metric"].iloc[0])
    count = next((c for c in ("cfg.devices.count", "n_devices") if c in table), None)
    rows = table.dropna(subset=[metric]).to_dict("records")
    if not rows:
        return []
    top = max(rows, key=lambda e: float(e[metric]))
    unit = f"{text(top.get('items_unit')) or 'items'}/s" if metric == "items_per_s" else metric
    where = ", ".join(x for x in (_point(top, count), f"{number(top.get(count)) or 0:g} devices" if count else "") if x)
    acc = number(top.get("test_acc"))
    lines = [
        f"fastest: {where}: {float(top[metric]):.4g} {unit}" + (f", test acc {acc:.3f}" if acc is not None else "")
    ]
    scaled = [e for e in rows if number(e.get("speedup")) is not None and count and (number(e.get(count)) or 0) > 1]
    if scaled:
        far = max(scaled, key=lambda e: (number(e.get(count)) or 0, float(e[metric])))
        lines.append(
            f"on {number(far.get(count)) or 0:g} devices ({_point(far, count)}): {float(far['speedup']):.2f}x one "
            f"device, efficiency {float(far['efficiency']):.0%}"
        )
    return lines
