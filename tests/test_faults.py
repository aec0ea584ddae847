"""Faults between the rows: claim files that say nothing, a disk that is or becomes full, damaged
data and checkpoints, memory a job cannot have. Each ends in one clear line or a correct row, and
the sweep always ends."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from perflab.config import composition
from perflab.config.schema import config_hash, resolve_all
from perflab.job import execute as job
from perflab.measure import alone_together as parallel
from perflab.results import load
from perflab.store import point_claims
from perflab.store.rundir import RunRecord

from conftest import FAST, cpu_only


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
    assert isinstance(got, point_claims.HeldClaim), "taken over: it never was, or will be, a claim"
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
    assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=1), point_claims.HeldClaim)


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


# --- the hostile table: one line, exit 2, nothing changed --------------------------------------
#
# Each case: how to set up the scratch folder, the command line, the exit code, and a phrase the
# one line on stderr must hold. Every case also checks that nothing in the folder changed (each
# file's kind and bytes, hashed before and after) and that no results were written. Add a case
# by adding a row; a case that would hang fails after HANG_S instead (SIGALRM).

HANG_S = 120


def make(path, kind: str) -> None:
    """Something that is not a regular file, at ``path``: what no reader may block on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        import socket

        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))  # the file stays after the socket is closed: nobody listens
        server.close()
    elif kind == "device":
        path.symlink_to("/dev/zero")  # a reader would never reach its end
    elif kind == "loop":
        path.symlink_to(path.name)


SAID = {
    "fifo": "a FIFO",
    "socket": "a socket",
    "device": "a character device",
    "loop": "unreachable (Too many levels of symbolic links)",
}
KINDS = list(SAID)
MATMUL = ["+experiment=quick/matmul", *FAST, "results.table=false"]
TRAIN = ["+experiment=quick/train", *FAST, "data=fashion_mnist", "results.table=false"]


def _input_cases():
    """Every place perflab reads a file or folder from, with each kind of thing that is not one."""
    for kind in KINDS:
        yield pytest.param(
            lambda w, k=kind: make(w / "peaks.json", k),
            [*MATMUL, "results.peaks=peaks.json"],
            2,
            f"results.peaks=peaks.json: {SAID[kind]}",
            id=f"peaks-{kind}",
        )
        yield pytest.param(
            lambda w, k=kind: make(w / "conf" / "experiment" / "mine.yaml", k),
            ["--config-dir", "conf", "+experiment=mine", *FAST],
            2,
            f"mine.yaml: {SAID[kind]}",
            id=f"preset-{kind}",
        )
        yield pytest.param(
            lambda w, k=kind: make(w / "conf" / "model" / "other.yaml", k),
            ["--config-dir", "conf", *MATMUL],
            2,
            f"other.yaml: {SAID[kind]}",
            id=f"config-{kind}",
        )
        yield pytest.param(
            lambda w, k=kind: make(w / "root", k),
            [*TRAIN, "data.root=root"],
            2,
            f"data.root=root: {SAID[kind]}",
            id=f"data-root-{kind}",
        )
        yield pytest.param(
            lambda w, k=kind: make(w / "tree", k),
            ["results", "tree"],
            2,
            f"tree: {SAID[kind]}",
            id=f"tree-{kind}",
        )
        yield pytest.param(
            lambda w, k=kind: make(w / "ledger.csv", k),
            [*MATMUL, "results.ledger=ledger.csv"],
            2,
            f"results.ledger=ledger.csv: {SAID[kind]}",
            id=f"ledger-{kind}",
        )


