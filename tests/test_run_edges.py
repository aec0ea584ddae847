"""A job at the edges of its run: a user's experiment that records nothing or calls
``sys.exit`` is an ``error``, not a silent pass; a hook that fails after the measurement costs
one line, not the job; Ctrl-C stops perflab after worker processes came and went (torch's
elastic agent installs its own SIGINT handler while they run) and during them (DDP training).

The user's experiments are a package written here and registered as pip would leave it (the
``install`` fixture of test_contract)."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from started_worker import sleep_once_started
from test_contract import install  # noqa: F401 - the fixture

from perflab.results import load
from perflab.store.rundir import RunRecord

from conftest import FAST

AGENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # torch's agent takes them

EDGES = '''"""Edges: a run that does what experiment.does says."""
import signal
import sys
import time
from dataclasses import dataclass

from perflab.config.schema import ExperimentConfig


@dataclass
class Config(ExperimentConfig):
    does: str = "nothing"  # nothing | exit | workers


def run(ctx):
    if ctx.params.does == "exit":
        sys.exit(0)
    if ctx.params.does == "workers":  # a worker comes and goes, then the job waits to be stopped
        ctx.launch_workers(one, nproc=1)
        ctx.record("workers returned", note=f"SIGINT: {signal.getsignal(signal.SIGINT).__name__}")
        while True:
            time.sleep(0.05)


def one(ctx):
    return 1
'''

LOUD = '''"""Loud: one row, then every hook called after the measurement fails."""
from dataclasses import dataclass

from perflab.config.schema import ExperimentConfig


@dataclass
class Config(ExperimentConfig):
    pass


def run(ctx):
    ctx.record("sum", total=3)
    ctx.record("product", total=2)


def headline(rows):
    return [f"{rows[0]['gbps']} GB/s"]


def work(rows):
    return 1 / 0


def label(row):
    return row["epoch"]


def progress(row):
    raise RuntimeError("no line\\nsecond line")


def report(rows, samples):
    raise ValueError("no section")
'''


@pytest.fixture
def edgepkg(install):  # noqa: F811 - the fixture imported above
    install(
        "edgepkg",
        {"edges": "edgepkg.edges", "loud": "edgepkg.loud"},
        {"edgepkg/__init__.py": "", "edgepkg/edges.py": EDGES, "edgepkg/loud.py": LOUD},
    )
    return install.site


def only_run(work: Path) -> tuple[Path, RunRecord]:
    (run_dir,) = (work / "outputs" / "runs").iterdir()
    record = RunRecord.read(run_dir)
    assert record is not None
    return run_dir, record


# --- a run that ends without a result ---------------------------------------------------------------


def test_an_experiment_that_records_nothing_is_an_error_not_a_silent_pass(edgepkg, cli, work):
    ran = cli("+experiment=edges", rc=1)
    assert "job: error: edges recorded no rows" in ran.out
    run_dir, record = only_run(work)  # the run stays, and says what came of it
    assert (record.outcome, record.complete, record.rows) == ("error", False, 1)
    assert record.error == "edges recorded no rows"
    df = load(work / "outputs")
    assert df[["measurement", "status", "error"]].values.tolist() == [["job", "error", "edges recorded no rows"]]


def test_sys_exit_in_an_experiment_is_an_error_row_like_any_crash(edgepkg, cli, work):
    ran = cli("+experiment=edges", "experiment.does=exit", rc=1)
    assert "job: error: SystemExit: 0" in ran.out
    run_dir, record = only_run(work)
    assert (record.outcome, record.error) == ("error", "SystemExit: 0"), "not left saying running"
    assert "sys.exit(0)" in (run_dir / "error.txt").read_text()  # where it exited


# --- hooks after the measurement --------------------------------------------------------------------


def test_a_hook_that_fails_after_the_measurement_is_one_line_and_the_rows_stand(edgepkg, cli, work):
    ran = cli("+experiment=loud")  # exit 0: the job is ok
    said = ran.out + ran.err
    assert "Traceback" not in said and "Error executing job" not in said
    for line in (
        "edgepkg.loud.headline failed: KeyError: 'gbps'",
        "edgepkg.loud.work failed: ZeroDivisionError: division by zero",
        "edgepkg.loud.report failed: ValueError: no section",
        "edgepkg.loud.label failed: KeyError: 'epoch'",  # once, not once per row
        "edgepkg.loud.progress failed: RuntimeError: no line",  # its first line
    ):
        assert said.count(line) == 1, (line, said)
    assert "second line" not in said
    assert "sum: ok" in said and "product: ok" in said  # the generic progress line stands in
    table = said[said.index("measurement ") :]
    assert table.splitlines()[2].startswith("sum ") and table.splitlines()[3].startswith("product ")
    _, record = only_run(work)
    assert (record.outcome, record.complete, record.rows) == ("ok", True, 2)


# --- Ctrl-C after and during worker processes -----------------------------------------------------


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_ctrl_c_while_workers_run_is_a_keyboard_interrupt_from_launch(tmp_path):
    """Outside any job too: torch's agent stops the workers, then Ctrl-C is Python's again.
    Ctrl-C comes once the worker runs its function (a worker still starting may not die of it,
    and the agent then waits its 30 s shutdown timeout before it kills it)."""
    from perflab.cluster import workers

    handlers = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    started = tmp_path / "started"
    done = threading.Event()

    def ctrl_c_once_the_worker_runs() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not done.is_set() and not started.exists():
            time.sleep(0.05)
        if not done.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=ctrl_c_once_the_worker_runs, daemon=True)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            workers.launch(sleep_once_started, str(started), nproc=1, log_dir=tmp_path, run_id="ctrl-c")
    finally:
        done.set()
        thread.join()
    assert started.exists(), "Ctrl-C came before the worker ran"
    assert {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS} == handlers


def perflab_process(work: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``perflab ARGS`` as from a terminal: its own process group, which Ctrl-C signals whole."""
    return subprocess.Popen(
        [sys.executable, "-m", "perflab", *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def ctrl_c_once(proc: subprocess.Popen, work: Path, row: str, timeout: float = 180) -> str:
    """Ctrl-C (SIGINT to its process group) once ``row`` is in its results.csv; its output."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if any(
            r["measurement"] == row for p in work.glob("outputs/runs/*/results.csv") for r in csv.DictReader(p.open())
        ):
            break
        time.sleep(0.1)
    assert proc.poll() is None, f"it ended before {row!r}: {proc.communicate()[0]}"
    os.killpg(proc.pid, signal.SIGINT)
    return proc.communicate(timeout=120)[0]


@pytest.mark.slow
def test_ctrl_c_after_workers_returned_stops_the_job_as_ctrl_c(edgepkg, work):
    path = os.pathsep.join([str(edgepkg), os.environ.get("PYTHONPATH", "")])
    proc = perflab_process(work, "+experiment=edges", "experiment.does=workers", env={"PYTHONPATH": path})
    out = ctrl_c_once(proc, work, "workers returned")
    assert proc.returncode == 130, out
    assert "job: cancelled: interrupted (Ctrl-C)" in out and "perflab: interrupted" in out
    assert "SignalException" not in out and "Traceback" not in out
    run_dir, record = only_run(work)
    assert (record.outcome, record.error) == ("cancelled", "interrupted (Ctrl-C)")
    rows = load(run_dir).set_index("measurement")
    assert rows.loc["workers returned", "note"] == "SIGINT: default_int_handler", "Python's own, once they are gone"


@pytest.mark.slow
def test_ctrl_c_during_ddp_training_is_ctrl_c_and_its_summary_says_what_it_knows(work):
    args = [
        "+experiment=train",
        "strategy=ddp",
        "devices.spec=cpu",
        "devices.count=2",
        "data.train_size=512",
        "data.test_size=128",
        "trainer.batch_size=64",
        "trainer.epochs=100",
        *FAST,
    ]
    proc = perflab_process(work, *args)
    out = ctrl_c_once(proc, work, "epoch")
    assert proc.returncode == 130, out
    assert "job: cancelled: interrupted (Ctrl-C)" in out and "SignalException" not in out
    for what in ("model", "devices", "global batch", "learning rate"):
        assert f"{what}: ? here" not in out, out  # the epoch rows know them
    assert "devices: 2 here" in out and re.search(r"global batch: \d+ here", out)
    run_dir, record = only_run(work)
    assert record.outcome == "cancelled" and json.loads((run_dir / "run.json").read_text())["outcome"] == "cancelled"
