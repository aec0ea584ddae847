"""Compilers (book 13.1): eager vs TorchScript vs torch.compile, compile cost, break-even, correctness,
on the book's MLP or any model (``model=``, ``model._target_``) with inputs of the data's shape."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence

from perflab.experiment import (
    COMPILE_MODES,
    MISSING,
    PRECISIONS,
    ConfigError,
    ExperimentConfig,
    PerflabConfig,
    one_of,
    positive,
    require,
    some_of,
)
from perflab.measure.dynamo import unique_graphs

if TYPE_CHECKING:
    from perflab.experiment import Context, Device

METRIC = "median_s"
SCRIPT_NOTE = (
    "torch.jit.script is deprecated in current PyTorch (torch.compile / torch.export replace it); "
    "kept: the book uses it"
)
MODES = ("eager", "torchscript", *(f"compile-{m}" for m in COMPILE_MODES))


@dataclass
class Config(ExperimentConfig):
    model: Optional[str] = None  # moved: the model is the model group (model=NAME, model._target_=...)
    batch: int = MISSING  # inputs per call (the book: 1)
    modes: list[str] = MISSING  # eager, torchscript, compile-default, compile-reduce-overhead ...
    backend: str = MISSING  # torch.compile's backend
    atol: float = MISSING  # correctness gate: largest allowed |output - eager output| on fresh inputs
    serialize: bool = MISSING  # save TorchScript / torch.export files, reload them in a fresh process
    precision: str = MISSING  # fp32 | tf32 | bf16-mixed | fp16-mixed: inference under this precision
    channels_last: bool = MISSING  # image data: weights and inputs in NHWC

    def __post_init__(self) -> None:
        require(
            self.model is None,
            "model",
            self.model,
            f"model={self.model} instead: the model group, shared with training (model._target_=... for yours)",
        )
        positive(self, "batch")
        some_of(self, "modes", MODES)
        require(self.atol > 0, "atol", self.atol, "a number > 0")
        one_of(self, "precision", PRECISIONS)


def check(settings: PerflabConfig, devices: Sequence[Device]) -> None:
    """TF32 needs a CUDA device, torch.compile a backend it has, NHWC image inputs, and the
    model the data (a dry forward): refused before the job runs."""
    from perflab import models
    from perflab.measure import dynamo, precision
    from perflab.train import data

    params: Any = settings.experiment  # this module's Config
    precision.check("experiment.precision", params.precision, devices[:1])
    if any(m.startswith("compile-") for m in params.modes):
        dynamo.check_backend("experiment.backend", params.backend)
    if settings.model is None or settings.data is None:
        raise ConfigError("model", None, "a model and a data config (the compile preset's defaults)")
    spec = data.spec(models.fitted_data(settings.model, settings.data))
    spec.check_channels_last(params.channels_last)
    models.check(settings.model, spec)


def run(ctx: Context) -> None:
    import torch

    from perflab import models
    from perflab.experiment import Benchmark, Part, on_device
    from perflab.measure import flops, precision
    from perflab.train import data

    p, s = ctx.params, ctx.settings
    d = ctx.devices[0]
    spec = data.spec(models.fitted_data(s.model, s.data))
    torch.manual_seed(s.seed)
    model = models.build(s.model, spec).to(d.torch).eval()
    layout = torch.channels_last if p.channels_last else torch.contiguous_format
    if p.channels_last:
        model = model.to(memory_format=torch.channels_last)

    def fresh_input() -> Any:
        x = spec.example(p.batch, d.torch)
        return x.contiguous(memory_format=layout) if p.channels_last else x

    x = fresh_input()
    knobs: dict[str, Any] = {
        "model": s.model.label,
        "input": spec.describe(),  # (B, 1, 28, 28) float32, (B, 64) token ids < 256
        "precision": p.precision,
        "channels_last": p.channels_last,
        "items_unit": "inputs",
    }
    with on_device(d), torch.no_grad(), precision.applied(p.precision, d.type):
        per_call, flops_note = flops.estimated("FLOPs", lambda: flops.count(lambda: model(x)))
        moved, bytes_note = flops.estimated(
            "arithmetic intensity", lambda: flops.bytes_moved(model, spec.example(2, "meta"), p.precision, False)
        )
        if per_call is not None and moved is not None:
            knobs["intensity"] = per_call / (moved[0] + moved[1] * p.batch)  # FLOP/byte, estimated
        estimates = "; ".join(n for n in (flops_note, bytes_note) if n)
        with Benchmark("eager first call", [d], report=False) as first:
            model(x)
        parts = {
            "eager": Part(
                lambda: model(x),
                [d],
                items=p.batch,
                flops=per_call,
                dtype=p.precision,
                extra={
                    **knobs,
                    "first_call_s": first.elapsed,
                    "note": "; ".join(n for n in ("inference under torch.no_grad()", estimates) if n),
                },
            )
        }
        first_s = {"eager": first.elapsed}
        candidates = {}
        for mode in (m for m in p.modes if m != "eager"):
            candidate, note = build(mode, model, p.backend)
            gated = gate(ctx, mode, model, candidate, fresh_input, d, p.atol, note, knobs)
            if gated is None:
                continue
            first_s[mode], diff, graphs = gated
            candidates[mode] = candidate
            parts[mode] = Part(
                lambda c=candidate: c(x),
                [d],
                items=p.batch,
                flops=per_call,
                dtype=p.precision,
                extra={**knobs, "first_call_s": first_s[mode], "max_abs_diff": diff, "graphs": graphs, "note": note},
            )
        recompiles = RecompileCounter()
        ctx.measure_rounds(
            parts, relate=lambda s: compared(s, first_s, candidates, x, recompiles), watch=recompiles.sample
        )
    if p.serialize:
        serialize(ctx, model, fresh_input(), d, p.atol)


def build(mode: str, model: Any, backend: str) -> tuple[Callable, str]:
    import torch

    if mode == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its deprecation: said in the row's note
            return torch.jit.script(model), SCRIPT_NOTE
    compile_mode = mode.removeprefix("compile-")
    torch._dynamo.reset()
    return torch.compile(
        model, mode=compile_mode, backend=backend
    ), f"torch.compile(mode={compile_mode}, backend={backend})"


def gate(
    ctx: Context,
    name: str,
    eager: Any,
    candidate: Callable,
    fresh_input: Callable[[], Any],
    d: Any,
    atol: float,
    note: str,
    knobs: dict[str, Any],
) -> tuple[float, float, int] | None:
    """Time the first call (compiling), then check outputs against eager on new inputs.

    A mismatch beyond ``atol`` is an ``error`` row and the mode is not timed: a fast wrong
    answer is not a result. Returns (first call seconds, largest difference, graphs compiled).
    """
    from perflab.experiment import Benchmark

    x = fresh_input()
    graphs_before = unique_graphs()
    with Benchmark(f"{name} first call", [d], report=False) as first:
        candidate(x)
    graphs = unique_graphs() - graphs_before
    check = fresh_input()
    diff = (candidate(check).float() - eager(check).float()).abs().max().item()
    if not diff <= atol:
        hint = f" (under {knobs['precision']}: raise experiment.atol)" if knobs["precision"] != "fp32" else ""
        ctx.record(
            name,
            status="error",
            devices=[d],
            max_abs_diff=diff,
            first_call_s=first.elapsed,
            **knobs,
            error=f"output differs from eager by {diff:.3g} > atol {atol:g}{hint}",
            note=note,
        )
        return None
    return first.elapsed, diff, graphs


class RecompileCounter:
    """Graphs compiled while each mode's samples ran: a steady state should compile none."""

    def __init__(self) -> None:
        self.by_mode: dict[str, int] = {}

    @contextlib.contextmanager
    def sample(self, name: str) -> Iterator[None]:
        before = unique_graphs()
        yield
        self.by_mode[name] = self.by_mode.get(name, 0) + unique_graphs() - before


