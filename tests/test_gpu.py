"""CUDA paths, run only where a GPU is (skipped on CPU-only machines, never faked).

On the lent GPU machine: ``python -m pytest -m gpu`` (see the issue notes for the set-up).
"""

from __future__ import annotations

import pytest
import torch

from perflab.bench import measure
from perflab.devices import Device
from perflab.results import load

from conftest import FAST_BENCH, run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_cuda_events_time_one_gpu():
    gpu = Device("cuda:0", "cuda", 0)
    a = torch.randn(1024, 1024, device="cuda:0")
    stats = measure(lambda: a @ a, [gpu], warmup=2, repeats=5)
    assert stats.timer == "cuda_event" and stats.median > 0


def test_auto_parallel_overlaps_compute_and_copy(tmp_path):
    run_cli("+experiment=auto_parallel", "experiment.size=1024", "experiment.matmuls=8", *FAST_BENCH, cwd=tmp_path)
    df = load(tmp_path / "outputs").set_index("measurement")
    overlapped = df.loc["cuda:0 compute + copy overlapped"]
    assert overlapped["status"] == "ok" and overlapped["overlap_speedup"] > 0
    assert df.loc["cuda:0 alone", "timer"] == "cuda_event"


def test_ddp_with_nccl_on_one_gpu(tmp_path):
    run_cli("+experiment=train", "strategy=ddp", "devices.spec=[cuda:0]", "data.train_size=1024",
            "data.test_size=256", "trainer.epochs=2", "data.on_device=true", cwd=tmp_path)
    df = load(tmp_path / "outputs")
    assert (df["status"] == "ok").all() and (df["world_size"] == 1).all()


def test_hardware_rows_on_a_gpu(tmp_path):
    run_cli("+experiment=hardware", "devices.spec=[cuda:0]", "experiment.copy_mb=64", "experiment.transfer_mb=16",
            "experiment.matmul_size=2048", "experiment.dtypes=[float32,bfloat16]", *FAST_BENCH, cwd=tmp_path)
    df = load(tmp_path / "outputs").set_index("measurement")
    for name in ("cuda:0 host -> device (pinned)", "cuda:0 kernel launch latency (CUDA graph)",
                 "cuda:0 peak matmul tf32", "cuda:0 device memory copy"):
        assert df.loc[name, "status"] == "ok", name


def test_compile_on_a_gpu(tmp_path):
    run_cli("+experiment=compile", "experiment.model=lenet", "experiment.batch=64", "devices.spec=[cuda:0]",
            "experiment.atol=1e-3", "bench.repeats=5", "bench.min_time_s=0", cwd=tmp_path)
    df = load(tmp_path / "outputs").set_index("measurement")
    assert (df["status"] == "ok").all(), df[["status", "error"]]