HOSTILE = [
    *_input_cases(),
    # a bad value anywhere in a sweep: refused before any point runs
    pytest.param(
        None,
        ["-m", *MATMUL, "devices.spec=cpu,tpu:0"],
        2,
        "'tpu:0' is not a device name; in point #1",
        id="sweep-bad-device",
    ),
    pytest.param(None, ["-m", *MATMUL, "experiment.size=16,-1"], 2, "so no point was run", id="sweep-bad-size"),
    pytest.param(None, [*MATMUL, "devices.spec=[cuda:0,cuda:0]"], 2, "a device is listed twice", id="device-twice"),
    pytest.param(
        None,
        [*MATMUL, "devices.count=3", "devices.spec=[cpu,cpu]"],
        2,
        "devices.count=3: allowed: null or 2",
        id="device-count",
    ),
    # mistakes of the command line: a did-you-mean in its own syntax
    pytest.param(None, ["--versio"], 2, "--versio: not a flag of perflab; did you mean --version?", id="flag-prefix"),
    pytest.param(None, ["-mm", *MATMUL], 2, "-mm: not a flag of perflab; did you mean -m?", id="flag-doubled"),
    pytest.param(None, ["--cfgg", "job", *MATMUL], 2, "did you mean --cfg?", id="flag-typo"),
    pytest.param(
        None,
        [*MATMUL, "benchh.repeats=3"],
        2,
        "benchh.repeats=3: unknown key; did you mean bench.repeats?",
        id="key-group-typo",
    ),
    pytest.param(
        None,
        [*MATMUL, "+experiment=quick/train"],
        2,
        "+experiment=quick/train: a second experiment (+experiment=quick/matmul is given)",
        id="second-experiment",
    ),
    pytest.param(None, [*MATMUL, "results.claim_stale_s=0"], 2, "results.claim_stale_s=0", id="stale-zero"),
]


def snapshot(top) -> dict[str, tuple[str, bytes]]:
    """Every entry under ``top``: its kind and, for a regular file, its bytes (nothing opened
    that could block: FIFOs, sockets and links are only looked at)."""
    import stat as st

    out = {}
    for here, dirs, names in os.walk(top):
        for name in dirs + names:
            path = os.path.join(here, name)
            mode = os.lstat(path).st_mode
            if st.S_ISDIR(mode):  # folders come with what is in them (Hydra's empty outputs/runs/ aside)
                continue
            data = Path(path).read_bytes() if st.S_ISREG(mode) else b""
            if st.S_ISLNK(mode):
                data = os.readlink(path).encode()
            out[os.path.relpath(path, top)] = (st.S_IFMT(mode), data)
    return out