def compared(
    stats: Mapping[str, Any],
    first_s: Mapping[str, float],
    candidates: Mapping[str, Callable],
    x: Any,
    recompiles: RecompileCounter,
) -> dict[str, dict[str, Any]]:
    """Each mode against eager: speedup, the calls after which compiling pays, recompiles, breaks."""
    eager = stats["eager"].median
    out: dict[str, dict[str, Any]] = {}
    for mode in candidates:
        s = stats[mode].median
        out[mode] = {
            "speedup_vs_eager": eager / s,
            "break_even_calls": break_even(first_s[mode], s, eager),
            "recompiles": recompiles.by_mode.get(mode, 0),
            "graph_breaks": graph_breaks(candidates[mode], x),
        }
    return out


def break_even(first_s: float, steady_s: float, eager_s: float) -> float:
    """Calls after which compiling has paid for itself (NaN: it never does)."""
    if steady_s >= eager_s:
        return math.nan
    return max(1.0, math.ceil((first_s - steady_s) / (eager_s - steady_s)))


def graph_breaks(candidate: Callable, x: Any) -> float:
    import torch

    original = getattr(candidate, "_orig_mod", None)
    if original is None:
        return math.nan  # not a torch.compile'd module
    try:
        return float(torch._dynamo.explain(original)(x).graph_break_count)
    except Exception:  # explain is a debugging aid; its absence must not fail the row
        return math.nan


