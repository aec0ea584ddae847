"""Book 13.4 on this machine: rows beside the book's figures, and peaks that later rows use."""

from __future__ import annotations

import json
import socket

import pytest

import perflab
from perflab.measure import flops

from conftest import FAST, cpu_only


@cpu_only
def test_hardware_rows_on_a_cpu_machine_and_peaks_for_later_rows(work):
    df = perflab.run("quick/hardware", [*FAST, "experiment.dtypes=[float32,float16]"]).set_index("measurement")
    copy = df.loc["cpu host memory copy"]
    assert copy["status"] == "ok" and copy["gbps"] > 0 and copy["book_reference"] == 100
    latency = df.loc["cpu op dispatch latency"]
    assert latency["latency_us"] == pytest.approx(latency["median_s"] / 200 * 1e6)
    peak = df.loc["cpu peak matmul float32"]
    assert peak["peak_tflops"] == pytest.approx(2 * 256**3 / peak["min_s"] / 1e12)
    for part in (
        "host <-> device transfers",
        "peer copy between GPUs",
        "CUDA graph launch latency",
        "cpu peak matmul float16",
    ):
        assert df.loc[part, "status"] == "skipped", part

    stored = json.loads((work / "outputs" / "peaks.json").read_text())[socket.gethostname()]
    (device,) = stored
    assert stored[device]["matmul_float32"] == pytest.approx(peak["peak_tflops"])

    row = perflab.run("quick/matmul", FAST).iloc[0]
    assert row["pct_of_peak"] == pytest.approx(100 * row["tflops"] / stored[device]["matmul_float32"])
    sheet = flops.cpu_datasheet_of(row["device_name"], "float32")  # derived from the CPU's description
    if sheet is not None:
        assert row["mfu"] == pytest.approx(row["tflops"] / sheet.tflops) and row["datasheet_basis"] == sheet.basis
