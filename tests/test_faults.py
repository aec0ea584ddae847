"""Faults between the rows: claim files that say nothing, a disk that is or becomes full, damaged
data and checkpoints, memory a job cannot have. Each ends in one clear line or a correct row, and
the sweep always ends."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
from types import SimpleNamespace

import pytest

from perflab.config import composition
from perflab.config.schema import config_hash, resolve_all
from perflab.job import execute as job
from perflab.measure import alone_together as parallel
from perflab.results import load
from perflab.store import point_claims
from perflab.store.rundir import RunRecord

from conftest import FAST


def point_hash(*overrides: str) -> str:
    """The point a sweep point of quick/matmul with these overrides claims: its config hash,
    the subject (the working directory's commit, none here) and process 1."""
    from perflab.measure.environment import subject
    from perflab.store.done_marks import point_key

    cfg, _, _ = composition.compose("quick/matmul", list(overrides))
    return point_key(config_hash(resolve_all(cfg)), subject(None)["subject"])


# --- claims that say nothing ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["empty", "garbage", "a directory", "a list"])
def test_a_claim_file_that_says_nothing_is_named_and_taken_over(tmp_path, kind):
    path = tmp_path / ".perflab" / "claims" / "h.json"
    path.parent.mkdir(parents=True)
    if kind == "a directory":
        path.mkdir()
        (path / "inside").write_text("x")
    else:
        path.write_text({"empty": "", "garbage": '{"host": [', "a list": "[1, 2]"}[kind])
    if kind != "a directory":  # just created: perhaps its writer is about to fill it in
        held = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
        assert isinstance(held, point_claims.Holder) and held.unreadable and str(path) in str(held)
        old = time.time() - point_claims.UNREADABLE_GRACE_S - 1
        os.utime(path, (old, old))
    got = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    assert isinstance(got, point_claims.Claim), "taken over: it never was, or will be, a claim"
    assert json.loads(path.read_text())["run_dir"] == str(tmp_path / "a")
    got.release()
    assert not path.exists() and not list(path.parent.iterdir())


def test_claim_stale_s_applies_to_a_claim_file_that_says_nothing(tmp_path):
    path = tmp_path / ".perflab" / "claims" / "h.json"
    path.parent.mkdir(parents=True)
    path.write_text("")
    assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60), point_claims.Holder)
    old = time.time() - 2
    os.utime(path, (old, old))
    assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=1), point_claims.Claim)


def test_a_sweep_waits_for_an_empty_claim_file_with_its_name_then_takes_it_over(cli, work, monkeypatch):
    claim = work / "outputs" / ".perflab" / "claims" / f"{point_hash(*FAST)}.json"
    claim.parent.mkdir(parents=True)
    claim.write_text("")  # a holder that died between creating its claim and writing it
    os.utime(claim, (time.time() + 60, time.time() + 60))  # fresh however slow the start

    def while_it_waits(seconds: float) -> None:  # the claim file stays empty: it ages
        os.utime(claim, (time.time() - 60, time.time() - 60))

    monkeypatch.setattr(job, "time", SimpleNamespace(sleep=while_it_waits))
    ran = cli("-m", "+experiment=quick/matmul", *FAST, "results.table=false")
    assert f"waiting: the claim file {claim.relative_to(work)} (empty" in ran.out
    assert "sweep: 1 jobs: 1 ok" in ran.out and not claim.exists()


# --- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MB tmpfs: a disk that really fills up (needs root to mount)."""
    where = tmp_path / "disk"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)  # lazily: a job's log file may still be open


