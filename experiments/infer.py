"""Inference: forward latency and throughput of any model perflab builds (its own, a
``_target_``, torchvision's, timm's, Hugging Face's) across batch sizes, in eval mode under
``torch.inference_mode``; the model's load time and memory; its first call apart from the
warm-up and the samples. Precision, channels_last and torch.compile as in the compile and
training experiments; ``export``: the model through ``torch.export`` (what the compile
experiment's ``serialize`` saves), its ``.module()`` timed."""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.config.schema import COMPILE_MODES, PRECISIONS, ExperimentConfig, PerflabConfig, one_of, require
from perflab.errors import ConfigError, first_line

if TYPE_CHECKING:
    from perflab.job.context import Context
    from perflab.measure.devices import Device

METRIC = "median_s"
LOAD_NOTE = "the model built and moved to the device, once: one sample (median_s = load_s, its spread unknown)"
FOLDER_NOTE = "its folder's weights read; the check before the job built it too, so its files come from the page cache"


@dataclass
class Config(ExperimentConfig):
    batches: list[int] = field(default_factory=lambda: [1, 8, 32])  # inputs per call, one row each
    seq_len: int = 128  # a Hugging Face language model's tokens per input (its positions at most)
    precision: str = "fp32"  # fp32 | tf32 (CUDA) | bf16-mixed | fp16-mixed (autocast)
    channels_last: bool = False  # image inputs: weights and inputs in NHWC
    compile: bool = False  # torch.compile the model (its first call, compiling, gets first_call_s)
    compile_mode: str = "default"
    backend: str = "inductor"
    export: bool = False  # torch.export.export the model per batch (static shapes), time its .module()

    def __post_init__(self) -> None:
        batches = list(self.batches)
        require(bool(batches) and all(b >= 1 for b in batches), "batches", batches, "a non-empty list of integers >= 1")
        require(self.seq_len >= 1, "seq_len", self.seq_len, "an integer >= 1")
        one_of(self, "precision", PRECISIONS)
        one_of(self, "compile_mode", COMPILE_MODES)


def inputs_of(net: Any, settings: PerflabConfig, seq_len: int) -> Any:
    """What the model takes: a Hugging Face model's inputs from its config (its vocabulary, its
    image size), any other's from the data config (data.shape, data=tokens)."""
    from perflab import models
    from perflab.models import huggingface as hf
    from perflab.train import data

    return hf.input_spec(net, seq_len) or data.spec(models.fitted_data(settings.model, settings.data))


def check(settings: PerflabConfig, devices: Sequence[Device]) -> None:
    """The model builds and takes its inputs (a dry forward on two), TF32 and compile as the
    devices allow, NHWC only for images: before anything is timed."""
    import torch

    from perflab import models
    from perflab.measure import dynamo, precision
    from perflab.models import huggingface as hf
    from perflab.train import data

    p: Any = settings.experiment
    precision.check("experiment.precision", p.precision, devices[:1])
    if p.compile:
        dynamo.check_backend("experiment.backend", p.backend)
    if settings.model is None or settings.data is None:
        raise ConfigError("model", None, "a model and a data config (the infer preset's defaults)")
    net = models.build(settings.model, data.spec(models.fitted_data(settings.model, settings.data)))
    spec = inputs_of(net, settings, p.seq_len)
    longest = hf.max_positions(getattr(net, "inner", net).config) if hf.is_hf(getattr(net, "inner", net)) else None
    if spec.tokens and longest:  # an HF language model: its positions bound its inputs, never cut short
        within_positions("experiment.seq_len", p.seq_len, longest, longest)
    spec.check_channels_last(p.channels_last)
    if hf.input_spec(net) is None:
        models.check(settings.model, spec)
    else:
        try:
            with torch.inference_mode():
                net.eval()(spec.example(2))
        except Exception as err:
            raise ConfigError(
                "model",
                settings.model.label,
                "a model that runs on the inputs its config describes",
                problem=f"it fails on {tuple(spec.example(2).shape)}: {type(err).__name__}: {first_line(err)}",
            ) from None
    # experiment.export: run() exports the first batch before it records anything and refuses
    # there (one export per batch, that one included: an export here would be a second).


def within_positions(key: str, value: int, most: int, longest: int, given: str = "") -> None:
    """One rule for infer's and generate's token counts: ``key=value`` asks for at most ``most``,
    so that the sequence fits the model's ``longest`` positions; one line, exit 2, before anything
    is timed (cut short instead, a sweep's points would differ by their labels alone)."""
    if value > most:
        raise ConfigError(key, value, f"at most {most}", problem=f"{given}it outgrows the model's {longest} positions")


def exported(model: Any, x: Any, label: str) -> Any:
    """``torch.export.export(model, (x,)).module()``: the exported program as a module, its
    shapes those of ``x`` (one export per batch size, as an AOT deployment would build). A model
    export cannot capture whole is one line (exit 2)."""
    import torch

    try:
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # torch prints the graph it failed on
            return torch.export.export(model, (x,)).module()
    except Exception as err:
        raise ConfigError(
            "experiment.export",
            True,
            "false, or a model torch.export captures whole",
            problem=f"torch.export fails on {label}: {type(err).__name__}: {first_line(err)}",
        ) from None


