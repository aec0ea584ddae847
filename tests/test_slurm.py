"""Cluster sweeps on a real SLURM (tools/cluster/up.sh brings up a one-node cluster; .ci/run
does): each point asks for its own resources, failures are rows and the sweep always ends,
stop means stop, mistakes are one line. Skipped where there is no SLURM to talk to."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

import perflab
from perflab.cluster import slurm
from perflab.job.sweep import SWEEP_CSV, job_dirs
from perflab.results import load
from perflab.store.rundir import RunRecord
from perflab.train import checkpoint

from conftest import FAST


def _cluster_up() -> bool:
    if not shutil.which("sbatch"):
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not _cluster_up(), reason="needs a SLURM cluster (sbatch, sinfo)"),
]
SWEEP_TIMEOUT = 240  # every sweep: no test may hang on a queue
TRAIN = [
    "+experiment=quick/train",
    "devices.spec=cpu",
    "devices.count=1",
    "data.train_size=4096",
    "results.table=false",
]


@pytest.fixture(autouse=True)
def empty_queue():
    """Each test starts with no job of an earlier one still in the queue."""
    for _ in range(120):
        if not subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip():
            return
        time.sleep(0.5)
    pytest.fail("jobs of an earlier test are still queued")


def sweep(work, *args, rc: int | None = 0, timeout: float = SWEEP_TIMEOUT) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "perflab", "-m", "+launcher=slurm", *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if rc is not None:
        assert proc.returncode == rc, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def running() -> list[str]:
    return subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i"], capture_output=True, text=True).stdout.split()


def newest_sweep(work):
    return max((work / "outputs" / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime_ns)


def alloc(job_id: str) -> str:
    return subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "AllocTRES"], capture_output=True, text=True
    ).stdout.strip()


def nodes_of(partition: str) -> list[str]:
    """The partition's nodes that can take a job now (not down or drained)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-p", partition, "-t", "idle,mix,alloc", "-o", "%N"], capture_output=True, text=True
    ).stdout
    return sorted(set(out.split()))


def largest_node_cpus() -> int:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True).stdout.split()
    return max(int(c.rstrip("+")) for c in out)


def test_each_point_asks_for_its_own_cpus_and_rows_say_where_they_ran(work):
    sweep(work, "+experiment=quick/matmul", "bench.min_time_s=0", "devices.spec=cpu", "devices.count=1,2")
    rows = load(newest_sweep(work) / SWEEP_CSV)
    assert rows["status"].eq("ok").all() and rows["slurm_node"].notna().all()
    for count, job in zip(rows["cfg.devices.count"], rows["slurm_job_id"]):
        assert f"cpu={count}," in alloc(str(job)), alloc(str(job))
    assert rows["log"].str.endswith("_log.err").all()


def test_gpu_points_ask_for_their_gpus(work):
    gres = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True).stdout
    if "gpu" not in gres:
        pytest.skip("the partition advertises no GPUs (tools/cluster/up.sh with FAKE_GPUS=2 does)")
    sweep(work, "+experiment=quick/matmul", "bench.min_time_s=0", "devices.count=1,2")  # spec auto: GPUs there
    for job in job_dirs(newest_sweep(work)):
        record = RunRecord.read(job)
        count = int(job.name) + 1
        assert f"gres/gpu={count}" in alloc(record.where["slurm_job_id"])


def test_a_point_no_node_can_hold_is_a_skipped_row_not_a_job_pending_forever(work):
    too_many = largest_node_cpus() + 1
    proc = sweep(
        work, "+experiment=quick/matmul", "bench.min_time_s=0", "devices.spec=cpu", f"devices.count=1,{too_many}"
    )
    assert "sweep: 2 jobs: 1 ok, 1 skipped" in proc.stdout
    skipped = RunRecord.read(job_dirs(newest_sweep(work))[1])
    assert skipped.outcome == "skipped" and "the partition's largest node has" in skipped.error
    multi = sweep(
        work, "+experiment=quick/train", "strategy=ddp", "devices.spec=cpu", "devices.count=1", "strategy.nnodes=2"
    )
    assert "1 skipped" in multi.stdout and "per node" in multi.stdout + multi.stderr


def test_sbatch_refusing_a_partition_is_one_line(work):
    proc = sweep(work, "hydra.launcher.partition=nope", "+experiment=quick/matmul", rc=2)
    assert proc.stderr.strip().splitlines() == [
        "perflab: error: hydra.launcher.partition=nope: sbatch: Batch job submission failed: Invalid partition "
        "name specified; allowed: a partition `sinfo` lists"
    ]


def test_a_killed_for_memory_point_is_an_oom_row_naming_its_log(work):
    proc = sweep(
        work,
        "hydra.launcher.mem_gb_per_worker=1",
        "+experiment=quick/hardware",
        "experiment.copy_mb=1500",
        "devices.spec=cpu",
        rc=1,
    )
    rows = load(newest_sweep(work) / SWEEP_CSV)
    (row,) = rows.to_dict("records")
    assert row["status"] == "oom" and "killed by SLURM for using more memory" in row["error"]
    assert os.path.isfile(row["log"]) and "log:" in proc.stderr
    assert "sweep: 1 jobs: 1 oom" in proc.stdout


