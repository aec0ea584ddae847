"""Per-operator figures (bench.profile=true): a profiled pass reduced with the profiler's own
key_averages, written beside the rows, read back by results.load_operators."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
import torch

import perflab
from perflab.measure import operators
from perflab.results import load_operators

from conftest import FAST


def _block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.profiler.record_function("my_block"):
        return torch.nn.functional.gelu(x @ w)


def test_a_profiled_pass_names_each_op_its_calls_and_its_share():
    x, w = torch.randn(64, 128), torch.randn(128, 128)
    found = operators.profiled(lambda: _block(x, w), [])
    t = found.table.set_index("operator")
    assert t.loc["aten::gelu", "kind"] == "op" and t.loc["aten::gelu", "calls"] == 1
    assert t.loc["aten::mm", "self_s"] > 0
    assert t.loc["my_block", "kind"] == "range", "a record_function range is a range, its children in its time"
    assert t.loc["my_block", "self_s"] >= t.loc["aten::mm", "self_s"]
    assert not (t["kind"] == "kernel").any(), "no kernel is made up on a CPU"
    ops = t[t["kind"] == "op"]
    assert 0 < ops["share"].sum() <= 1.5, "the ops' self times add up to about the profiled call"
    assert (t["profiled_s"] == found.seconds).all() and found.seconds > 0
    assert found.pass_s >= operators.ACTIVE_CALLS * found.seconds * 0.9, "the pass: its calls at least"


def test_the_job_keeps_operators_beside_the_rows(work):
    df = perflab.run("quick/matmul", [*FAST, "bench.profile=true"])
    ops = load_operators(work / df.attrs["run_dir"])
    assert set(ops["row_id"]) == set(df["row_id"]), "every measurement's operators, keyed by its row"
    mm = ops[ops["operator"] == "aten::mm"]
    assert len(mm) == len(df) and (mm["self_s"] > 0).all()
    assert set(ops["kind"]) <= set(operators.KINDS)
    assert (ops["median_s"] > 0).all() and (ops["profiled_s"] > 0).all()
    pd.testing.assert_frame_equal(load_operators(work / "outputs"), ops)  # the tree's, through its index: the same
    for row in df.to_dict("records"):  # a short call profiled long enough that one preempted call weighs little
        steps = {e["name"] for e in json.loads((work / df.attrs["run_dir"] / row["trace"]).read_text())["traceEvents"]}
        assert len({s for s in steps if s.startswith("ProfilerStep#")}) == operators.calls_for(row["median_s"])
    # the pass's cost, said beside the timed samples': a warm-up call and the calls at least
    mm_of = mm.set_index("row_id")
    for row in df.to_dict("records"):
        assert row["profile_s"] >= operators.calls_for(row["median_s"]) * mm_of.loc[row["row_id"], "self_s"]


def test_profiled_calls_last_long_enough_within_bounds():
    assert operators.calls_for(5e-3) == 10
    assert operators.calls_for(1.0) == operators.calls_for(math.nan) == operators.ACTIVE_CALLS
    assert operators.calls_for(1e-7) == operators.MOST_CALLS


def test_no_operators_without_profile(work):
    df = perflab.run("quick/matmul", FAST)
    assert load_operators(work / df.attrs["run_dir"]).empty


def test_load_operators_refuses_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_operators(tmp_path / "nothing")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="kernels are profiled on a GPU only")
def test_kernels_on_a_gpu():
    from perflab.measure.devices import Device

    x = torch.randn(256, 256, device="cuda")
    found = operators.profiled(lambda: x @ x, [Device("cuda", 0)])
    kernels = found.table[found.table["kind"] == "kernel"]
    assert len(kernels) and (kernels["device"] == "cuda").all() and not math.isnan(kernels["self_s"].sum())


def test_a_compiled_region_and_a_custom_op_by_the_names_the_profiler_sees():
    lib = torch.library.Library("perflab_test_ops", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")

    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.perflab_test_ops.twice(x).sin()
        torch._dynamo.graph_break()
        return y.cos()

    g = torch.compile(f, backend="eager")
    x = torch.randn(64)
    g(x)
    t = operators.profiled(lambda: g(x), []).table.set_index("operator")
    assert t.loc["perflab_test_ops::twice", "kind"] == "op", "a custom op by its qualified name"
    regions = t[t.index.str.startswith(operators.COMPILED_REGION)]
    assert len(regions) >= 2 and (regions["kind"] == "range").all(), "a graph break: two compiled regions"
    assert not t.index.str.startswith("ProfilerStep").any()


THREAD_PROFILE = """
import sys, threading, torch
from torch.profiler import ProfilerActivity, profile
from perflab.measure import operators
if sys.argv[1] == "set_up":
    operators.set_up()
def job():
    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(3) + 1
t = threading.Thread(target=job)
t.start()
t.join()
"""


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_the_profiler_set_up_on_the_main_thread_lets_jobs_profile_on_theirs_without_a_complaint():
    """ab's sides in turns profile on their own threads: kineto complains on stderr unless its
    first profile was on the main thread (perflab.job.together does that first)."""
    said = {}
    for how in ("cold", "set_up"):
        ran = subprocess.run([sys.executable, "-c", THREAD_PROFILE, how], capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        said[how] = "External init callback" in ran.stderr
    if not said["cold"]:
        pytest.skip("this torch does not complain of a first profile on another thread")
    assert not said["set_up"]


def test_together_sets_the_profiler_up_where_a_side_is_profiled(monkeypatch):
    from perflab.job import together
    from perflab.measure import turns

    calls = []
    monkeypatch.setattr(operators, "set_up", lambda: calls.append("set_up"))
    monkeypatch.setattr(turns, "in_turns", lambda jobs: calls.append(len(jobs)) or [])
    for profiled in (False, True):
        pair = [["+experiment=quick/matmul", *(["bench.profile=true"] if profiled else [])]] * 2
        assert together.main([json.dumps([pair])]) == 0
    assert calls == [2, "set_up", 2]


def test_two_jobs_in_turns_profile_in_rounds_one_side_then_the_other():
    """ab's sides in one process: each side's profiled calls are ROUNDS profiles handing over
    between them, so a moment of the machine falls on both sides, as their samples' do."""
    import itertools

    from perflab.measure import turns

    order: list[str] = []

    def job(name: str):
        return lambda: operators.profiled(lambda: order.append(name) or torch.ones(8).sum(), [], calls=8)

    found = turns.in_turns([job("a"), job("b")])
    assert len([k for k, _ in itertools.groupby(order)]) == 2 * operators.ROUNDS, order
    for side in found:
        t = side.table.set_index("operator")
        assert t.loc["aten::sum", "calls"] == 1, "the rounds' events, per measured call"
        assert not t.index.str.startswith("ProfilerStep").any()


def test_a_round_is_one_profile_read_once(monkeypatch):
    """The profile ends with its calls: no second one started by its last step, stopped by the
    exit and read again (the schedule's default repeats)."""
    read = []
    real = operators.averaged
    monkeypatch.setattr(operators, "averaged", lambda p, cuda=False: read.append(1) or real(p, cuda))
    found = operators.profiled(lambda: torch.ones(8).sum(), [], calls=4)
    assert len(read) == 1
    assert found.table.set_index("operator").loc["aten::sum", "calls"] == 1