def fill(disk) -> None:
    """Take every free byte of ``disk``."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"x")
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_full_disk_at_start_is_one_line_and_leaves_no_run(cli, work, tiny_disk):
    fill(tiny_disk)
    for sweep in ([], ["-m"]):
        ran = cli(*sweep, "+experiment=quick/matmul", *FAST, f"results.store={tiny_disk}/out", rc=2)
        assert len(ran.err.strip().splitlines()) == 1, ran.err
        assert f"results.store={tiny_disk}/out: cannot write in {tiny_disk}" in ran.err
        assert "No space left on device" in ran.err and "None" not in ran.err
        assert not [p for p in tiny_disk.rglob("*") if p.is_file() and p.name != "filler"], "no run left"


def test_a_disk_that_fills_during_a_sweep_ends_in_lines_and_records_not_tracebacks(cli, work, tiny_disk, monkeypatch):
    original = parallel.alone_then_together

    def disk_fills_meanwhile(ctx, work, **kw):
        fill(tiny_disk)
        return original(ctx, work, **kw)

    monkeypatch.setattr(parallel, "alone_then_together", disk_fills_meanwhile)
    out = tiny_disk / "out"
    ran = cli("-m", "+experiment=quick/matmul", *FAST, "experiment.size=16,32", f"results.store={out}", rc=None)
    assert ran.rc != 0 and "Traceback" not in ran.out + ran.err
    assert "sweep: 1 jobs: 1 error" in ran.out, ran.out
    assert "results.csv: No space left on device" in ran.out
    assert f"results.store={out}: cannot write in" in ran.err, "the next point could not even start"
    (record,) = [RunRecord.read(p.parent) for p in out.rglob("run.json")]
    assert record.outcome == "error" and "No space left on device" in record.error, "never left at running"
    assert not list(out.rglob(".*.tmp"))


def test_a_claim_that_cannot_be_written_leaves_no_empty_claim(tiny_disk):
    (tiny_disk / ".perflab" / "claims").mkdir(parents=True)
    fill(tiny_disk)
    with pytest.raises(OSError):
        point_claims.claim(tiny_disk, "h", tiny_disk / "a", stale_s=60)
    assert not list((tiny_disk / ".perflab" / "claims").iterdir()), "nobody waits on an empty claim"


def test_a_run_record_is_ended_in_place_when_the_disk_is_full(tiny_disk):
    record = RunRecord(run_id="r", experiment="matmul", config_hash="h")
    record.save(tiny_disk)
    fill(tiny_disk)
    record.outcome, record.error = "error", "results.csv: No space left on device"
    record.save(tiny_disk)
    assert RunRecord.read(tiny_disk).outcome == "error"


# --- errors that name the thing -------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda p: p.write_bytes(b""), "not an idx3 file of unsigned bytes (its header: empty"),
        (lambda p: p.write_bytes(b"<html>oops</html>" * 50), "train-images-idx3-ubyte: not an idx3 file"),
        (lambda p: p.write_bytes(p.read_bytes()[:-100]), "50092 bytes where its header needs 50192"),
        (lambda p: p.write_bytes(struct.pack(">IIII", 0x803, 64, 32, 32) + p.read_bytes()[16:]), "holds 64x32x32"),
        (
            lambda p: p.write_bytes(struct.pack(">IIII", 0x803, 63, 28, 28) + p.read_bytes()[16 : 16 + 63 * 784]),
            "train-images-idx3-ubyte: 63 images but 64 labels",
        ),
    ],
)
def test_a_damaged_fashion_mnist_file_is_named_before_the_job(tmp_path, damage, said):
    from test_train import write_idx_fashion_mnist

    from perflab.config.schema import DataConfig
    from perflab.errors import ConfigError
    from perflab.train import data

    write_idx_fashion_mnist(tmp_path)
    damage(tmp_path / "FashionMNIST" / "raw" / "train-images-idx3-ubyte")
    cfg = DataConfig(name="fashion_mnist", root=str(tmp_path))
    with pytest.raises(ConfigError) as err:
        data.check(cfg, batch_size=16, global_batch=16)
    line = err.value.line()
    assert line.startswith(f"data.root={tmp_path}: {tmp_path}/FashionMNIST/raw/train-images-idx3-ubyte: ")
    assert said in line
    with pytest.raises(ConfigError):  # and the loader itself, for a file damaged after the check
        data.load(cfg, seed=0)


class _RunsCode:
    """What a malicious checkpoint holds: unpickling it would run a command."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_damaged_or_refused_newest_checkpoint_falls_back_to_the_newest_valid_one(tmp_path, caplog):
    import torch

    from perflab.train import checkpoint, models

    net = models.lenet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for run, epoch in (("a", 1), ("b", 2), ("c", 3)):
        checkpoint.save(tmp_path, checkpoint.Info(run, "h", epoch, 5, False), net, opt)
    (tmp_path / "c.pt").write_bytes(b"")  # the newest: 0 bytes (a full disk, a copy that stopped)
    torch.save({"model": _RunsCode(), "optimizer": {}, "epoch": 2}, tmp_path / "b.pt")
    path, info, state = checkpoint.load_most_advanced(tmp_path)
    assert (path.name, info.epoch, state["epoch"]) == ("a.pt", 1, 1)
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == f"checkpoint {tmp_path / 'c.pt'}: damaged (empty); trying the next most advanced"
    assert said[1].startswith(f"checkpoint {tmp_path / 'b.pt'}: refused: it holds objects other than tensors")
    assert "weights_only=False" not in " ".join(said) and len(said) == 2
    (tmp_path / "a.pt").write_bytes(b"not a checkpoint")
    assert checkpoint.load_most_advanced(tmp_path) is None and "starting afresh" in caplog.records[-1].getMessage()


