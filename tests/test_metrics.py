"""Beyond time: every measurement row carries memory and machine load; traces on demand."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import perflab
from perflab.config import registry
from perflab.measure.instruments import Machine, Memory
from perflab.measure.instruments.memory import host_peak

from conftest import FAST

MB = 2**20


def test_the_host_peak_sees_a_known_allocation():
    with host_peak() as quiet:
        pass
    with host_peak() as peak:
        block = np.ones(200 * MB // 8)  # 200 MiB, touched
        del block
    assert peak[0] - quiet[0] > 190


def test_memory_columns_per_part_grow_with_what_the_part_allocates(work, monkeypatch):
    def run(ctx):
        ctx.measure("small", lambda: np.ones(1 * MB // 8).sum())
        ctx.measure("big", lambda: np.ones(300 * MB // 8).sum())

    monkeypatch.setattr(registry.get("matmul").module, "run", run)
    df = perflab.run("quick/matmul", FAST).set_index("measurement")
    grown = df["rss_peak_mb"] - df["rss_before_mb"]
    assert grown["big"] > 290 and grown["small"] < 100
    assert (df["cpus"] >= 1).all()
    known = df["others_cpu_pct"].dropna()  # NaN: a window too short for the kernel's CPU-time ticks
    assert known.between(0, 100).all()
    assert "cuda_allocated_peak_mb" not in df or df["cuda_allocated_peak_mb"].isna().all()  # unknown is empty


def test_memory_columns_under_torch_utils_benchmark_see_its_loop(work, monkeypatch):
    """torch.utils.benchmark runs its own loop: its peak RSS is still read, around the whole loop."""

    def run(ctx):
        ctx.measure("big", lambda: np.ones(300 * MB // 8).sum())

    monkeypatch.setattr(registry.get("matmul").module, "run", run)
    df = perflab.run("quick/matmul", [*FAST, "bench.timer=torch_utils_benchmark"]).set_index("measurement")
    assert df.loc["big", "timer"] == "torch_utils_benchmark"
    assert df.loc["big", "rss_peak_mb"] - df.loc["big", "rss_before_mb"] > 290


def test_a_busy_machine_makes_a_measurement_suspect(work, monkeypatch):
    monkeypatch.setattr(Machine, "others_share", lambda self, own_s=None: 0.9)
    df = perflab.run("quick/matmul", FAST)
    assert df["suspect"].str.contains(r"the machine was busy: other processes used 90% of the \d+ CPUs").all()
    assert df["busy"].all()


def test_memory_with_no_samples_is_unknown_not_zero():
    cols = Memory().columns("never measured")
    assert math.isnan(cols["rss_peak_mb"]) and math.isnan(cols["rss_before_mb"])


def test_a_trace_per_measurement_on_demand(work):
    df = perflab.run("quick/matmul", [*FAST, "bench.profile=true"])
    (trace,) = df["trace"].tolist()
    events = json.loads((work / df.attrs["run_dir"] / trace).read_text())["traceEvents"]
    assert any("aten::mm" in str(e.get("name")) for e in events), "the trace holds the timed op"


@pytest.mark.parametrize(
    "name, dtype, expected",
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.5),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312.0),
        ("Tesla V100-SXM2-16GB", "bfloat16", None),
        ("CPU (2 threads)", "tf32", None),  # no TF32 on a CPU (its float32 peak: test_claims.py)
    ],
)
def test_datasheet_peaks_are_dense(name, dtype, expected):
    from perflab.measure import flops

    assert flops.datasheet_peak(name, dtype) == expected


def test_mfu_is_against_the_sum_of_the_devices_peaks():
    from perflab.measure import flops

    out = flops.utilization(312.0, ["NVIDIA A100-SXM4-80GB"] * 2, "bf16-mixed", measured_peak=300.0)
    assert out["mfu"] == pytest.approx(0.5) and out["pct_of_peak"] == pytest.approx(52.0)


def test_the_roofline_places_a_matmul_under_the_roofs_the_hardware_job_measured(work):
    from perflab.results import load

    perflab.run("quick/hardware", FAST)
    perflab.run("quick/matmul", FAST)
    rows = load(work / "outputs")
    matmul = rows[rows["experiment"] == "matmul"].iloc[0]
    assert matmul["intensity"] == pytest.approx(2 * 256 / (3 * 4)), "2n^3 FLOPs over 3 n^2 float32s moved"
    hardware = rows[rows["experiment"] == "hardware"]
    (figure,) = registry.get("hardware").section(hardware, {}).figures  # the roofline, drawn over every row
    fig = figure.plot(rows)
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert "FLOP/byte" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel() and ax.get_title().startswith("Roofline")
    (roof,) = [line for line in ax.get_lines() if "measured roof" in line.get_label()]  # only the float32 points'
    assert "float32" in roof.get_label()
    # Each roof is min(peak, bandwidth x intensity) at every intensity drawn (on a busy machine the
    # measured bandwidth can be so low that the plotted range never reaches the peak).
    bandwidth = hardware[hardware["measurement"].str.contains("memory copy")]["gbps"].max()
    if pd.notna(matmul.get("datasheet_tflops")):  # a datasheet peak (a CPU's derived): its roof beside
        (sheet,) = [line for line in ax.get_lines() if "datasheet roof" in line.get_label()]
        x, y = sheet.get_data()
        assert "float32" in sheet.get_label()
        assert y == pytest.approx(np.minimum(matmul["datasheet_tflops"], bandwidth * x / 1e3))
    x, y = roof.get_data()
    peaks = hardware.dropna(subset=["peak_tflops"]).set_index("flops_dtype")["peak_tflops"]
    assert len(peaks) > 1 and peaks["bfloat16"] != peaks["float32"]  # a roof per precision was measured ...
    peak = peaks["float32"]  # ... and the float32 matmul sits under the float32 one
    assert y == pytest.approx(np.minimum(peak, bandwidth * x / 1e3))
    (point,) = [c.get_offsets()[0] for c in ax.collections if "matmul" in c.get_label()]
    assert tuple(point) == pytest.approx((matmul["intensity"], matmul["tflops"]))


def test_threads_that_wait_for_a_cpu_are_said_on_screen_with_the_fix(cli, monkeypatch):
    from itertools import count

    from perflab.measure.instruments import machine

    calls = count()  # every window: 14 ns run, 86 ns waited in the run queue

    def run_queue():
        k = next(calls)
        return {1: (14 * k, 86 * k)}

    monkeypatch.setattr(machine, "run_queue", run_queue)
    out = " ".join(cli("+experiment=quick/matmul", *FAST).out.split())  # the note is wrapped to the terminal
    assert "its threads spent 86% of their runnable time waiting for a CPU" in out
    assert "run with fewer threads, as many as the cores that are free: OMP_NUM_THREADS=1 perflab" in out
