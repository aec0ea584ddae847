"""Training end to end: every strategy learns and matches ``single``; a stopped or killed run
resumes to exactly the weights of an uninterrupted one (momentum included); precision,
layout and compile knobs change what runs; a diverging run is an error, not ``ok``."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import perflab
from perflab import models
from perflab.config import registry
from perflab.config.schema import ModelConfig
from perflab.measure.devices import Device
from perflab.results import load
from perflab.store.rundir import RunRecord
from perflab.train import checkpoint, data
from perflab.train.loop import Trainer, training_flops_per_item
from perflab.train.strategies import Knobs, Single

from conftest import FAST

SMALL = [
    "data.train_size=1024",
    "data.test_size=256",
    "data.noise=0.6",
    "trainer.batch_size=64",
    "trainer.weight_decay=1e-4",
    "results.table=false",
    *FAST,
]
STRATEGIES = {"single": 1, "scratch": 2, "data_parallel": 2, "ddp": 2}
CPU = Device("cpu", "cpu", threads=1)
FASHION = data.Spec(data.SHAPE, data.CLASSES)


def LENET() -> torch.nn.Module:  # noqa: N802 - reads as the model it builds
    return models.build(ModelConfig("perflab.models.lenet"), FASHION)


def weights(df) -> dict[str, torch.Tensor]:
    return checkpoint.load(df["checkpoint"].dropna().iloc[-1])["model"]


def assert_same(a: dict, b: dict, exact: bool = False) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0 if exact else 1e-4, atol=0 if exact else 1e-5)


# Enough steps (48) to learn well above chance, on few images (3 x 512).
LEARNS = [*SMALL, "data.train_size=512", "trainer.batch_size=32", "trainer.epochs=3"]
# 8 steps only: beyond ~20 steps at this lr, float rounding grows chaotically (even ``single``
# with 1 vs 2 threads drifts apart by ~1e-3), so equality is tested early.
FEW_STEPS = [*SMALL, "data.train_size=256", "data.test_size=64", "trainer.batch_size=32", "trainer.epochs=1"]


@pytest.fixture(scope="module")
def strategy_runs(tmp_path_factory):
    """``strategy_runs(name)``: that strategy trains the same LeNet on the same data and global
    batch for 3 epochs, once per module and only when asked (ddp's run is in the slow set)."""
    where = tmp_path_factory.mktemp("strategies")

    @functools.cache
    def run(name: str):
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(where)
            return perflab.run("train", [*LEARNS, f"strategy={name}", f"devices.count={STRATEGIES[name]}"])

    return run


# Only single learns in the fast set: the others' 48 steps are slow (ddp's workers' processes
# too); test_every_strategy_ends_with_the_weights_of_single checks each one's weights against
# single's, and test_every_strategy_counts_its_images_and_names_its_devices its rows, in the fast set.
@pytest.mark.parametrize("name", [n if n == "single" else pytest.param(n, marks=pytest.mark.slow) for n in STRATEGIES])
def test_every_strategy_trains_and_learns(strategy_runs, name):
    df = strategy_runs(name)
    epochs, summary = df[df["measurement"] == "epoch"], df[df["measurement"] == "train"].iloc[0]
    assert epochs["epoch"].tolist() == [1, 2, 3] and (df["status"] == "ok").all()
    assert (epochs["train_s"] > 0).all() and (epochs["eval_s"] > 0).all()
    assert (epochs["items_per_s"] * epochs["train_s"]).round().eq(512).all(), "each image once per epoch, all ranks"
    assert (df.dropna(subset=["global_batch"])["global_batch"] == 32).all()
    assert epochs["train_loss"].iloc[-1] < epochs["train_loss"].iloc[0]
    assert summary["test_acc"] > 0.5, "well above chance (0.1) on the learnable synthetic set"
    assert summary["n"] == 2 and summary["warmup_n"] == 1  # epoch 1 is the warm-up
    assert summary["median_s"] == pytest.approx(epochs["train_s"].iloc[1:].median())
    assert summary["devices"] == ("cpu" if name == "single" else "cpu#0+cpu#1")
    assert summary["flops_per_item"] == pytest.approx(training_flops_per_item(LENET(), FASHION))
    assert summary["tflops"] == pytest.approx(summary["flops_per_item"] * summary["items_per_s"] / 1e12)
    assert (epochs["rss_peak_mb"] > 50).all() and (
        (epochs["data_wait_frac"] >= 0) & (epochs["data_wait_frac"] < 1)
    ).all()
    loader = df[df["measurement"] == "data loader"].iloc[0]
    assert loader["items_per_s"] > 0 and loader["items_unit"] == "images"


@pytest.fixture(scope="session")  # not module: a worker that runs another module's test between
def few_step_runs(tmp_path_factory):  # two of this group's would tear a module fixture down and train again
    """Each strategy trains 8 steps (FEW_STEPS) of the same LeNet on the same data and global batch."""
    with pytest.MonkeyPatch.context() as mp:  # the worker's later tests keep their own cwd
        mp.chdir(tmp_path_factory.mktemp("few_steps"))
        return {
            name: perflab.run("train", [*FEW_STEPS, f"strategy={name}", f"devices.count={n}"])
            for name, n in STRATEGIES.items()
        }


@pytest.mark.xdist_group("few_step_runs")  # one worker trains them once
@pytest.mark.parametrize("name", ["scratch", "data_parallel", "ddp"])
def test_every_strategy_ends_with_the_weights_of_single(few_step_runs, name):
    """Same seed, data and global batch, LeNet (no BatchNorm): gradient averaging and lr are right."""
    assert_same(weights(few_step_runs["single"]), weights(few_step_runs[name]))


@pytest.mark.xdist_group("few_step_runs")  # one worker trains them once
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_counts_its_images_and_names_its_devices(few_step_runs, name):
    """The rows of each strategy's 8 steps: every image once across all ranks, the global batch,
    the devices it ran on, the FLOPs of LeNet and the host's columns."""
    df = few_step_runs[name]
    epochs, summary = df[df["measurement"] == "epoch"], df[df["measurement"] == "train"].iloc[0]
    assert epochs["epoch"].tolist() == [1] and (df["status"] == "ok").all()
    assert (epochs["train_s"] > 0).all() and (epochs["eval_s"] > 0).all()
    assert (epochs["items_per_s"] * epochs["train_s"]).round().eq(256).all(), "each image once per epoch, all ranks"
    assert (df.dropna(subset=["global_batch"])["global_batch"] == 32).all()
    assert summary["devices"] == ("cpu" if name == "single" else "cpu#0+cpu#1")
    assert summary["flops_per_item"] == pytest.approx(training_flops_per_item(LENET(), FASHION))
    assert (epochs["rss_peak_mb"] > 50).all() and (
        (epochs["data_wait_frac"] >= 0) & (epochs["data_wait_frac"] < 1)
    ).all()
    loader = df[df["measurement"] == "data loader"].iloc[0]
    assert loader["items_per_s"] > 0 and loader["items_unit"] == "images"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "ddp" else n for n in STRATEGIES])
