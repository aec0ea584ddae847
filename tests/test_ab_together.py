"""#41: where the sides of ``perflab ab`` differ only by overrides, one process measures both each
round, alternated sample by sample (perflab.job.together, perflab.measure.turns): a neighbour that
comes for a second falls on both sides of a pair alike."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from perflab import ab, compare, results
from perflab.config import registry
from perflab.job import together
from perflab.measure import bench, turns
from perflab.measure.devices import Device
from perflab.store.rundir import RunWriter

from conftest import FAST, timed_row


def test_jobs_in_turns_alternate_and_each_keeps_its_own_torch_settings():
    said: list[str] = []

    def job(name: str, threads: int, samples: int):
        def run():
            torch.set_num_threads(threads)
            for _ in range(samples):
                said.append(f"{name}{torch.get_num_threads()}")  # its own threads, whatever the other set
                turns.turn()
            return name

        return run

    before = torch.get_num_threads()
    try:
        values = turns.in_turns([job("a", 1, 3), job("b", 2, 5)])
    finally:
        torch.set_num_threads(before)
    assert values == ["a", "b"]
    assert said == ["a1", "b2", "a1", "b2", "a1", "b2", "b2", "b2"]  # the one left goes on alone
    turns.turn()  # no jobs in turns: nothing to hand over, no wait


def test_a_job_that_raises_ends_its_turns_and_the_other_goes_on():
    def fails():
        turns.turn()
        raise RuntimeError("boom")

    def counts():
        for _ in range(3):
            turns.turn()
        return threading.current_thread().name

    failed, name = turns.in_turns([fails, counts])
    assert isinstance(failed, RuntimeError) and name == "perflab-turn-1"


def test_jobs_in_turns_compute_on_one_thread_with_their_own_modes():
    """Two threads' parallel ops would run on two OpenMP pools, one of which can stall while the
    other spins: in turns, both jobs' timed CPU work runs on the one compute thread, each sample
    with its own job's threads, grad and inference modes and CPU autocast."""
    seen: list[tuple[str, int, int, bool, bool, bool]] = []
    cpu = [Device("cpu", "cpu")]

    def job(name: str, threads: int, mode: contextlib.AbstractContextManager):
        def run():
            torch.set_num_threads(threads)
            with mode:

                def fn() -> None:
                    seen.append(
                        (
                            name,
                            threading.get_ident(),
                            torch.get_num_threads(),
                            torch.is_grad_enabled(),
                            torch.is_inference_mode_enabled(),
                            torch.is_autocast_enabled("cpu"),
                        )
                    )

                bench.measure_rounds({name: bench.Variant(fn, cpu)}, warmup=1, repeats=2)
            return threading.get_ident()

        return run

    before = torch.get_num_threads()
    try:
        jobs = turns.in_turns(
            [job("a", 1, torch.inference_mode()), job("b", 2, torch.autocast("cpu", dtype=torch.bfloat16))]
        )
    finally:
        torch.set_num_threads(before)
    assert [s[0] for s in seen] == ["a", "a", "b", "b", "a", "b"]  # warm-up and first sample, then in turn
    (one,) = {s[1] for s in seen}
    assert one not in jobs and one != threading.get_ident()  # neither job's thread, nor this one
    assert {s[0]: s[2:] for s in seen} == {"a": (1, False, True, False), "b": (2, True, False, True)}


