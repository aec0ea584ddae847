"""Book 13.1: compile modes, the correctness gate, and serialization round trips."""

from __future__ import annotations

import math

import pytest
import torch

from perflab.context import Context
from perflab.devices import resolve
from perflab.results import ResultsWriter, load
from perflab.schema import validate

import experiments.compile as compile_exp
from conftest import run_cli


@pytest.fixture
def ctx(compose_cfg, tmp_path):
    settings = validate(compose_cfg("+experiment=compile", "devices.spec=cpu", "bench.repeats=3",
                                    "bench.min_time_s=0", "bench.warmup=1"))
    return Context(settings, resolve(settings.devices), ResultsWriter(tmp_path, None),
                   {"run_id": "test", "experiment": "compile"})


def _corrupting_backend(gm, example_inputs):
    """A 'compiler' whose code runs but answers wrong: what the gate is there to catch."""
    def run(*args):
        out = gm(*args)
        return type(out)(o + 0.5 for o in out) if isinstance(out, (tuple, list)) else out + 0.5

    return run


def _gate(ctx, name, backend):
    torch.manual_seed(0)
    model = compile_exp.mlp().eval()
    torch._dynamo.reset()
    candidate = torch.compile(model, backend=backend)
    with torch.no_grad():
        compile_exp.gate_and_measure(ctx, name, model, candidate, lambda: torch.randn(1, 512), ctx.devices[0],
                                     eager_s=1e-3, atol=1e-4)
    return {r["measurement"]: r for r in ctx.writer.rows}[name]


def test_correctness_gate_fires_when_compiled_output_differs(ctx):
    row = _gate(ctx, "compile-corrupt", _corrupting_backend)
    assert row["status"] == "error"
    assert row["error"].startswith("output differs from eager by 0.5 > atol 0.0001")
    assert row.get("median_s", "") == "", "a wrong answer is never timed as a result"


def test_correctness_gate_passes_a_faithful_compile(ctx):
    row = _gate(ctx, "compile-eager-backend", "eager")
    assert row["status"] == "ok" and float(row["max_abs_diff"]) <= 1e-4
    assert float(row["first_call_s"]) > 0 and int(row["graphs"]) >= 1 and float(row["graph_breaks"]) == 0


def test_break_even_calls():
    assert compile_exp._break_even(first_s=10.0, steady_s=1.0, eager_s=2.0) == 9
    assert compile_exp._break_even(first_s=0.5, steady_s=1.0, eager_s=2.0) == 1
    assert math.isnan(compile_exp._break_even(first_s=10.0, steady_s=2.0, eager_s=2.0))  # never pays off


@pytest.mark.slow
def test_compile_experiment_end_to_end_with_serialization(tmp_path):
    run_cli("+experiment=compile", "bench.repeats=5", "bench.min_time_s=0", cwd=tmp_path)
    df = load(tmp_path / "outputs").set_index("measurement")
    assert (df["status"] == "ok").all(), df[["status", "error"]]
    compiled = df.loc["compile-default"]
    assert compiled["first_call_s"] > compiled["median_s"]  # compiling costs time once
    assert compiled["speedup_vs_eager"] == pytest.approx(df.loc["eager", "median_s"] / compiled["median_s"])
    assert "deprecated" in df.loc["torchscript", "note"]
    for kind in ("torchscript", "torch.export"):
        row = df.loc[f"reload {kind} in a fresh process"]
        assert row["max_abs_diff"] <= 1e-4 and row["file_mb"] > 0 and row["load_s"] > 0
