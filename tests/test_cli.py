"""The real command line, end to end, at tiny sizes, in a scratch working directory."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import experiments.matmul
from perflab import app, registry
from perflab.results import load

from conftest import FAST_BENCH, TINY, run_cli

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only labels")


def run_dirs(tmp_path):
    return sorted((tmp_path / "outputs" / "runs").glob("*"))


def test_no_experiment_lists_them_and_writes_nothing(tmp_path):
    proc = run_cli(cwd=tmp_path)
    assert "+experiment=NAME" in proc.stdout and "auto_parallel" in proc.stdout
    assert run_dirs(tmp_path) == []


@pytest.mark.parametrize("name", sorted(TINY))
def test_each_experiment_runs_and_writes_rows(tmp_path, name):
    proc = run_cli(f"+experiment={name}", *TINY[name], *FAST_BENCH, cwd=tmp_path)
    assert "measurement" in proc.stdout and "median" in proc.stdout  # the end-of-job table
    (run,) = run_dirs(tmp_path)
    df = load(run / "results.csv")
    assert len(df) >= 1 and set(df["experiment"]) == {name}
    ok = df[df["status"] == "ok"]
    assert len(ok) >= 1
    assert (ok["median_s"] > 0).all() and (ok["n"] == 3).all() and (ok["warmup_n"] == 1).all()
    assert (ok["min_s"] <= ok["median_s"]).all() and (ok["median_s"] <= ok["max_s"]).all()
    assert df["cfg.experiment.name"].eq(name).all()
    for col in ("torch", "hostname", "git_sha", "perflab_version", "timestamp"):
        assert df[col].notna().all(), col
    assert ok["num_threads"].notna().all() and ok["timer"].notna().all()
    samples = load(run, samples=True)
    assert set(samples["row_id"]) == set(ok["row_id"])
    ledger = load(tmp_path / "outputs" / "results.csv")
    assert sorted(ledger["row_id"]) == sorted(df["row_id"])


@cpu_only
def test_auto_parallel_on_cpu_uses_labelled_workers(tmp_path):
    run_cli("+experiment=auto_parallel", *TINY["auto_parallel"], *FAST_BENCH, cwd=tmp_path)
    df = load(tmp_path / "outputs").set_index("measurement")
    assert {"cpu#0 alone", "cpu#1 alone", "cpu#0 + cpu#1 together"} <= set(df.index)
    together = df.loc["cpu#0 + cpu#1 together"]
    alone = df.loc["cpu#0 alone", "median_s"] + df.loc["cpu#1 alone", "median_s"]
    assert together["sum_alone_s"] == pytest.approx(alone)
    assert together["concurrency"] == pytest.approx(alone / together["median_s"])
    assert together["ideal_concurrency"] == 2
    assert "no CUDA device" in together["fallback"]
    copy = df.loc["compute + copy to CPU"]
    assert copy["status"] == "skipped" and "needs a CUDA device" in copy["error"]


@cpu_only
def test_async_compute_says_cpu_ops_are_synchronous(tmp_path):
    run_cli("+experiment=async_compute", *TINY["async_compute"], *FAST_BENCH, cwd=tmp_path)
    df = load(tmp_path / "outputs").set_index("measurement")
    assert df.loc["torch cpu, no sync (host dispatch)", "timer"] == "wall_nosync"
    assert df.loc["torch cpu, synced (device time)", "timer"] == "wall_sync"
    assert "synchronously" in df.loc["torch cpu, no sync (host dispatch)", "note"]
    assert df.loc["numpy (CPU)", "status"] == "ok"
    item = df.loc["lenet cpu x2 steps, .item() every step"]
    free = df.loc["lenet cpu x2 steps, free-running (device time)"]
    assert item["slowdown_vs_free"] == pytest.approx(item["median_s"] / free["median_s"])
    assert df.loc["lenet cpu x2 steps, free-running (host dispatch)", "timer"] == "wall_nosync"


@pytest.mark.parametrize(
    "args, line",
    [
        (["+experiment=nope"], "experiment=nope: unknown experiment; allowed: " + ", ".join(registry.presets())),
        (["+experiment=matmul", "experiment.size=-5"], "experiment.size=-5: allowed: an integer >= 1"),
        (["+experiment=matmul", "experiment.sise=5"],
         "experiment.sise=5: unknown key; allowed under experiment: name, size, iterations, dtype"),
        pytest.param(["+experiment=matmul", "devices.spec=[cuda:3]"],
                     "devices.spec=[cuda:3]: this machine has no CUDA device; allowed: cpu or auto", marks=cpu_only),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(tmp_path, args, line):
    proc = run_cli(*args, cwd=tmp_path, check_rc=2)
    assert proc.stderr.strip().splitlines() == [f"perflab: error: {line}"]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert run_dirs(tmp_path) == [] and not (tmp_path / "outputs" / "results.csv").exists()


def test_misused_hydra_flags_are_one_line(tmp_path):
    proc = run_cli("-m", "+experiment=matmul", "--cfg", "job", cwd=tmp_path, check_rc=2)
    assert proc.stderr.strip().splitlines() == ["perflab: error: Only one of --run, --multirun, --cfg, --info and "
                                                "--shell_completion can be specified"]


@cpu_only
def test_missing_device_can_be_a_skipped_row(tmp_path):
    run_cli("+experiment=matmul", "devices.spec=[cuda:3]", "devices.on_missing=skip", cwd=tmp_path)
    df = load(tmp_path / "outputs")
    assert df["status"].tolist() == ["skipped"]
    assert "this machine has no CUDA device" in df.loc[0, "error"]


def test_sweep_writes_one_job_per_value_into_the_ledger(tmp_path):
    run_cli("-m", "+experiment=matmul", "experiment.size=16,32", "experiment.iterations=1", *FAST_BENCH,
            cwd=tmp_path)
    df = load(tmp_path / "outputs" / "results.csv")
    assert sorted(df["cfg.experiment.size"]) == [16, 32]
    assert df["sweep_id"].nunique() == 1 and sorted(df["job_num"]) == [0, 1]
    assert df["run_id"].nunique() == 2


def test_runs_started_together_never_share_a_dir(tmp_path):
    cmd = [sys.executable, "-m", "perflab", "+experiment=matmul", "experiment.size=8", "experiment.iterations=1",
           "bench.repeats=1", "results.table=false"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(3)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    assert len(run_dirs(tmp_path)) == 3
    assert load(tmp_path / "outputs" / "results.csv")["run_id"].nunique() == 3


def test_a_crash_inside_an_experiment_becomes_an_error_row(tmp_path, monkeypatch):
    def crash_after_one_row(ctx):
        ctx.record("first part", note="finished before the crash")
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(experiments.matmul, "run", crash_after_one_row)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["perflab", "+experiment=matmul", "results.table=false"])
    with pytest.raises(SystemExit) as exit_info:
        app.main()
    assert exit_info.value.code == 1
    df = load(tmp_path / "outputs")
    assert df["status"].tolist() == ["ok", "error"]
    assert df.loc[1, "error"] == "RuntimeError: boom"
    (run,) = run_dirs(tmp_path)
    assert "second line" in (run / "error.txt").read_text()