def serialize(ctx: Context, model: Any, x: Any, d: Any, atol: float) -> None:
    """Save TorchScript and torch.export files, reload each in a fresh process, compare outputs."""
    import torch

    from perflab.errors import first_line

    out = ctx.run_dir
    torch.save(x.cpu(), out / "input.pt")
    with torch.no_grad():
        expected = model(x).cpu()
    for kind, path in (("torchscript", out / "model.torchscript.pt"), ("torch.export", out / "model.pt2")):
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its deprecation: said in the row's note
                if kind == "torchscript":
                    torch.jit.script(model).save(str(path))
                else:
                    torch.export.save(torch.export.export(model, (x,)), str(path))
        except Exception as exc:  # a model the format cannot hold is a finding, not a crash
            ctx.record(f"save {kind}", status="error", devices=[d], error=f"{type(exc).__name__}: {first_line(exc)}")
            continue
        result = out / f"output.{path.suffix[1:]}.pt"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "perflab.measure.reload",
                "torchscript" if kind == "torchscript" else "export",
                str(path),
                str(out / "input.pt"),
                str(result),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            ctx.record(
                f"reload {kind}",
                status="error",
                devices=[d],
                error=first_line("\n".join(reversed(proc.stderr.splitlines()))),
            )  # its last line
            continue
        got = torch.load(result, weights_only=True).cpu()
        diff = (got - expected).abs().max().item()
        ok = diff <= atol
        ctx.record(
            f"reload {kind} in a fresh process",
            status="ok" if ok else "error",
            devices=[d],
            file_mb=path.stat().st_size / 2**20,
            load_s=json.loads(proc.stdout)["load_s"],
            max_abs_diff=diff,
            error="" if ok else f"reloaded output differs by {diff:.3g}",
            note=SCRIPT_NOTE if kind == "torchscript" else "torch.export.save / torch.export.load",
        )


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from perflab.experiment import human_time, number

    lines: list[str] = []
    for r in rows:
        name = str(r.get("measurement", ""))
        if r.get("status") != "ok" or name not in MODES or name == "eager":
            continue
        be = number(r.get("break_even_calls"))
        line = (
            f"{name}: {number(r.get('speedup_vs_eager')) or 0:.2f}x eager, first call (compiling) "
            f"{human_time(r.get('first_call_s'))}, pays off after {'never' if be is None else f'{be:.0f} calls'}"
        )
        counts = {k: number(r.get(k)) for k in ("graphs", "recompiles", "graph_breaks")}
        if name.startswith("compile-"):  # dynamo's counts: TorchScript has no graphs to count
            line += "; " + ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in counts.items() if v is not None)
        lines.append(line)
    return lines
