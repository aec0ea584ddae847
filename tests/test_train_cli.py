"""Training end to end through the CLI: every strategy runs, learns, and matches ``single``;
a killed run resumes to the same weights; real Fashion-MNIST files load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from perflab.results import load
from perflab.train import checkpoint

from conftest import run_cli
from test_train import write_idx_fashion_mnist

SMALL = ["+experiment=train", "data.train_size=1024", "data.test_size=256", "data.noise=0.6",
         "trainer.batch_size=64", "trainer.weight_decay=1e-4", "results.table=false"]
STRATEGIES = {"single": 1, "scratch": 2, "data_parallel": 2, "ddp": 2}


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    path = load(run_dir / "results.csv")["checkpoint"].iloc[-1]
    return checkpoint.load(path)["model"]


def run_each_strategy(work, *args: str) -> dict:
    runs = {}
    for name, count in STRATEGIES.items():
        run_cli(*SMALL, *args, f"strategy={name}", f"devices.count={count}", cwd=work)
        runs[name] = max((work / "outputs" / "runs").iterdir(), key=os.path.getmtime)
    return runs


@pytest.fixture(scope="module")
def strategy_runs(tmp_path_factory):
    """Each strategy trains the same LeNet on the same data and global batch for 3 epochs."""
    return run_each_strategy(tmp_path_factory.mktemp("strategies"), "trainer.epochs=3")


@pytest.fixture(scope="module")
def few_step_runs(tmp_path_factory):
    """8 steps only: beyond ~20 steps at this lr, float rounding grows chaotically (even
    ``single`` with 1 vs 2 threads drifts apart by ~1e-3), so equality is tested early."""
    return run_each_strategy(tmp_path_factory.mktemp("few_steps"), "trainer.epochs=1", "data.train_size=512")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_trains_and_learns(strategy_runs, name):
    df = load(strategy_runs[name] / "results.csv")
    epochs, summary = df[df["measurement"] == "epoch"], df[df["measurement"] == "train"].iloc[0]
    assert epochs["epoch"].tolist() == [1, 2, 3] and (df["status"] == "ok").all()
    assert (epochs["train_s"] > 0).all() and (epochs["eval_s"] > 0).all()
    assert (epochs["items_per_s"] * epochs["train_s"]).round().eq(1024).all(), "each image once per epoch, all ranks"
    assert epochs["per_device_items_per_s"].tolist() == pytest.approx((epochs["items_per_s"] / STRATEGIES[name]).tolist())
    assert (df["global_batch"] == 64).all() and (df["per_device_batch"] == 64 // STRATEGIES[name]).all()
    assert epochs["train_loss"].iloc[-1] < epochs["train_loss"].iloc[0]
    assert summary["test_acc"] > 0.5, "well above chance (0.1) on the learnable synthetic set"
    assert summary["n"] == 2 and summary["warmup_n"] == 1  # epoch 1 is the warm-up
    assert summary["median_s"] == pytest.approx(epochs["train_s"].iloc[1:].median())
    assert summary["strategy"] == name and summary["devices"] == ("cpu" if name == "single" else "cpu#0+cpu#1")
    if name == "ddp":
        assert (df["world_size"] == 2).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["scratch", "data_parallel", "ddp"])
def test_every_strategy_ends_with_the_weights_of_single(few_step_runs, name):
    """Same seed, data and global batch, LeNet (no BatchNorm): gradient averaging and lr are right."""
    reference, other = final_weights(few_step_runs["single"]), final_weights(few_step_runs[name])
    assert reference.keys() == other.keys()
    for key in reference:
        torch.testing.assert_close(other[key], reference[key], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_weights(tmp_path):
    epochs = 10  # room to kill it part-way, however fast the machine
    args = [*SMALL, "data.train_size=2048", f"trainer.epochs={epochs}"]
    run_cli(*args, "trainer.checkpoint_dir=straight", cwd=tmp_path)
    straight = final_weights(max((tmp_path / "outputs" / "runs").iterdir(), key=os.path.getmtime))

    proc = subprocess.Popen([sys.executable, "-m", "perflab", *args, "trainer.checkpoint_dir=killed"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        ckpts = list((tmp_path / "killed").glob("*/last.pt"))
        if ckpts and checkpoint.load(ckpts[0])["epoch"] >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (ckpt,) = (tmp_path / "killed").glob("*/last.pt")
    killed_at = checkpoint.load(ckpt)["epoch"]
    assert 2 <= killed_at < epochs, "the run was killed part-way"

    run_cli(*args, "trainer.checkpoint_dir=killed", "trainer.resume=true", cwd=tmp_path)
    resumed_run = max((tmp_path / "outputs" / "runs").iterdir(), key=os.path.getmtime)
    df = load(resumed_run / "results.csv")
    assert df[df["measurement"] == "epoch"]["epoch"].tolist() == list(range(killed_at + 1, epochs + 1))
    resumed = final_weights(resumed_run)
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=0)


def test_real_fashion_mnist_files_train_through_the_cli(tmp_path):
    write_idx_fashion_mnist(tmp_path / "fm", n_train=128, n_test=64)
    run_cli("+experiment=train", "data=fashion_mnist", f"data.root={tmp_path / 'fm'}", "trainer.epochs=1",
            "trainer.batch_size=32", "data.on_device=true", cwd=tmp_path)
    df = load(tmp_path / "outputs")
    assert df["status"].eq("ok").all() and df["cfg.data.name"].eq("fashion_mnist").all()


@pytest.mark.parametrize(
    "args, line",
    [
        (["data=fashion_mnist", "data.root=/nonexistent/fm"],
         "data.root=/nonexistent/fm: no Fashion-MNIST files there; allowed: a folder with FashionMNIST/raw/*-ubyte "
         "files (torchvision's layout), data.download=true (needs internet), or data=synthetic"),
        (["strategy=scratch", "devices.count=2", "trainer.batch_size=63"],
         "trainer.batch_size=63: scaling=strong splits the global batch evenly; allowed: a multiple of the device "
         "count (2)"),
        (["strategy=single", "devices.count=2"],
         "devices.count=2: allowed: 1 for strategy=single (scratch, data_parallel or ddp for more)"),
        (["model=vgg"], "model=vgg: unknown model; allowed: lenet, resnet18, resnet18_tv"),
    ],
)
def test_training_mistakes_are_one_line(tmp_path, args, line):
    proc = run_cli("+experiment=train", *args, cwd=tmp_path, check_rc=2)
    assert proc.stderr.strip().splitlines() == [f"perflab: error: {line}"]
    assert not (tmp_path / "outputs" / "results.csv").exists()