def test_resumed_training_is_identical_to_uninterrupted_training(work, name):
    """With momentum (0.9): a run stopped after epoch 1 and resumed ends bit-identical to one
    that never stopped. (Scratch used to share one momentum buffer between its replicas.)"""
    args = [*SMALL, "data.train_size=128", "data.test_size=64", f"strategy={name}", f"devices.count={STRATEGIES[name]}"]
    straight = perflab.run("train", [*args, "trainer.epochs=2", "trainer.checkpoint_dir=straight"])
    perflab.run("train", [*args, "trainer.epochs=1", "trainer.checkpoint_dir=stopped"])
    resumed = perflab.run("train", [*args, "trainer.epochs=2", "trainer.checkpoint_dir=stopped", "trainer.resume=true"])
    assert resumed[resumed["measurement"] == "epoch"]["epoch"].tolist() == [2]
    assert_same(weights(straight), weights(resumed), exact=True)
    assert len(list((work / "stopped").glob("*/*.pt"))) == 1, "the resumed-from checkpoint was folded in"


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_a_sweep_re_run_resumes_a_point_that_was_stopped(cli, work, monkeypatch):
    from perflab.job.stop import Stopped

    real = Trainer.save_checkpoint

    def stop_after_epoch_1(self, epoch):
        real(self, epoch)
        if epoch == 1:
            raise Stopped("cancelled", "stopped by SIGTERM (a test)")

    monkeypatch.setattr(Trainer, "save_checkpoint", stop_after_epoch_1)
    ran = cli(
        "-m", "+experiment=train", *SMALL, "data.train_size=256", "trainer.epochs=2", "trainer.lr=0.1,0.05", rc=130
    )
    assert "sweep: 1 jobs: 1 cancelled" in ran.out, "a stopped command stops its sweep, and still sums it up"
    first = next((work / "outputs" / "sweeps").iterdir())
    monkeypatch.setattr(Trainer, "save_checkpoint", real)
    cli("-m", "+experiment=train", *SMALL, "data.train_size=256", "trainer.epochs=2", "trainer.lr=0.1,0.05")
    second = next(p for p in (work / "outputs" / "sweeps").iterdir() if p != first)
    rows = load(second / "sweep.csv")
    epochs = rows[rows["measurement"] == "epoch"].sort_values(["job_num", "epoch"])
    assert epochs["epoch"].tolist() == [2, 1, 2], "the stopped point went on from its checkpoint"
    train = rows[rows["measurement"] == "train"].sort_values("job_num")
    assert train["resumed_from_epoch"].tolist() == [1, 0]