def test_a_time_limit_stops_the_point_at_once_with_a_timeout_row(work):
    proc = sweep(work, "hydra.launcher.timeout_min=1", *TRAIN, "trainer.epochs=500", rc=1)
    rows = load(newest_sweep(work) / SWEEP_CSV)
    last = rows.iloc[-1]
    assert last["status"] == "timeout" and "SIGUSR2" in last["error"]
    assert "train" not in set(rows["measurement"]), "no summary of a run that was stopped"
    assert "sweep: 1 jobs: 1 timeout" in proc.stdout


def test_scancel_stops_the_point_and_the_next_identical_sweep_resumes_it(work):
    args = [*TRAIN, "trainer.epochs=8"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "perflab", "-m", "+launcher=slurm", *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + SWEEP_TIMEOUT
    checkpoints = work / "outputs" / "checkpoints"
    while time.time() < deadline and not list(checkpoints.glob("*/*.json")):
        time.sleep(0.5)  # until epoch 1 is saved
    job_id = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True).stdout.split()[0]
    cancelled_at = time.time()
    subprocess.run(["scancel", job_id], check=True)
    out, err = proc.communicate(timeout=SWEEP_TIMEOUT)
    assert proc.returncode == 1, out + err
    first = newest_sweep(work)
    rows = load(first / SWEEP_CSV)
    assert rows.iloc[-1]["status"] == "cancelled" and "SIGTERM" in rows.iloc[-1]["error"]
    epochs = rows[rows["measurement"] == "epoch"]
    assert (epochs["timestamp"].astype("int64") / 1e9 <= cancelled_at + 2).all(), "no ok rows after the cancel"
    assert "sweep: 1 jobs: 1 cancelled" in out

    sweep(work, *args)
    again = load(newest_sweep(work) / SWEEP_CSV)
    train = again[again["measurement"] == "train"].iloc[0]
    assert train["resumed_from_epoch"] >= 1 and again[again["measurement"] == "epoch"]["epoch"].min() > 1


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_or_kill_cancels_every_job_of_the_sweep_and_says_so(work, stop):
    proc = subprocess.Popen(
        [sys.executable, "-m", "perflab", "-m", "+launcher=slurm", *TRAIN, "trainer.epochs=500", "trainer.lr=0.1,0.05"],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + SWEEP_TIMEOUT
    while time.time() < deadline and len(running()) < 2:
        time.sleep(0.5)  # until both points run
    proc.send_signal(stop)
    out, err = proc.communicate(timeout=SWEEP_TIMEOUT)
    assert proc.returncode == 130, out + err
    assert "cancelled the 2 SLURM job(s) of this sweep" in err
    for _ in range(60):
        if not subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip():
            break
        time.sleep(0.5)
    assert not subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip(), "jobs left behind"
    assert "sweep: 2 jobs" in out and (newest_sweep(work) / SWEEP_CSV).is_file()


def test_a_two_node_point_spans_two_hosts_and_trains_like_one_device(work):
    """strategy.nnodes=2 through SLURM: one job of two nodes (hosts with their own names and
    addresses), one task each; the tasks meet at a rendezvous on the allocation's first node;
    rank 0's node writes the rows. Same data, same global batch: the weights of one device."""
    if len(nodes_of("multi")) < 2:
        pytest.skip("needs the two-node `multi` partition (tools/cluster/up.sh makes it where namespaces can be made)")
    small = [
        "+experiment=train",
        "data.train_size=512",
        "data.test_size=256",
        "trainer.batch_size=64",
        "trainer.epochs=1",
        "devices.spec=cpu",
        "devices.count=1",
        "results.table=false",
        *FAST,
    ]
    proc = sweep(work, "hydra.launcher.partition=multi", *small, "strategy=ddp", "strategy.nnodes=2")
    assert "asking for 2 nodes x 1 CPU" in proc.stdout + proc.stderr
    rows = load(newest_sweep(work) / SWEEP_CSV)
    assert rows["status"].eq("ok").all(), rows[["measurement", "status", "error"]]
    train = rows[rows["measurement"] == "train"].iloc[0]
    assert train["world_size"] == 2 and train["hostname"] == "n1" and train["slurm_nodes"] == "n[1-2]"
    assert "node=2" in alloc(str(train["slurm_job_id"]))
    single = perflab.run("train", small[1:])
    two = checkpoint.load(rows["checkpoint"].dropna().iloc[-1])["model"]
    for key, value in checkpoint.load(single["checkpoint"].dropna().iloc[-1])["model"].items():
        torch.testing.assert_close(two[key], value, rtol=1e-4, atol=1e-5)


def start_sweep(work, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "perflab", "-m", "+launcher=slurm", *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def until_the_first_checkpoint(work) -> str:
    """Wait until the sweep's one job has saved epoch 1; returns its SLURM job id."""
    deadline = time.time() + SWEEP_TIMEOUT
    while time.time() < deadline and not list((work / "outputs" / "checkpoints").glob("*/*.json")):
        time.sleep(0.5)
    queued = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True).stdout.split()
    assert queued, "the job ended before it could be stopped: give it more epochs"
    return queued[0]


def preempt(job_id: str) -> None:
    """A job in the higher-priority partition that needs the whole node."""
    subprocess.run(["sbatch", "-p", "urgent", "-c", str(largest_node_cpus()), "--wrap", "sleep 1"], check=True)


def fail_node(job_id: str) -> str:
    """The job's node goes down (as SLURM sees a node that died); it comes back by itself
    when its slurmd registers again (ReturnToService=2)."""
    node = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=perflab-test"], check=True)
    return node


@pytest.fixture
def nodes_come_back():
    """After a test that downs a node: it is resumed, whatever the test's end (a node that
    registered again already is not down: SLURM refuses the resume, which is fine)."""
    yield
    for node in subprocess.run(
        ["sinfo", "-h", "-N", "-t", "down", "-o", "%N"], capture_output=True, text=True
    ).stdout.split():
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)


