"""Book 13.1: compile modes, the correctness gate, and serialization round trips."""

from __future__ import annotations

import math

import pytest
import torch

import perflab
from perflab import models
from perflab.book import compile as book_compile
from perflab.config.schema import validate
from perflab.experiments import compile as compile_exp
from perflab.job.context import Context
from perflab.measure.devices import resolve
from perflab.results import load
from perflab.store.rundir import RunWriter

from conftest import FAST, run_subprocess


@pytest.fixture
def ctx(compose_cfg, tmp_path):
    settings = validate(compose_cfg("+experiment=compile", "devices.spec=cpu", *FAST))
    return Context(
        settings, resolve(settings.devices).devices, RunWriter(tmp_path), {"run_id": "test", "experiment": "compile"}
    )


def _corrupting_backend(gm, example_inputs):
    """A 'compiler' whose code runs but answers wrong: what the gate is there to catch."""

    def run(*args):
        out = gm(*args)
        return type(out)(o + 0.5 for o in out) if isinstance(out, (tuple, list)) else out + 0.5

    return run


def _gate(ctx, name, backend):
    torch.manual_seed(0)
    model = models.mlp().eval()
    torch._dynamo.reset()
    candidate = torch.compile(model, backend=backend)
    with torch.no_grad():
        return compile_exp.gate(
            ctx,
            name,
            model,
            candidate,
            lambda: torch.randn(1, 512),
            ctx.devices[0],
            atol=1e-4,
            note="",
            knobs={"precision": "fp32"},
        )


def test_correctness_gate_fires_when_compiled_output_differs(ctx):
    assert _gate(ctx, "compile-corrupt", _corrupting_backend) is None
    row = {r["measurement"]: r for r in ctx.writer.rows}["compile-corrupt"]
    assert row["status"] == "error"
    assert row["error"].startswith("output differs from eager by 0.5 > atol 0.0001")
    assert row.get("median_s", "") == "", "a wrong answer is never timed as a result"


def test_correctness_gate_passes_a_faithful_compile(ctx):
    first_s, diff, graphs = _gate(ctx, "compile-eager-backend", "eager")
    assert first_s > 0 and diff <= 1e-4 and graphs >= 1
    assert ctx.writer.rows == []


def test_break_even_calls():
    assert compile_exp.break_even(first_s=10.0, steady_s=1.0, eager_s=2.0) == 9
    assert compile_exp.break_even(first_s=0.5, steady_s=1.0, eager_s=2.0) == 1
    assert math.isnan(compile_exp.break_even(first_s=10.0, steady_s=2.0, eager_s=2.0))  # never pays off


def test_modes_are_measured_in_rounds_with_speedup_flops_and_knobs(work):
    df = perflab.run(
        "quick/compile",
        [
            *FAST,
            "experiment.backend=eager",
            "model=lenet",
            "data.shape=[1,28,28]",
            "experiment.batch=4",
            "experiment.channels_last=true",
            "experiment.precision=bf16-mixed",
            "experiment.atol=0.1",
        ],
    )
    section = book_compile.report(df, {})  # its report hook reads the model group's rows
    assert [(s.what, s.here) for s in section.setup] == [("network", "lenet on (B, 1, 28, 28) float32, batch 4")]
    assert section.figures[0].plot(section.figures[0].rows) is not None, section.figures[0].why_none
    df = df.set_index("measurement")
    assert (df["status"] == "ok").all(), df[["status", "error"]]
    compiled = df.loc["compile-default"]
    assert compiled["speedup_vs_eager"] == pytest.approx(df.loc["eager", "median_s"] / compiled["median_s"])
    assert compiled["recompiles"] == 0 and compiled["graphs"] >= 1
    lenet_forward = 2 * (20 * 26 * 26 * 9 + 50 * 81 * 500 + 800 * 128 + 1280)
    assert compiled["tflops"] == pytest.approx(4 * lenet_forward / compiled["median_s"] / 1e12, rel=0.01)
    assert (df["precision"] == "bf16-mixed").all() and df["channels_last"].all()


@pytest.mark.slow
def test_compile_experiment_end_to_end_with_inductor_and_serialization(work):
    proc = run_subprocess("+experiment=compile", "bench.repeats=5", "bench.min_time_s=0", cwd=work)
    assert "No CUDA runtime" not in proc.stdout + proc.stderr and "Warning" not in proc.stdout + proc.stderr
    df = load(work / "outputs").set_index("measurement")
    assert (df["status"] == "ok").all(), df[["status", "error"]]
    compiled = df.loc["compile-default"]
    assert compiled["first_call_s"] > compiled["median_s"]  # compiling costs time once
    assert "deprecated" in df.loc["torchscript", "note"]
    for kind in ("torchscript", "torch.export"):
        row = df.loc[f"reload {kind} in a fresh process"]
        assert row["max_abs_diff"] <= 1e-4 and row["file_mb"] > 0 and row["load_s"] > 0