@pytest.mark.slow
def test_two_nodes_of_one_ddp_run_match_single_device_training(work):
    """strategy.nnodes=2 as on two machines: two perflab processes, one worker each, meeting at
    one rendezvous (here both on localhost). The node whose worker is rank 0 records the run.
    Slow (four interpreters). In the fast set test_every_strategy_ends_with_the_weights_of_single
    [ddp] checks DDP's weights, and test_a_stopped_helper_node_writes_nothing_in_the_job_dir_it_shares
    an nnodes=2 node at its rendezvous leaving no row or record; the cluster set runs two nodes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [
        "+experiment=train",
        *FEW_STEPS,
        "strategy=ddp",
        "devices.spec=cpu",
        "devices.count=1",
        "strategy.nnodes=2",
        f"strategy.rdzv_endpoint=localhost:{port}",
        "strategy.rdzv_id=two-nodes",
        "bench.min_time_s=0",
    ]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "perflab", *args],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [n.communicate(timeout=300)[0] for n in nodes]
    assert all(n.returncode == 0 for n in nodes), outs
    (run,) = (work / "outputs" / "runs").iterdir()  # one node recorded it; the other left nothing
    two = load(run)
    assert (two["status"] == "ok").all() and two[two["measurement"] == "train"]["world_size"].tolist() == [2]
    single = perflab.run("train", FEW_STEPS)
    assert_same(weights(single), weights(two))


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_a_stopped_helper_node_writes_nothing_in_the_job_dir_it_shares(work):
    """The second task of a two-node SLURM job (SLURM_PROCID=1) shares its job dir with the
    first, which records the point: stopped while it waits for the rendezvous, the helper
    leaves no row, record or traceback there (they would stand beside rank 0's rows)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [*SMALL, "strategy=ddp", "devices.spec=cpu", "devices.count=1", "strategy.nnodes=2"]
    helper = subprocess.Popen(
        [sys.executable, "-m", "perflab", "+experiment=train", *args, f"strategy.rdzv_endpoint=localhost:{port}"],
        cwd=work,
        env={**os.environ, "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not list(work.glob("outputs/runs/*/workers")):
        time.sleep(0.2)  # until it waits at the rendezvous
    assert list(work.glob("outputs/runs/*/workers")), "the helper never reached its rendezvous"
    helper.send_signal(signal.SIGTERM)
    out = helper.communicate(timeout=120)[0]
    assert helper.returncode == 130, out
    assert "helper node" in out and "cancelled" in out
    (job_dir,) = (work / "outputs" / "runs").iterdir()
    assert not {p.name for p in job_dir.iterdir()} & {"results.csv", "run.json", "error.txt"}


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_weights(work):
    epochs = 10  # room to kill it part-way, however fast the machine
    args = ["+experiment=train", *SMALL, "data.train_size=2048", f"trainer.epochs={epochs}"]
    straight = perflab.run("train", [*args[1:], "trainer.checkpoint_dir=straight"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "perflab", *args, "trainer.checkpoint_dir=killed"],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        infos = checkpoint.infos(next(iter((work / "killed").glob("*")), work / "none"))
        if infos and infos[0][1].epoch >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ((_, info),) = checkpoint.infos(next((work / "killed").glob("*")))
    assert 2 <= info.epoch < epochs, "the run was killed part-way"
    resumed = perflab.run("train", [*args[1:], "trainer.checkpoint_dir=killed", "trainer.resume=true"])
    assert resumed[resumed["measurement"] == "epoch"]["epoch"].tolist() == list(range(info.epoch + 1, epochs + 1))
    assert_same(weights(straight), weights(resumed), exact=True)


def test_a_diverging_run_is_an_error_row_not_ok(work):
    diverges = ["trainer.lr=1e30", "trainer.momentum=0"]
    df = perflab.run("train", [*SMALL, "data.train_size=256", "trainer.epochs=3", *diverges])
    assert df.attrs["outcome"] == "error"
    epoch = df[df["measurement"] == "epoch"].iloc[0]
    assert epoch["status"] == "error" and epoch["error"].startswith("diverged at step 2: ")  # the first update
    assert epoch["items_per_s"] > 0 and epoch["error"].endswith("; try trainer.lr=1e+29"), "its throughput stands"
    assert "train" not in set(df["measurement"]), "no summary of a broken run"
    assert not RunRecord.read(Path(df.attrs["run_dir"])).complete


def test_training_flops_match_a_hand_count_of_lenet():
    """Conv and linear multiply-adds x 2, per image: the book's LeNet variant at 28x28."""
    forward = 2 * (20 * 26 * 26 * 1 * 3 * 3 + 50 * 9 * 9 * 20 * 5 * 5 + 800 * 128 + 128 * 10)
    from perflab.measure import flops

    meta = LENET().to("meta")
    counted = flops.count(lambda: meta(torch.empty(1, 1, 28, 28, device="meta")))
    assert counted == pytest.approx(forward, rel=0.01)
    # backward = 2x forward (input and weight gradients), except the first layer's input gradient
    # (the images need none): forward + backward = 3 x forward - conv1's forward
    assert training_flops_per_item(LENET(), FASHION) == pytest.approx(3 * forward - 243_360, rel=0.01)


@pytest.mark.parametrize(
    "precision, dtype", [("fp32", torch.float32), ("bf16-mixed", torch.bfloat16), ("fp16-mixed", torch.float16)]
)
def test_precision_changes_what_runs_inside_the_model(precision, dtype):
    torch.manual_seed(0)
    net = LENET()
    seen = {}
    net[0].register_forward_hook(lambda m, i, o: seen.update(out=o.dtype))
    s = Single(net, [CPU], lambda p: torch.optim.SGD(p, lr=0.01), Knobs(precision=precision))
    s.step(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,)))
    assert seen["out"] == dtype
    assert s.scaler.is_enabled() == (precision == "fp16-mixed")


def test_channels_last_changes_the_memory_format_of_inputs_and_weights():
    net = LENET()
    seen = {}
    net[0].register_forward_pre_hook(
        lambda m, i: seen.update(nhwc=i[0].is_contiguous(memory_format=torch.channels_last))
    )
    s = Single(net, [CPU], lambda p: torch.optim.SGD(p, lr=0.01), Knobs(channels_last=True))
    s.step(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,)))
    assert seen["nhwc"] and s.bare[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_tf32_on_a_cpu_and_compile_with_data_parallel_are_refused(work, caplog):
    from perflab.errors import Refused

    caplog.set_level("INFO", logger="perflab")

    with pytest.raises(Refused, match=r"trainer.precision=tf32: TF32 is a mode of NVIDIA tensor cores"):
        perflab.run("quick/train", ["trainer.precision=tf32", "devices.spec=cpu"])
    with pytest.raises(Refused, match=r"experiment.precision=tf32: TF32 is a mode of NVIDIA tensor cores"):
        perflab.run("compile", ["experiment.precision=tf32", "devices.spec=cpu"])
    with pytest.raises(Refused, match=r"trainer.compile=True: nn.DataParallel replicates"):
        perflab.run("quick/train", ["trainer.compile=true", "strategy=data_parallel"])
    # Refused before it started (no "perflab train on cpu -> DIR" line, no run.json saying
    # "running"): no run folder is left looking like a job still running.
    assert not [r for r in caplog.records if r.getMessage().startswith("perflab ")]
    assert not list(work.glob("outputs/runs/*")) and not perflab.results.runs(work / "outputs")


def test_compile_in_training_has_its_own_row(work):
    df = perflab.run(
        "train",
        [*SMALL, "data.train_size=256", "trainer.epochs=2", "trainer.compile=true", "trainer.compile_backend=eager"],
    )
    row = df[df["measurement"] == "compile"].iloc[0]
    assert row["first_step_s"] > 0 and row["graphs"] >= 1 and row["recompiles"] == 0
    assert (df[df["measurement"] == "train"]["compiled"] == True).all()  # noqa: E712


@pytest.mark.slow
def test_a_sweep_over_precision_compile_and_layout_runs_end_to_end(cli, work):
    cli(
        "-m",
        "+experiment=train",
        *SMALL,
        "trainer.epochs=2",
        "trainer.compile_backend=eager",
        "trainer.precision=fp32,bf16-mixed",
        "trainer.compile=false,true",
        "model.channels_last=false,true",
    )
    rows = load(next((work / "outputs" / "sweeps").iterdir()) / "sweep.csv")
    train = rows[rows["measurement"] == "train"]
    assert len(train) == 8 and (rows["status"] == "ok").all()
    assert set(zip(train["precision"], train["compiled"], train["channels_last"])) == {
        (p, c, layout) for p in ("fp32", "bf16-mixed") for c in (False, True) for layout in (False, True)
    }
    assert (train["test_acc"] > 0.1).all(), "accuracy stays beside speed"
    assert len(rows[rows["measurement"] == "compile"]) == 4


@pytest.mark.slow
def test_a_killed_ddp_job_leaves_no_workers_behind(work):
    """kill -9 once both workers train (rank 0's first checkpoint: both are past the point where
    they ask to die with the job; one still starting would only exit when it got there). A job
    that ends before then fails at once with its own output, not after the whole wait. Two
    threads for torch whatever the caller's OMP_NUM_THREADS: with 1, two CPU workers are refused."""
    import psutil

    log = work / "job.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "perflab",
                "+experiment=train",
                *SMALL,
                "strategy=ddp",
                "devices.count=2",
                "trainer.epochs=50",
                "trainer.checkpoint_every=1",
                f"trainer.checkpoint_dir={work / 'ck'}",
            ],
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "2"},
        )
    job = psutil.Process(proc.pid)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not any((work / "ck").rglob("*.pt")):
        time.sleep(0.2)
    if proc.poll() is not None:
        pytest.fail(f"the job ended (rc {proc.returncode}) before its workers trained:\n{log.read_text()[-3000:]}")
    workers = job.children(recursive=True)
    assert len(workers) >= 2, f"the workers started: {workers}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive, f"orphans: {[(p.pid, p.cmdline()[-2:]) for p in alive]}"


def test_batches_come_from_the_real_loader_with_workers(work):
    import gc

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    # The loaders' worker processes end with the training (Trainer.fit closes its Batches), not at
    # some later cyclic GC, whose shutdown of them would stall a caller of perflab.run() 5 s per
    # loader. No cyclic GC during the run, so a loader left alive is seen (and then shut down).
    gc.disable()
    try:
        df = perflab.run("train", [*SMALL, "data.train_size=256", "trainer.epochs=1", "data.workers=1"])
        alive = [it for it in gc.get_objects() if type(it) is _MultiProcessingDataLoaderIter and it._workers]
        for it in alive:
            it._shutdown_workers()
    finally:
        gc.enable()
    assert (df["status"] == "ok").all() and (df["cfg.data.workers"] == 1).all()
    assert not alive, f"{len(alive)} DataLoader(s) kept their worker processes after perflab.run() returned"


def test_quick_presets_of_the_books_training_keep_the_books_settings(compose_cfg):
    cfg = compose_cfg("+experiment=quick/lenet_scratch")
    assert (cfg.trainer.lr, cfg.model.init, cfg.trainer.epochs) == (0.2, "book_normal", 2)
    assert registry.get("train").metric == "items_per_s"
