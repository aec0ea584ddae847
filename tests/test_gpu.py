"""CUDA paths, run only where a GPU is (skipped on CPU-only machines, never faked).

On a GPU machine: ``python -m pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

import perflab
from perflab.measure import flops
from perflab.measure.bench import measure
from perflab.measure.devices import Device

from conftest import FAST

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_cuda_events_time_one_gpu():
    gpu = Device("cuda:0", "cuda", 0)
    a = torch.randn(1024, 1024, device="cuda:0")
    stats = measure(lambda: a @ a, [gpu], warmup=2, repeats=5)
    assert stats.timer == "cuda_event" and stats.median > 0


def test_auto_parallel_overlaps_compute_and_copy(work):
    df = perflab.run("quick/auto_parallel", FAST).set_index("measurement")
    overlapped = df.loc["cuda:0 compute + copy overlapped"]
    assert overlapped["status"] == "ok" and overlapped["overlap_speedup"] > 0
    assert df.loc["cuda:0 alone", "timer"] == "cuda_event"
    assert df.loc["cuda:0 alone", "cuda_allocated_peak_mb"] > 0


def test_ddp_with_nccl_on_one_gpu_in_bf16(work):
    df = perflab.run(
        "quick/train", ["strategy=ddp", "devices.spec=[cuda:0]", "data.on_device=true", "trainer.precision=bf16-mixed"]
    )
    assert (df["status"] == "ok").all() and (df["world_size"] == 1).all()
    name = torch.cuda.get_device_name(0)
    if flops.datasheet_peak(name, "bfloat16"):
        assert df[df["measurement"] == "train"]["mfu"].iloc[0] > 0


def test_hardware_rows_on_a_gpu(work):
    df = perflab.run("quick/hardware", [*FAST, "devices.spec=[cuda:0]"]).set_index("measurement")
    for name in (
        "cuda:0 host -> device (pinned)",
        "cuda:0 kernel launch latency (CUDA graph)",
        "cuda:0 peak matmul tf32",
        "cuda:0 device memory copy",
    ):
        assert df.loc[name, "status"] == "ok", name


def test_compile_on_a_gpu(work):
    df = perflab.run(
        "compile",
        [
            "model=lenet",
            "data.shape=[1,28,28]",
            "experiment.batch=64",
            "devices.spec=[cuda:0]",
            "experiment.atol=1e-3",
            *FAST,
            "experiment.serialize=false",
        ],
    )
    assert (df["status"] == "ok").all(), df[["status", "error"]]