def test_jobs_in_turns_end_with_their_compute_thread_ended():
    """A compute thread still unwinding torch's thread state as the interpreter exits aborts the
    process ("terminate called without an active exception", 3 in 30 runs of ab's process): when
    the jobs are done, so is it."""
    assert turns.in_turns([lambda: turns.compute(lambda: torch.ones(8).sum().item())] * 2) == [8.0, 8.0]
    assert not [t for t in threading.enumerate() if t.name == "perflab-compute"]


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_a_ctrl_c_ends_a_process_of_jobs_in_turns_without_waiting_for_their_work(tmp_path):
    """The main thread interrupted while a job's call runs on the compute thread, a call that
    never returns: the process ends at once, waiting on neither the jobs nor that call."""
    script = tmp_path / "hang.py"
    script.write_text(
        "import os, signal, threading\n"
        "from perflab.measure import turns\n"
        "threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "turns.in_turns([lambda: turns.compute(threading.Event().wait)] * 2)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and done.stderr.strip().endswith("KeyboardInterrupt"), done.stderr


def test_both_sides_in_one_process_take_their_samples_in_turn_into_their_own_trees(work, monkeypatch):
    order: list[str] = []

    def run(ctx):
        size = ctx.params.size
        ctx.measure("x", lambda: order.append(str(size)))

    monkeypatch.setattr(registry.get("matmul").module, "run", run)
    sides = [
        ["+experiment=quick/matmul", f"experiment.size={size}", f"results.store={name}", "results.table=false", *FAST]
        for size, name in ((64, "base"), (96, "new"))
    ]
    assert together.main([json.dumps([sides])]) == 0
    # base's warm-up call and first sample, then new's, then a sample of each in turn
    assert order == ["64", "64", "96", "96", "64", "96", "64", "96"]
    for name in ("base", "new"):
        rows = results.load(work / name)
        assert list(rows["measurement"]) == ["x"] and rows["n"].iloc[0] == 3
        log = next((work / name).rglob("perflab.log")).read_text()
        assert f"-> {name}/" in log and f"-> {'new' if name == 'base' else 'base'}/" not in log  # its own lines


def test_a_refused_side_is_a_usage_error_of_the_process(work):
    good = ["+experiment=quick/matmul", "results.store=base", *FAST]
    bad = ["+experiment=quick/matmul", "experiment.size=-1", "results.store=new", *FAST]
    assert together.main([json.dumps([[good, bad]])]) == 2


def test_ab_measures_both_sides_in_one_process_only_where_they_differ_by_overrides_alone(tmp_path):
    base, new = ab.Side("base", tmp_path / "b", ["experiment.size=64"]), ab.Side("new", tmp_path / "n")
    assert ab.apart_because(["+experiment=quick/matmul"], base, new) == ""
    assert ab.apart_because(["-m", "+experiment=quick/matmul", "experiment.size=64,96"], base, new) == ""
    assert "glob" in ab.apart_because(["-m", "+experiment=quick/matmul", "model=glob(*)"], base, new)
    new.env = {"OMP_NUM_THREADS": "1"}
    assert ab.apart_because(["+experiment=quick/matmul"], base, new).startswith("new has its own environment")


def test_a_sweeps_points_are_those_hydra_runs_in_its_order():
    sweep = ["-m", "+experiment=quick/matmul", "experiment.size=64,96", "devices.threads=1", "seed=range(1,3)"]
    assert ab.points(sweep) == [
        ["+experiment=quick/matmul", "experiment.size=64", "devices.threads=1", "seed=1"],
        ["+experiment=quick/matmul", "experiment.size=64", "devices.threads=1", "seed=2"],
        ["+experiment=quick/matmul", "experiment.size=96", "devices.threads=1", "seed=1"],
        ["+experiment=quick/matmul", "experiment.size=96", "devices.threads=1", "seed=2"],
    ]
    assert ab.points(["+experiment=quick/matmul", "experiment.size=64"]) == [
        ["+experiment=quick/matmul", "experiment.size=64"]
    ]


def test_a_sweeps_side_is_checked_at_the_first_value_of_each_swept_key(work):
    """As a run's, a sweep's values are refused before either side measures: at its first point."""
    side = ab.Side("new", work / "n")
    assert ab.side_mistake(side, ["+experiment=quick/matmul", "experiment.size=-1,64"]).startswith(
        "new side: experiment.size=-1"
    )
    assert ab.side_mistake(side, ["+experiment=quick/matmul", "experiment.size=64,96"]) == ""


def test_a_decided_point_is_measured_no_more(tmp_path):
    """Two points: 64 is 30 % slower on the new side (decided FAIL at an early look), 96 the same on
    both with 2 % swings between processes (undecided longer): the rounds after 64's look measure 96 alone."""
    rng = np.random.default_rng(3)
    measured: list[list[int]] = []

    def both(k, todo):
        sizes = [int(p[-1].partition("=")[2]) for p in todo]
        measured.append(sizes)
        for name, tree in (("base", tmp_path / "base"), ("new", tmp_path / "new")):
            for size in sizes:
                median = 1e-3 * (1.3 if name == "new" and size == 64 else 1.0) * (1 + rng.normal(0, 0.02))
                times = median * (1 + rng.normal(0, 0.002, 20))
                row = timed_row(
                    times, run_id=f"{name}{k}{size}", experiment="matmul", measurement="cpu alone", process=k,
                    tflops=1e-3 / float(np.median(times)), device_name="CPU (1 thread)", num_threads=1,
                    **{"cfg.experiment.size": size},
                )  # fmt: skip
                RunWriter(tree / f"{name}{k}_{size}").add(row, samples=list(times))
        return 0

    base, new = ab.Side("base", tmp_path / "base"), ab.Side("new", tmp_path / "new", ["experiment.iterations=5"])
    shared = ["-m", "+experiment=quick/matmul", "experiment.size=64,96"]
    table, _ = ab.run(shared, base, new, together=True, measure_both=both, max_processes=12, say=lambda line: None)
    alone = measured.index([96])  # the first round after 64 was decided
    assert alone >= 2 and all(sizes == [64, 96] for sizes in measured[:alone])  # both, up to a look
    assert all(sizes == [96] for sizes in measured[alone:])
    verdicts = table.set_index("cfg.experiment.size")["verdict"]
    assert verdicts[64] == "FAIL"


@pytest.mark.slow
def test_perflab_ab_judges_pairs_measured_in_one_process(work, cli):
    """An A/A sweep of two points, 2 rounds of one process each: both trees hold each point's
    processes 1 and 2, and every point is judged."""
    ran = cli(
        "ab", "-m", "+experiment=quick/matmul", "experiment.size=64,96", "devices.threads=1", *FAST,
        "--min-processes", "2", "--max-processes", "2", "--out", str(work / "ab"), "--process-cv", "5", rc=None,
    )  # fmt: skip
    assert "both sides in one process, alternated sample by sample" in ran.err
    assert ran.rc in (0, 3), ran.err  # an A/A never FAILs
    for side in ("base", "new"):
        rows = results.load(work / "ab" / side)
        assert sorted(zip(rows["cfg.experiment.size"], rows["process"])) == [(64, 1), (64, 2), (96, 1), (96, 2)]


@pytest.mark.slow
def test_the_why_pass_profiles_both_sides_in_one_process_as_the_timed_ones(work, cli):
    """A process's own speed can differ by a quarter from the next one's: in the why pass too,
    process k of both sides is one process, so that it falls on both sides of each pair."""
    ran = cli(
        "ab", "+experiment=quick/matmul", "experiment.size=256", "devices.threads=1", "bench.warmup=2",
        "bench.repeats=10", "bench.min_time_s=0", "--new", "experiment.dtype=float64", "--min-processes", "3",
        "--max-processes", "3",
        "--out", str(work / "ab"), "--process-cv", "5", rc=None,
    )  # fmt: skip
    assert ran.rc == 1 and "3 profiled processes a side (both sides in each, in turns)" in ran.err, ran.err
    for side in ("base", "new"):
        assert sorted(results.load(work / "ab" / "why" / side)["process"].unique()) == [1, 2, 3]
        assert results.load_operators(work / "ab" / "why" / side)["operator"].eq("aten::mm").any()
    assert "aten::mm +" in ran.out, "the FAIL explained"


def test_busy_pairs_measured_in_one_process_are_judged_apart_ones_are_not(tmp_path):
    """Every process busy, no CPU time: measured apart, nothing is judged (never a verdict on busy
    evidence); measured in turns in one process, the pairs decide: A/A PASS, 30 % slower FAIL.
    Process k of every side saw the same neighbour (its load swings 1-2.5x between processes)."""
    rng = np.random.default_rng(5)
    loads = 1 + rng.uniform(0, 1.5, 6)
    for name, factor in (("base", 1.0), ("same", 1.0), ("slow", 1.3)):
        for k, load in enumerate(loads, 1):
            times = 1e-3 * factor * load * (1 + rng.normal(0, 0.003, 20))
            row = timed_row(
                times, run_id=f"{name}{k}", experiment="matmul", measurement="cpu alone", process=k,
                tflops=1e-3 / float(np.median(times)), device_name="CPU (1 thread)", num_threads=1, busy=True,
                suspect="the machine was busy: ...", **{"cfg.experiment.size": 64},
            )  # fmt: skip
            RunWriter(tmp_path / name / f"{name}{k}").add(row, samples=list(times))
    for name, verdict in (("same", "PASS"), ("slow", "FAIL")):
        apart = compare.ab(tmp_path / "base", tmp_path / name, busy="left_out", paired=True)
        assert "verdict" not in apart or apart["verdict"].isna().all()
        alike = compare.ab(tmp_path / "base", tmp_path / name, busy="alike", paired=True).iloc[0]
        assert alike["verdict"] == verdict and "in turns in one process" in alike["judged"], alike.to_dict()