@pytest.mark.parametrize("cause, state", [(preempt, "PREEMPTED"), (fail_node, "NODE_FAIL")], ids=["preempted", "node"])
def test_a_requeued_point_runs_again_from_its_checkpoint_and_the_sweep_waits_for_it(
    work, cause, state, nodes_come_back
):
    """SLURM requeues a batch job it preempted or whose node failed: the job runs again later,
    though its first run already left a result. The sweep waits for the second run, which
    resumes from the first run's checkpoint in the same job dir and sets the first run's files
    aside; the point ends ok, its rows the second run's."""
    if cause is preempt and not nodes_of("urgent"):
        pytest.skip("needs the `urgent` partition that preempts `debug` (tools/cluster/up.sh makes it)")
    epochs = 20
    proc = start_sweep(work, *TRAIN, f"trainer.epochs={epochs}")
    job_id = until_the_first_checkpoint(work)
    cause(job_id)
    out, err = proc.communicate(timeout=SWEEP_TIMEOUT)
    assert proc.returncode == 0, out + err
    assert [run[0] for run in slurm.histories([job_id])[job_id]] == [state, "COMPLETED"]
    assert "SLURM requeued it" in err and "sweep: 1 jobs: 1 ok" in out
    rows = load(newest_sweep(work) / SWEEP_CSV)
    assert rows["run_id"].nunique() == 1 and rows["status"].eq("ok").all(), rows[["measurement", "status", "error"]]
    train = rows[rows["measurement"] == "train"].iloc[0]
    assert train["resumed_from_epoch"] >= 1 and rows[rows["measurement"] == "epoch"]["epoch"].min() > 1
    job_dir = job_dirs(newest_sweep(work))[0]
    (earlier,) = (job_dir / ".requeued").iterdir()
    first_run = load(earlier / "results.csv")
    assert first_run["run_id"].ne(train["run_id"]).all() and earlier.name == first_run["run_id"].iloc[0]
    stopped = first_run.iloc[-1]
    assert stopped["status"] == "cancelled" and "SIGTERM" in stopped["error"]
    epochs_run = pd.concat([first_run, rows])
    assert set(epochs_run[epochs_run["measurement"] == "epoch"]["epoch"]) == set(range(1, epochs + 1))
    record = RunRecord.read(job_dir)
    assert record.outcome == "ok" and record.complete and record.error == "" and record.rows == len(rows)


@pytest.mark.parametrize(
    "cause, status, words",
    [(preempt, "cancelled", "preempted by a higher-priority job"), (fail_node, "error", "its node failed")],
    ids=["preempted", "node"],
)
def test_a_point_slurm_ends_without_requeue_is_a_row_saying_why(work, cause, status, words, nodes_come_back):
    """With sbatch --no-requeue a preemption or a node failure ends the job: the job wrote
    `cancelled` on the SIGTERM it got, but SLURM knows why, and the point says so."""
    if cause is preempt and not nodes_of("urgent"):
        pytest.skip("needs the `urgent` partition that preempts `debug` (tools/cluster/up.sh makes it)")
    proc = start_sweep(work, *TRAIN, "trainer.epochs=20", "+hydra.launcher.additional_parameters.no_requeue=true")
    cause(until_the_first_checkpoint(work))
    out, err = proc.communicate(timeout=SWEEP_TIMEOUT)
    assert proc.returncode == 1, out + err
    rows = load(newest_sweep(work) / SWEEP_CSV)
    last = rows.iloc[-1]
    assert last["status"] == status and words in last["error"] and os.path.isfile(last["log"])
    assert f"{words} -- log:" in err and f"sweep: 1 jobs: 1 {status}" in out
    record = RunRecord.read(job_dirs(newest_sweep(work))[0])
    assert record.outcome == status and not record.complete
