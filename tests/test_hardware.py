"""Book 13.4 on this machine: rows beside the book's figures, and peaks that later rows use."""

from __future__ import annotations

import json
import socket

import pytest
import torch

from perflab.results import load

from conftest import run_cli

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only rows")
SMALL = ["+experiment=hardware", "experiment.copy_mb=8", "experiment.launches=100", "experiment.cpu_matmul_size=128",
         "experiment.dtypes=[float32,float16]", "bench.repeats=3"]


@cpu_only
def test_hardware_rows_on_a_cpu_machine_and_peaks_for_later_rows(tmp_path):
    run_cli(*SMALL, cwd=tmp_path)
    df = load(tmp_path / "outputs").set_index("measurement")
    copy = df.loc["cpu host memory copy"]
    assert copy["status"] == "ok" and copy["gbps"] > 0 and copy["book_reference"] == 100
    latency = df.loc["cpu op dispatch latency"]
    assert latency["latency_us"] == pytest.approx(latency["median_s"] / 100 * 1e6)
    peak = df.loc["cpu peak matmul float32"]
    assert peak["peak_tflops"] == pytest.approx(2 * 128**3 / peak["min_s"] / 1e12)
    for part in ("host <-> device transfers", "peer copy between GPUs", "CUDA graph launch latency",
                 "cpu peak matmul float16"):
        assert df.loc[part, "status"] == "skipped", part

    stored = json.loads((tmp_path / "outputs" / "peaks.json").read_text())[socket.gethostname()]
    (device,) = stored
    assert stored[device]["matmul_float32"] == pytest.approx(peak["peak_tflops"])

    run_cli("+experiment=matmul", "experiment.size=128", "experiment.iterations=2", "bench.repeats=3", cwd=tmp_path)
    matmul = load(tmp_path / "outputs" / "results.csv")
    row = matmul[matmul["experiment"] == "matmul"].iloc[0]
    assert row["pct_of_peak"] == pytest.approx(100 * row["tflops"] / stored[device]["matmul_float32"])
