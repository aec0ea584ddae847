"""Compilers (book 13.1): eager vs TorchScript vs torch.compile, compile cost, break-even, correctness."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from omegaconf import MISSING
from torch import nn

from perflab.context import Context
from perflab.devices import Device, on_device, synchronize
from perflab.errors import first_line
from perflab.schema import ExperimentConfig, positive, require
from perflab.train import models

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
SCRIPT_NOTE = "torch.jit.script is deprecated in current PyTorch (torch.compile / torch.export replace it); kept: the book uses it"


@dataclass
class Config(ExperimentConfig):
    model: str = MISSING  # mlp (the book's 512-256-128-2) | lenet | resnet18 | resnet18_tv
    batch: int = MISSING  # inputs per call (the book: 1)
    modes: list[str] = field(default_factory=lambda: ["eager", "torchscript", "compile-default"])
    backend: str = "inductor"  # torch.compile's backend
    atol: float = 1e-4  # correctness gate: largest allowed |output - eager output| on fresh inputs
    serialize: bool = True  # save TorchScript / torch.export files and reload them in a fresh process

    def __post_init__(self) -> None:
        require(self.model in ("mlp", *models.MODELS), "model", self.model, "mlp, " + ", ".join(models.MODELS))
        positive(self, "batch")
        allowed = ["eager", "torchscript", *(f"compile-{m}" for m in COMPILE_MODES)]
        for mode in self.modes:
            require(mode in allowed, "modes", list(self.modes), ", ".join(allowed))
        require(self.atol > 0, "atol", self.atol, "a number > 0")


def mlp() -> nn.Module:
    """The book's network for hybridization: 512 -> 256 -> 128 -> 2."""
    return nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 2))


def run(ctx: Context) -> None:
    p = ctx.params
    d = ctx.devices[0]
    torch.manual_seed(ctx.settings.seed)
    model = (mlp() if p.model == "mlp" else models.build(p.model)).to(d.torch).eval()
    shape = (512,) if p.model == "mlp" else (1, 28, 28)

    def fresh_input() -> torch.Tensor:
        return torch.randn(p.batch, *shape, device=d.torch)

    x = fresh_input()
    with on_device(d), torch.no_grad():
        eager_first = first_call(model, x, d)
        eager = ctx.measure("eager", lambda: model(x), [d], items=p.batch, first_call_s=eager_first,
                            note="inference under torch.no_grad()")
        for mode in (m for m in p.modes if m != "eager"):
            candidate, note = build(mode, model, p.backend)
            gate_and_measure(ctx, mode, model, candidate, fresh_input, d, eager.median, p.atol, note)
    if p.serialize:
        serialize(ctx, model, fresh_input(), d, p.atol)


def build(mode: str, model: nn.Module, backend: str) -> tuple[Callable, str]:
    if mode == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(model), SCRIPT_NOTE
    compile_mode = mode.removeprefix("compile-")
    torch._dynamo.reset()
    return torch.compile(model, mode=compile_mode, backend=backend), f"torch.compile(mode={compile_mode}, backend={backend})"


def first_call(fn: Callable, x: torch.Tensor, d: Device) -> float:
    synchronize([d])
    t0 = time.perf_counter()
    fn(x)
    synchronize([d])
    return time.perf_counter() - t0


def gate_and_measure(ctx: Context, name: str, eager: nn.Module, candidate: Callable,
                     fresh_input: Callable[[], torch.Tensor], d: Device, eager_s: float, atol: float,
                     note: str = "") -> None:
    """Time the first call (compiling), check outputs against eager on new inputs, then time it.

    A mismatch beyond ``atol`` is an ``error`` row: a fast wrong answer is not a result.
    """
    x = fresh_input()
    graphs_before = _unique_graphs()
    first_s = first_call(candidate, x, d)
    graphs_after_first = _unique_graphs()
    check = fresh_input()
    diff = (candidate(check) - eager(check)).abs().max().item()
    if not diff <= atol:
        ctx.record(name, status="error", devices=[d], max_abs_diff=diff, first_call_s=first_s,
                   error=f"output differs from eager by {diff:.3g} > atol {atol:g}", note=note)
        return

    def after(s) -> dict:  # once the steady state is measured: did it recompile? where did it break?
        return {"speedup_vs_eager": eager_s / s.median, "break_even_calls": _break_even(first_s, s.median, eager_s),
                "recompiles": _unique_graphs() - graphs_after_first, "graph_breaks": _graph_breaks(candidate, x)}

    ctx.measure(name, lambda: candidate(x), [d], items=x.shape[0], first_call_s=first_s, max_abs_diff=diff,
                graphs=graphs_after_first - graphs_before, note=note, derive=after)


def _break_even(first_s: float, steady_s: float, eager_s: float) -> float:
    """Calls after which compiling has paid for itself (NaN: it never does)."""
    if steady_s >= eager_s:
        return math.nan
    return max(1.0, math.ceil((first_s - steady_s) / (eager_s - steady_s)))


def _unique_graphs() -> int:
    try:
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    except (AttributeError, KeyError):
        return 0


def _graph_breaks(candidate: Callable, x: torch.Tensor) -> float:
    original = getattr(candidate, "_orig_mod", None)
    if original is None:
        return math.nan  # not a torch.compile'd module
    try:
        return float(torch._dynamo.explain(original)(x).graph_break_count)
    except Exception:  # explain is a debugging aid; its absence must not fail the row
        return math.nan


def serialize(ctx: Context, model: nn.Module, x: torch.Tensor, d: Device, atol: float) -> None:
    """Save TorchScript and torch.export files, reload each in a fresh process, compare outputs."""
    out = Path(ctx.writer.run_dir)
    torch.save(x.cpu(), out / "input.pt")
    with torch.no_grad():
        expected = model(x).cpu()
    for kind, path in (("torchscript", out / "model.torchscript.pt"), ("torch.export", out / "model.pt2")):
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                if kind == "torchscript":
                    torch.jit.script(model).save(str(path))
                else:
                    torch.export.save(torch.export.export(model, (x,)), str(path))
        except Exception as exc:  # a model the format cannot hold is a finding, not a crash
            ctx.record(f"save {kind}", status="error", devices=[d], error=f"{type(exc).__name__}: {first_line(exc)}")
            continue
        proc = subprocess.run([sys.executable, "-m", "perflab.reload", "torchscript" if kind == "torchscript" else "export",
                               str(path), str(out / "input.pt"), str(out / f"output.{path.suffix[1:]}.pt")],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            ctx.record(f"reload {kind}", status="error", devices=[d],
                       error=first_line("\n".join(reversed(proc.stderr.splitlines()))))  # its last line
            continue
        got = torch.load(out / f"output.{path.suffix[1:]}.pt", weights_only=True).cpu()
        diff = (got - expected).abs().max().item()
        ok = diff <= atol
        ctx.record(f"reload {kind} in a fresh process", status="ok" if ok else "error", devices=[d],
                   file_mb=path.stat().st_size / 2**20, load_s=json.loads(proc.stdout)["load_s"],
                   max_abs_diff=diff, error="" if ok else f"reloaded output differs by {diff:.3g}",
                   note=SCRIPT_NOTE if kind == "torchscript" else "torch.export.save / torch.export.load")