@pytest.fixture
def no_hang():
    def hung(signum, frame):
        raise TimeoutError(f"still waiting after {HANG_S} s: a reader blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("setup, args, rc, phrase", HOSTILE)
def test_hostile_cases_are_one_line_and_change_nothing(cli, work, no_hang, setup, args, rc, phrase):
    if setup is not None:
        setup(work)
    before = snapshot(work)
    ran = cli(*args, rc=rc)
    said = ran.err.strip().splitlines()
    assert len(said) == 1 and phrase in said[0], ran.err
    assert "Traceback" not in ran.out + ran.err
    assert snapshot(work) == before, "nothing written, nothing changed"


@cpu_only
def test_a_gpu_only_timer_without_a_gpu_is_refused(cli, work):
    ran = cli(*MATMUL, "bench.timer=cuda_event", rc=2)
    assert "bench.timer=cuda_event: this job runs on cpu, no CUDA device; allowed: auto, wall_sync" in ran.err
    assert not (work / "outputs").exists() or not list(work.rglob("results.csv"))


# --- torn and damaged store parts: measured again or rebuilt, and said ----------------------------


def test_a_done_point_whose_rows_are_torn_is_measured_again(cli, work):
    args = ["-m", *MATMUL]
    cli(*args)
    (first,) = work.glob("outputs/sweeps/*/0/results.csv")
    first.write_bytes(first.read_bytes()[:-40])  # cut short: a full disk, a copy that stopped
    ran = cli(*args)
    assert f"{first.parent.relative_to(work)} completed this point, but its results.csv holds 0 of its" in ran.out
    assert "measuring it again" in ran.out and "sweep: 1 jobs: 1 ok" in ran.out
    assert first.read_bytes().endswith(first.read_bytes()[-10:]), "the torn file is left as it is"


@pytest.mark.parametrize("part", ["done", "claims", "done/HASH", "done/HASH/MARKER"])
def test_a_derived_part_of_the_wrong_kind_is_rebuilt_and_said(cli, work, part):
    args = ["-m", *MATMUL]
    cli(*args)
    meta = work / "outputs" / ".perflab"
    (hashed,) = [p for p in (meta / "done").iterdir() if p.is_dir()]  # beside the FORMAT file
    (marker,) = hashed.iterdir()
    where = meta / part.replace("HASH", hashed.name).replace("MARKER", marker.name)
    import shutil

    shutil.rmtree(where) if where.is_dir() else where.unlink()
    where.mkdir() if part.endswith("MARKER") else where.write_text("x")  # the wrong kind
    ran = cli(*args)
    assert f"{where.relative_to(work)} " in ran.out and ("not a folder" in ran.out or "not a done marker" in ran.out)
    assert "sweep: 1 jobs: 1 done" in ran.out, "the point done before is still found: nothing measured twice"


# --- a claim lost while its holder was paused -------------------------------------------------


@pytest.mark.slow
def test_a_holder_paused_past_its_claim_records_nothing_when_it_resumes(cli, work):
    """A real SIGSTOP while the point is being measured: the paused sweep's claim goes stale, a
    second sweep (in this process: only the holder need be one to pause) takes the point over
    and measures it; resumed, the first records nothing (it checks its claim before each row),
    says so in one line and reuses the taker's rows."""
    args = ["-m", "+experiment=quick/matmul", *FAST, "bench.min_time_s=1", "results.claim_stale_s=3"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        [sys.executable, "-m", "perflab", *args, "results.table=false"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    claims = work / "outputs" / ".perflab" / "claims"
    try:
        for _ in range(30000):  # run.json says "running" as the measuring starts (it lasts seconds)
            running = list(work.glob("outputs/sweeps/*/0/run.json"))
            if running or first.poll() is not None:
                break
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGSTOP)
        assert running, "the first sweep never started measuring"
        (held,) = claims.glob("*.json")
        while time.time() - held.stat().st_mtime <= 4:  # stale now: no heartbeat while stopped
            time.sleep(0.2)
        second = cli(*args, "results.table=false")
        assert "took over" in second.out + second.err and "sweep: 1 jobs: 1 ok" in second.out
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    (line,) = [x for x in out.splitlines() if "taken over by" in x] or [out]
    assert "while this process was paused" in line and "results.claim_stale_s=3" in line, out
    assert "sweep: 1 jobs: 1 done" in out, out
    rows = load(work / "outputs")
    assert rows["run_id"].nunique() == 1, "the point is measured once: by the sweep that took it over"
    assert len(list((work / "outputs" / ".perflab" / "done").glob("*/*"))) == 1, "one done mark"
    assert list(work.glob("outputs/sweeps/*/0/.taken-over/*/run.json")), "what it had measured is kept aside"


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
    assert ran.rc == 1 and "Traceback" not in ran.out + ran.err, "stopped part-way: 1, as docs/running.md says"
    assert "sweep: 1 jobs: 1 error, 1 not tried" in ran.out, ran.out
    assert "not tried: job 1 (experiment.size=32)" in ran.out, "the sweep says which points it never tried"
    assert "results.csv: No space left on device" in ran.out
    assert f"results.store={out}: cannot write in" in ran.err, "the next point could not even start"
    (record,) = [RunRecord.read(p.parent) for p in out.rglob("run.json")]
    assert record.outcome == "error" and "No space left on device" in record.error, "never left at running"
    assert not list(out.rglob(".*.tmp"))


def test_a_claim_that_cannot_be_written_leaves_no_empty_claim(tiny_disk):
    (tiny_disk / ".perflab" / "claims").mkdir(parents=True)
    fill(tiny_disk)
    with pytest.raises(OSError) as err:
        point_claims.claim(tiny_disk, "h", tiny_disk / "a", stale_s=60)
    assert err.value.filename == str(tiny_disk / ".perflab" / "claims" / "h.json"), "ENOSPC names its file"
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

    from perflab import models
    from perflab.train import checkpoint

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


@pytest.mark.parametrize(
    "command, argv, hint",
    [("compare", ["--plt", "plots", "outputs"], "did you mean --plot?"), ("results", ["--n", "3"], "did you mean -n?")],
)
def test_a_tools_mistyped_flag_is_never_taken_for_a_prefix_and_gets_a_did_you_mean(command, argv, hint, capsys):
    import importlib

    with pytest.raises(SystemExit) as code:
        importlib.import_module(f"perflab.{command}").main(argv)
    err = capsys.readouterr().err
    assert code.value.code == 2 and len(err.strip().splitlines()) == 1 and hint in err, err


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
