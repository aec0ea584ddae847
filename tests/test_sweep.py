"""Sweeps that behave: failures are rows and the sweep goes on, a re-run sweep reuses only what
is really done and still lists every point, and two identical sweeps share the work."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from perflab.config import registry
from perflab.job.sweep import SWEEP_CSV, job_dirs
from perflab.results import load
from perflab.store.rundir import RunRecord

from conftest import FAST

MATMUL = ["+experiment=quick/matmul", *FAST, "results.table=false"]


def sweeps(work):
    """Sweep dirs, oldest first (by creation: two sweeps in one second sort by their random id)."""
    return sorted((work / "outputs" / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime_ns)


def outcomes(sweep_dir):
    return [RunRecord.read(j).outcome for j in job_dirs(sweep_dir)]


@pytest.mark.parametrize("where", ["run", "check"])
def test_a_job_that_raises_mid_sweep_leaves_an_error_row_and_the_sweep_goes_on(cli, work, monkeypatch, where):
    module = registry.get("matmul").module
    real_run = module.run

    def crash_on_32(ctx):
        if ctx.params.size == 32:
            raise RuntimeError("boom")
        real_run(ctx)

    def check_crashes_on_32(settings, devices):  # a bug in an experiment's check is a crash too
        if settings.experiment.size == 32:
            raise RuntimeError("boom")

    if where == "run":
        monkeypatch.setattr(module, "run", crash_on_32)
    else:
        monkeypatch.setattr(module, "check", check_crashes_on_32, raising=False)
    ran = cli("-m", *MATMUL, "experiment.size=16,32,48")
    (sweep_dir,) = sweeps(work)
    rows = load(sweep_dir / SWEEP_CSV).sort_values("job_num")
    assert rows["status"].tolist() == ["ok", "error", "ok"]
    assert rows["error"].iloc[1] == "RuntimeError: boom"
    assert "sweep: 3 jobs: 2 ok, 1 error" in ran.out
    assert "job  experiment.size  outcome" in ran.out  # the table of points


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_the_table_of_points_flags_a_point_whose_figure_is_suspect(cli, work):
    def points(out):
        lines = out.splitlines()
        return lines[next(i for i, line in enumerate(lines) if line.startswith("job ")) :][:4]

    # FAST's min_time_s=0: one sample is too few to know the spread; a busy or noisy machine flags nothing
    calm = ["bench.noise_threshold=100", "bench.busy_threshold=1"]
    header, _, one, three = points(cli("-m", *MATMUL, *calm, "bench.repeats=1,3").out)
    assert header.split() == ["job", "bench.repeats", "outcome", "result", "flags"]
    assert one.split()[1] == "1" and one.endswith("suspect")
    assert three.split()[1] == "3" and "suspect" not in three
    header = points(cli("-m", *MATMUL, *calm, "bench.repeats=3,4").out)[0]
    assert header.split() == ["job", "bench.repeats", "outcome", "result"]  # nothing to flag: no column


@pytest.mark.parametrize(
    "values, line",
    [
        ("16,-1", "experiment.size=-1: in point #1 of the sweep's 2, so no point was run; allowed: an integer >= 1"),
        ("16,abc", "experiment.size=abc: allowed: an integer (in point #1 of the sweep's 2"),  # a type: the same
        ("${oops},16", "experiment.size=${oops}: Interpolation key 'oops' not found; in point #0 of the sweep's 2"),
    ],
)
def test_a_bad_value_in_any_point_refuses_the_whole_sweep_before_any_point_runs(cli, work, values, line):
    ran = cli("-m", *MATMUL, f"experiment.size={values}", rc=2)
    assert ran.err.strip().startswith(f"perflab: error: {line}") and len(ran.err.strip().splitlines()) == 1
    assert not list(work.rglob("results.csv")) and not list(work.glob("outputs/sweeps/*"))


def test_what_only_a_points_devices_refute_is_that_points_row_and_the_sweep_goes_on(cli, work):
    ran = cli("-m", *MATMUL, "devices.spec=cpu,[cuda:99]", "devices.on_missing=error")
    assert "devices.spec=[cuda:99]: this machine has no CUDA device" in ran.out + ran.err
    assert "sweep: 2 jobs: 1 ok, 1 refused" in ran.out
    rows = load(sweeps(work)[0] / SWEEP_CSV).sort_values("job_num")
    assert rows["status"].tolist() == ["ok", "error"]


def test_exit_codes_say_what_came_of_the_sweep(cli, work, monkeypatch):
    cli("-m", *MATMUL, "experiment.size=-1,-2", rc=2)  # only bad values
    monkeypatch.setattr(registry.get("matmul").module, "run", lambda ctx: 1 / 0)
    cli("-m", *MATMUL, "experiment.size=16,24", rc=1)  # only crashes


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_a_re_run_sweep_reuses_done_points_and_still_lists_every_point(cli, work):
    cli("-m", *MATMUL, "experiment.size=16,24")
    first = sweeps(work)[0]
    ran = cli("-m", *MATMUL, "experiment.size=16,24")
    second = [s for s in sweeps(work) if s != first][0]
    assert "sweep: 2 jobs: 2 done" in ran.out
    assert outcomes(second) == ["done", "done"]
    assert not list(second.glob("*/results.csv")), "nothing measured again"
    again = load(second / SWEEP_CSV)
    assert sorted(again["row_id"]) == sorted(load(first / SWEEP_CSV)["row_id"])
    assert sorted(load(second)["row_id"]) == sorted(again["row_id"]), "load() of the new sweep dir follows"
    assert len(load(work / "outputs")) == 2, "a whole-tree load counts each row once"
    cli("-m", *MATMUL, "experiment.size=16,24", "results.redo=true")
    assert outcomes(sweeps(work)[-1]) == ["ok", "ok"]


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_a_new_subject_is_measured_again_not_taken_as_done(cli, work):
    """After a commit the same sweep measures the new code: the subject is part of a point."""
    cli("-m", *MATMUL, "experiment.size=16", "results.subject=v1")
    cli("-m", *MATMUL, "experiment.size=16", "results.subject=v2")
    assert outcomes(sweeps(work)[-1]) == ["ok"]
    assert sorted(load(work / "outputs")["subject"]) == ["v1", "v2"]
    cli("-m", *MATMUL, "experiment.size=16", "results.subject=v2")
    assert outcomes(sweeps(work)[-1]) == ["done"]


@pytest.mark.slow
def test_bench_processes_measures_each_point_in_fresh_processes_that_compare_counts(cli, work):
    from perflab import compare

    ran = cli("-m", *MATMUL, "experiment.size=16", "bench.processes=2", "results.store=base")
    assert "process 2 of 2 (bench.processes=2)" in ran.err
    rows = load(work / "base")
    assert sorted(rows["process"]) == [1, 2] and rows["run_id"].nunique() == 2, "each process its own run"
    shutil.copytree(work / "base", work / "new")  # an A/A: what compare counts is the processes, not their speed
    (point,) = compare.ab(work / "base", work / "new").to_dict("records")
    assert (point["base_processes"], point["new_processes"]) == (2, 2)
    cli(*MATMUL, "bench.processes=0", rc=2)  # range-checked, in one line, before anything runs
    refused = cli(*MATMUL, "bench.processes=2", "bench.repeats=0", rc=2)  # a bad value: the same in every process
    assert "process 1 of 2" in refused.err and "process 2 of 2" not in refused.err


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_killed_and_skipped_points_are_not_done(cli, work):
    too_many = torch.get_num_threads() + 1  # more CPU workers than cores: a point this machine skips
    cli("-m", *MATMUL, "devices.spec=cpu", f"devices.count=1,{too_many}")
    first = sweeps(work)[0]
    assert outcomes(first) == ["ok", "skipped"]
    record = RunRecord.read(job_dirs(first)[0])
    record.outcome, record.complete = "running", False  # as a job killed with kill -9 leaves it
    record.save(job_dirs(first)[0])

    shutil.rmtree(work / "outputs" / ".perflab" / "done")  # and its done marker never written
    cli("-m", *MATMUL, "devices.spec=cpu", f"devices.count=1,{too_many}")
    assert outcomes(sweeps(work)[-1]) == ["ok", "skipped"], "the killed point ran again; the skipped one was tried"


@pytest.mark.slow
def test_two_identical_sweeps_started_together_measure_each_point_once(work):
    cmd = [sys.executable, "-m", "perflab", "-m", *MATMUL, "experiment.size=16,24,32", "bench.min_time_s=0.3"]
    procs = [
        subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    measured = list((work / "outputs" / "sweeps").glob("*/*/results.csv"))
    assert len(measured) == 3, "each point measured once"
    for sweep_dir in sweeps(work):
        assert sorted(load(sweep_dir / SWEEP_CSV)["cfg.experiment.size"]) == [16, 24, 32]
    assert not list((work / "outputs" / ".perflab" / "claims").glob("*.json")), "every claim released"


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_parallel_launcher_labels_rows_and_never_shares_a_gpu(cli, work):
    from types import SimpleNamespace

    from perflab.errors import ConfigError
    from perflab.job import sharing as launchers
    from perflab.measure.devices import Device

    cli("-m", "+launcher=parallel", *MATMUL, "experiment.size=16,32")
    rows = load(work / "outputs")
    assert len(rows) == 2 and rows["beside"].str.contains("2 jobs at once").all()
    with pytest.raises(ConfigError, match="parallel local jobs would share the GPUs"):
        launchers.beside(SimpleNamespace(parallel_jobs=2), [Device("cuda:0", "cuda", 0)])


def test_a_stop_signal_is_kept_not_raised_while_the_stop_row_is_written_and_raised_after():
    """SLURM may send a preempted job's SIGTERM twice: the second, landing while the job writes
    its `cancelled` row, must not cut it short. Outside that, every signal raises (the first's
    raise may have been swallowed)."""
    import os
    import signal
    import time

    from perflab.job.stop import Stopped, on_stop_signals, raise_if_stopped, stop_signals_held

    with on_stop_signals():
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        with stop_signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the row being written: goes on
        with pytest.raises(Stopped, match="SIGTERM"):
            raise_if_stopped()
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)


def test_a_stop_signal_whose_raise_python_swallowed_still_stops_the_point(cli, work, monkeypatch):
    """A SIGTERM landing in a finalizer or a lock's release has its exception printed and
    dropped by Python; the job must still stop, with no ok row after it."""
    import os
    import signal
    import time

    from perflab.job.stop import Stopped

    module = registry.get("matmul").module
    real_run = module.run

    def signal_swallowed_then_measure(ctx):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        except Stopped:
            pass  # what Python does to an exception raised inside a finalizer
        real_run(ctx)

    monkeypatch.setattr(module, "run", signal_swallowed_then_measure)
    ran = cli("-m", *MATMUL, "experiment.size=16,32", rc=130)
    assert "sweep: 1 jobs: 1 cancelled" in ran.out
    rows = load(sweeps(work)[0] / SWEEP_CSV)
    assert rows["status"].tolist() == ["cancelled"] and "SIGTERM" in rows["error"].iloc[0]


def test_a_sweep_says_its_own_lines_without_hydras_launcher_lines(cli, work):
    """Hydra's ``[HYDRA] Launching 2 jobs locally`` / ``#0 : ...`` lines are quiet (its warnings
    are not): perflab's own lines say what each job is and where it went."""
    out = cli("-m", *MATMUL, "experiment.size=16,24").out
    assert "[HYDRA]" not in out and "Launching 2 jobs" not in out, out
    assert out.count("perflab matmul on ") == 2 and "sweep: 2 jobs: 2 ok" in out