def test_a_job_too_big_for_memory_is_an_oom_row_predicted_before_allocating(cli, work):
    ran = cli("+experiment=quick/matmul", *FAST, "experiment.size=200000", rc=1)
    (row,) = load(work / "outputs").to_dict("records")
    assert row["status"] == "oom" and row["predicted_bytes"] == 200000**2 * 12 > row["available_bytes"] > 0
    assert row["error"].startswith("out of memory: 200000x200000 matmuls needs 480 GB on cpu, which has ")
    assert "Traceback" not in ran.out + ran.err and not list(work.rglob("error.txt"))


# --- one line with the key and what is allowed ----------------------------------------------------


@pytest.mark.parametrize(
    "override, line",
    [
        ("devices=[cuda:3]", "devices=[cuda:3]: devices is a group of keys, not one value; allowed: devices.KEY=VALUE"),
        ("bench=5", "bench=5: bench is a group of keys, not one value; allowed: bench.KEY=VALUE with KEY one of"),
        ("devices.spec=[cpu", "devices.spec=[cpu: cannot be read (no viable alternative at input '[cpu'); allowed: "),
        ("~experiment.size", "~experiment.size: a key of the schema cannot be removed; allowed: experiment.size=VALUE"),
        ("~seed", "seed=(removed by ~seed): this key cannot be removed; allowed: seed=VALUE"),
        ("seed=null", "seed=null: seed cannot be null; allowed: a value of its type"),
        ("~trainer.lr", "~trainer.lr: no such key here, and a key of the schema cannot be removed; allowed: KEY=VALUE"),
    ],
)
def test_config_mistakes_are_one_line_with_the_key_and_what_is_allowed(cli, override, line):
    ran = cli("+experiment=quick/matmul", override, rc=2)
    assert ran.err.startswith(f"perflab: error: {line}") and len(ran.err.strip().splitlines()) == 1, ran.err


@pytest.mark.parametrize("command", ["compare", "results", "report"])
def test_command_line_mistakes_of_the_tools_are_one_line_without_a_usage_block(command, capsys):
    import importlib

    main = importlib.import_module(f"perflab.{command}").main
    for argv in (["--bogus", "x"], ["-n", "0"] if command == "results" else ["--where"]):
        with pytest.raises(SystemExit) as code:
            main(argv)
        err = capsys.readouterr().err
        assert code.value.code == 2 and len(err.strip().splitlines()) == 1 and "usage:" not in err, err
        assert err.startswith(f"perflab {command}: error: ") and err.rstrip().endswith("(see --help)")


@pytest.mark.slow
def test_training_resumes_from_the_newest_valid_checkpoint_when_the_newest_is_empty(cli, work):
    args = ["+experiment=quick/train", *FAST, "data.train_size=256", "results.table=false"]
    cli(*args, "trainer.epochs=1")
    cli(*args, "trainer.epochs=2")  # a second training of the same key: its checkpoint is the newest
    (folder,) = (work / "outputs" / "checkpoints").iterdir()
    newest = max(folder.glob("*.pt"), key=lambda p: p.stat().st_mtime)
    newest.write_bytes(b"")
    ran = cli(*args, "trainer.epochs=3", "trainer.resume=true")
    assert f"checkpoint {newest}: damaged (empty); trying the next most advanced" in ran.out
    assert "resumed from" in ran.out and "after epoch 1" in ran.out
    rows = load(work / "outputs")
    resumed = rows[(rows.measurement == "epoch") & (rows["cfg.trainer.epochs"] == 3)]
    assert sorted(resumed["epoch"].tolist()) == [2, 3]