def load(ctx: Context, device: Device) -> tuple[Any, dict[str, Any]]:
    """Build the model (from its folder, for a Hugging Face one) and move it to the device,
    timed once, with the memory it took: the ``load`` row's columns."""
    import torch

    from perflab import models
    from perflab.measure.devices import synchronize
    from perflab.measure.instruments import Memory
    from perflab.train import data

    s = ctx.settings
    memory = Memory([device])
    torch.manual_seed(s.seed)
    with memory.sample("load"):
        t0 = time.perf_counter()
        net = models.build(s.model, data.spec(models.fitted_data(s.model, s.data))).to(device.torch).eval()  # type: ignore[arg-type]
        synchronize([device])
        seconds = time.perf_counter() - t0
    params = sum(p.numel() for p in net.parameters())
    weights = sum(p.numel() * p.element_size() for p in net.parameters()) + sum(
        b.numel() * b.element_size() for b in net.buffers()
    )
    return net, {
        "load_s": seconds,
        "params": params,
        "weights_mb": weights / 2**20,
        **memory.columns("load"),
    }


def record_load(ctx: Context, device: Device, loaded: Mapping[str, Any], **knobs: Any) -> None:
    """The ``load`` row: its one timed sample as a timed row's statistics (median_s, n=1; the
    spread empty), so that compare and history read it as they read every other time."""
    from perflab.measure import bench
    from perflab.models.huggingface import is_folder

    name = getattr(ctx.settings.model, "name", None)  # a folder of model=hf; an architecture of timm's
    note = f"{LOAD_NOTE}; {FOLDER_NOTE}" if name and is_folder(str(name)) else LOAD_NOTE
    ctx.record("load", bench.stats_of([loaded["load_s"]]), devices=[device], **{**knobs, **loaded}, note=note)


def run(ctx: Context) -> None:
    import torch

    from perflab.measure import flops, precision
    from perflab.measure.bench import Benchmark
    from perflab.measure.devices import on_device

    p, s = ctx.params, ctx.settings
    d = ctx.devices[0]
    assert s.model is not None
    model, loaded = load(ctx, d)
    spec = inputs_of(model, s, p.seq_len)
    knobs: dict[str, Any] = {
        "model": s.model.label,
        "input": spec.describe(),
        "precision": p.precision,
        "channels_last": p.channels_last,
        "compiled": p.compile,
        "exported": p.export,
        "items_unit": spec.unit,
        "load_s": loaded["load_s"],
    }
    if p.channels_last:
        model = model.to(memory_format=torch.channels_last)

    def compiled(module: Any) -> Any:
        return torch.compile(module, mode=p.compile_mode, backend=p.backend) if p.compile else module

    def example(batch: int) -> Any:
        x = spec.example(batch, d.torch)
        return x.contiguous(memory_format=torch.channels_last) if p.channels_last else x

    def export(x: Any) -> tuple[Any, dict[str, Any]]:
        with torch.inference_mode(False), Benchmark("export", [d], report=False) as made:
            program = exported(model, x, s.model.label)  # type: ignore[union-attr]
        return program, {"export_s": made.elapsed}

    if p.compile:
        torch._dynamo.reset()
    run_model = compiled(model)  # one for every batch; an export is one per batch
    how = ", ".join(
        ["eval mode, torch.inference_mode()"]
        + (["torch.export.export(model, (x,)).module() per batch"] if p.export else [])
        + ([f"torch.compile(mode={p.compile_mode})"] if p.compile else [])
    )
    with on_device(d), torch.inference_mode(), precision.applied(p.precision, d.type):
        first = example(p.batches[0])
        pending = export(first) if p.export else None  # refused here, before any row
        record_load(ctx, d, loaded, **knobs)
        for i, batch in enumerate(p.batches):
            x = first if i == 0 else example(batch)
            export_cols: dict[str, Any] = {}
            if p.export:
                try:
                    program, export_cols = pending if i == 0 and pending else export(x)
                except ConfigError as err:  # the first batch exported: a later one's failure is an error row
                    raise RuntimeError(f"batch {batch}: {err.line()}") from None
                run_model = compiled(program)
            with Benchmark("first call", [d], report=False) as first_call:  # before any other call of this batch
                run_model(x)
            per_call, flops_note = flops.estimated("FLOPs", lambda x=x: flops.count(lambda: model(x)))
            ctx.measure(
                f"forward batch {batch}",
                lambda x=x, f=run_model: f(x),
                [d],
                items=batch * spec.items_per_sample,
                flops=per_call,
                dtype=p.precision,
                batch=batch,
                first_call_s=first_call.elapsed,
                **export_cols,
                **knobs,
                note="; ".join(n for n in (how, flops_note) if n),
            )


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.analysis.table import flags, human_time, rate
    from perflab.store.rows import number

    lines = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        if r.get("measurement") == "load":
            lines.append(
                f"{r.get('model')}: loaded in {human_time(r.get('load_s'))}, "
                f"{number(r.get('params')) or 0:,.0f} parameters ({number(r.get('weights_mb')) or 0:.1f} MB)"
                + (f"; input {r['input']}" if r.get("input") else "")
            )
        elif str(r.get("measurement", "")).startswith("forward batch"):
            lines.append(
                f"batch {number(r.get('batch')) or 0:.0f}: p50 {human_time(r.get('p50_s'))}, "
                f"p90 {human_time(r.get('p90_s'))}, "
                f"p99 {human_time(r.get('p99_s'))} (n={r.get('n')}), {rate(r, 'items_per_s')}; "
                f"first call {human_time(r.get('first_call_s'))}"
                + (f"; export {human_time(r.get('export_s'))}" if number(r.get("export_s")) is not None else "")
                + (f"  [{flags(r)}]" if flags(r) else "")
            )
    return lines
