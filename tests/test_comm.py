"""Book 13.7: the cost model reproduces the worked example; allreduce runs over gloo workers."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import perflab
from perflab.measure import costmodel
from perflab.store.rundir import RunRecord

MB, GB = 1e6, 1e9
AGENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # torch's agent takes them


def test_cost_model_reproduces_the_books_worked_example():
    s, pcie = 160 * MB, 16 * GB
    assert costmodel.transfer_s(s, pcie) == pytest.approx(0.010)
    assert costmodel.aggregate_on_one_device_s(s, 4, pcie) == pytest.approx(0.060)
    assert costmodel.through_cpu_s(s, 4, pcie) == pytest.approx(0.080)
    assert costmodel.split_n_ways_s(s, 4, pcie) == pytest.approx(0.015)
    assert costmodel.ring_book_s(s, 18 * GB, links=3) == pytest.approx(0.006, abs=0.0001)  # 5.93 ms "≈ 6 ms"
    assert costmodel.ring_s(s, 8, 18 * GB, links=3) == pytest.approx(2 * 7 / 8 * s / (54 * GB))
    for case in costmodel.book_cases():
        assert case.model_s == pytest.approx(case.book_s, rel=0.15), case.name


def test_latency_and_bus_bandwidth():
    assert costmodel.ring_s(8 * MB, 4, 1 * GB, latency=1e-3) == pytest.approx(6 * (1e-3 + 2 * MB / GB))
    assert costmodel.bus_bandwidth(1 * GB, 1.0, 4) == pytest.approx(1.5 * GB)
    assert costmodel.ring_s(1 * GB, 64, 1 * GB) < costmodel.ring_book_s(1 * GB, 1 * GB)


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_allreduce_over_two_gloo_workers_leaves_no_temp_dir_nor_signal_handler_behind(work, monkeypatch):
    """Two gloo workers measure allreduce; after them no torchelastic_* temp dir is left (a
    private TMPDIR: other jobs' come and go in the shared one). torch's elastic agent installs its
    own SIGINT / SIGTERM handlers while workers run: once they are gone, Ctrl-C stops the next
    job and reaches the caller as KeyboardInterrupt."""
    import tempfile

    tmp = work / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the workers' ...
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # ... and the launcher's, in this process
    handlers = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    df = perflab.run(
        "quick/comm",
        [
            "devices.spec=cpu",
            "devices.count=2",
            "experiment.min_bytes=1024",
            "experiment.max_bytes=16384",
            "bench.repeats=3",
            "bench.warmup=1",
        ],
    )
    df = df.set_index("measurement")
    measured = df[df.index.str.startswith("allreduce")]
    assert list(measured.index) == ["allreduce 1 KiB", "allreduce 4 KiB", "allreduce 16 KiB"]
    assert (measured["status"] == "ok").all() and (measured["backend"] == "gloo").all()
    assert (measured["world_size"] == 2).all() and (measured["n"] == 3).all()
    assert measured["gbps"].tolist() == pytest.approx(
        (measured["bytes_per_rank"] / measured["median_s"] / 1e9).tolist()
    )
    assert measured["bus_gbps"].tolist() == pytest.approx(measured["gbps"].tolist())  # 2(n-1)/n = 1 for n = 2
    book = df.loc["model: 4 GPUs: aggregate through the CPU"]
    assert book["model_s"] == pytest.approx(0.080) and book["book_s"] == pytest.approx(0.080)
    logs = list((work / "outputs" / "runs").glob("*/workers"))
    assert logs, "the workers' logs are inside the run dir"
    assert not list(tmp.glob("torchelastic_*")), "the workers' temp dirs are removed"
    assert {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS} == handlers

    (comm,) = (work / "outputs" / "runs").iterdir()
    started, done = threading.Event(), threading.Event()

    def ctrl_c_once_measuring() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not done.is_set():
            if any((d / "run.json").is_file() for d in (work / "outputs" / "runs").iterdir() if d != comm):
                started.set()
                time.sleep(0.2)  # measuring by now
                if not done.is_set():
                    os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=ctrl_c_once_measuring, daemon=True)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            perflab.run("quick/matmul", ["bench.repeats=100000"])
    finally:
        done.set()
        thread.join()
    assert started.is_set()
    (stopped,) = [d for d in (work / "outputs" / "runs").iterdir() if d != comm]
    record = RunRecord.read(stopped)
    assert record is not None and (record.outcome, record.error) == ("cancelled", "interrupted (Ctrl-C)")
