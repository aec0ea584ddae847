"""Sweeps that survive failures and resume, and the comparison with speedup and significance."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import experiments.matmul
from perflab import app, compare, sweep
from perflab.devices import Device, Resolved
from perflab.errors import ConfigError
from perflab.results import ResultsWriter, load
from perflab.stats import compare_samples, mann_whitney_p

from conftest import FAST_BENCH, run_cli


def fake_run(root, name, count, batch, items_per_s, samples=(), test_acc=0.9):
    """A results dir as a training job writes it, with numbers chosen by hand."""
    w = ResultsWriter(root / name, None)
    w.add({"run_id": name, "experiment": "train", "measurement": "train", "status": "ok", "n": len(samples),
           "median_s": float(np.median(samples)) if len(samples) else 1.0, "noisy": False,
           "items_per_s": items_per_s, "test_acc": test_acc, "cfg.devices.count": count,
           "cfg.trainer.batch_size": batch, "cfg.trainer.scaling": "strong"}, samples=list(samples))


def test_speedup_and_efficiency_match_a_hand_computed_table(tmp_path):
    for count, thr in ((1, 100.0), (2, 180.0), (4, 300.0)):
        fake_run(tmp_path, f"b256-n{count}", count, 256, thr)
        fake_run(tmp_path, f"b512-n{count}", count, 512, thr * 1.5)
    table = compare.compare(tmp_path, by=["devices.count", "trainer.batch_size"])
    table = table.set_index(["cfg.trainer.batch_size", "cfg.devices.count"]).sort_index()
    expected = pd.DataFrame({
        "speedup": [1.0, 1.8, 3.0, 1.0, 1.8, 3.0],
        "efficiency": [1.0, 0.9, 0.75, 1.0, 0.9, 0.75],
        "per_device_items_per_s": [100, 90, 75, 150, 135, 112.5],
    }, index=pd.MultiIndex.from_product([[256, 512], [1, 2, 4]], names=table.index.names))
    pd.testing.assert_frame_equal(table[expected.columns], expected, check_dtype=False)
    assert (table["test_acc"] == 0.9).all() and (table["scaling"] == "strong").all()


def test_identical_configs_show_no_significant_difference(tmp_path):
    rng = np.random.default_rng(0)
    fake_run(tmp_path, "a", 1, 256, 100.0, samples=rng.normal(1.0, 0.05, 10))
    fake_run(tmp_path, "b", 2, 256, 100.0, samples=rng.normal(1.0, 0.05, 10))
    table = compare.compare(tmp_path, by=["devices.count"], baseline="devices.count=1").set_index("cfg.devices.count")
    assert table.loc[1, "significance"] == "baseline"
    assert table.loc[2, "significance"].startswith("no significant difference")


def test_a_real_2x_difference_is_significant(tmp_path):
    rng = np.random.default_rng(0)
    fake_run(tmp_path, "a", 1, 256, 100.0, samples=rng.normal(1.0, 0.05, 10))
    fake_run(tmp_path, "b", 2, 256, 200.0, samples=rng.normal(0.5, 0.025, 10))
    table = compare.compare(tmp_path, by=["devices.count"], baseline="devices.count=1").set_index("cfg.devices.count")
    assert table.loc[2, "significance"].startswith("significant: 2.06x faster than the baseline (p=1.1e-05")
    assert table.loc[2, "speedup_vs_baseline"] == pytest.approx(2.0)


def test_mann_whitney_matches_known_exact_values():
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)  # 2 of C(6,3) = 20 orderings
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert mann_whitney_p([1, 3, 5], [2, 4, 6]) == pytest.approx(0.7)
    assert compare_samples([1, 2], [3, 4]).words.startswith("too few samples")


def test_compare_cli_errors_are_one_line(tmp_path, capsys):
    fake_run(tmp_path, "a", 1, 256, 100.0)
    assert compare.main([str(tmp_path), "--by", "nope.key"]) == 2
    assert capsys.readouterr().err.strip() == "perflab.compare: error: --by cfg.nope.key: not in the results"


def test_a_job_that_raises_mid_sweep_leaves_an_error_row(tmp_path, monkeypatch):
    real_run = experiments.matmul.run

    def crash_on_32(ctx):
        if ctx.params.size == 32:
            raise RuntimeError("boom")
        real_run(ctx)

    monkeypatch.setattr(experiments.matmul, "run", crash_on_32)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["perflab", "-m", "+experiment=matmul", "experiment.size=16,32,48",
                                      "experiment.iterations=1", "bench.repeats=2", "results.table=false"])
    with pytest.raises(SystemExit) as exit_info:
        app.main()
    assert exit_info.value.code == 0, "the sweep goes on and ends 0 when any point ran"
    (sweep_dir,) = (tmp_path / "outputs" / "sweeps").iterdir()
    rows = load(sweep_dir / sweep.SWEEP_CSV).sort_values("job_num")
    assert rows["status"].tolist() == ["ok", "error", "ok"]
    assert rows["error"].iloc[1] == "RuntimeError: boom"
    assert sweep.last_tally == {"ok": 2, "error": 1}


@pytest.mark.slow
def test_cpu_sweep_skips_what_it_cannot_run_and_resumes(tmp_path):
    too_many = torch.get_num_threads() + 1  # more CPU workers than cores: a point this machine cannot run
    args = ["-m", "+experiment=train", "strategy=ddp", f"devices.count=1,2,{too_many}", "trainer.batch_size=64,128",
            "data.train_size=512", "data.test_size=128", "trainer.epochs=3", "results.table=false"]
    first = run_cli(*args, cwd=tmp_path)
    assert "sweep: 6 jobs: 4 ok, 2 skipped" in first.stdout
    (sweep_dir,) = (tmp_path / "outputs" / "sweeps").iterdir()
    rows = load(sweep_dir / sweep.SWEEP_CSV)
    train = rows[rows["measurement"] == "train"]
    assert sorted(zip(train["cfg.devices.count"], train["cfg.trainer.batch_size"])) == [(1, 64), (1, 128), (2, 64),
                                                                                        (2, 128)]
    skipped = rows[rows["status"] == "skipped"]
    assert len(skipped) == 2
    assert skipped["error"].str.contains(f"at most {too_many - 1} CPU workers").all()
    assert (train["lr"] == 0.1).all()  # lr_rule=none: the rule's lr at every point
    ledger_rows = len(load(tmp_path / "outputs" / "results.csv"))

    again = run_cli(*args, cwd=tmp_path)
    assert "sweep: 6 jobs: 6 done" in again.stdout
    assert len(load(tmp_path / "outputs" / "results.csv")) == ledger_rows, "re-running runs nothing new"

    out = compare.main([str(sweep_dir), "--baseline", "devices.count=1", "--plot", str(tmp_path / "plots"),
                        "--format", "csv"])
    assert out == 0
    assert (tmp_path / "plots" / "scaling.png").stat().st_size > 0
    assert (tmp_path / "plots" / "batch_size.png").stat().st_size > 0
    table = compare.compare(sweep_dir, baseline="devices.count=1")
    assert set(table["cfg.devices.count"]) == {1, 2}
    two = table[table["cfg.devices.count"] == 2]
    assert np.allclose(two["efficiency"], two["speedup"] / 2)


def test_a_bad_point_in_a_sweep_is_an_error_row_and_the_sweep_goes_on(tmp_path):
    proc = run_cli("-m", "+experiment=matmul", "experiment.size=16,-1", "experiment.iterations=1", *FAST_BENCH,
                   "results.table=false", cwd=tmp_path)
    assert "perflab: error: experiment.size=-1: allowed: an integer >= 1" in proc.stderr
    assert "sweep: 2 jobs: 1 ok, 1 refused" in proc.stdout
    rows = load(tmp_path / "outputs" / "results.csv").sort_values("job_num")
    assert rows["status"].tolist() == ["ok", "error"]


def test_parallel_launcher_labels_rows_and_never_shares_a_gpu(tmp_path):
    run_cli("-m", "+launcher=parallel", "+experiment=matmul", "experiment.size=16,32", "experiment.iterations=1",
            *FAST_BENCH, "results.table=false", cwd=tmp_path)
    rows = load(tmp_path / "outputs" / "results.csv")
    assert len(rows) == 2 and rows["beside"].str.contains("2 jobs at once").all()
    hc = SimpleNamespace(launcher={"_target_": "hydra_plugins.hydra_joblib_launcher.JoblibLauncher", "n_jobs": 2})
    with pytest.raises(ConfigError, match="parallel local jobs would share the GPUs"):
        app._parallel_jobs(hc, Resolved([Device("cuda:0", "cuda", 0)]))


def test_slurm_preset_asks_for_the_sweep_points_gpus(compose_cfg):
    cfg = compose_cfg("+launcher=slurm", "+experiment=train", "devices.count=4", hydra_node=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.gpus_per_node == 4 and cfg.hydra.launcher.nodes == 1
