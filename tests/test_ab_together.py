"""#41: where the sides of ``perflab ab`` differ only by overrides, one process measures both each
round, alternated sample by sample (perflab.job.together, perflab.measure.turns): a neighbour that
comes for a second falls on both sides of a pair alike."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from perflab import ab, results
from perflab.config import registry
from perflab.job import together
from perflab.measure import turns

from conftest import FAST


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
    assert together.main([json.dumps(s) for s in sides]) == 0
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
    assert together.main([json.dumps(good), json.dumps(bad)]) == 2


def test_ab_measures_both_sides_in_one_process_only_where_they_differ_by_overrides_alone(tmp_path):
    base, new = ab.Side("base", tmp_path / "b", ["experiment.size=64"]), ab.Side("new", tmp_path / "n")
    assert ab.apart_because(["+experiment=quick/matmul"], base, new) == ""
    assert "sweep" in ab.apart_because(["-m", "+experiment=quick/matmul", "experiment.size=64,96"], base, new)
    new.env = {"OMP_NUM_THREADS": "1"}
    assert ab.apart_because(["+experiment=quick/matmul"], base, new).startswith("new has its own environment")


@pytest.mark.slow
def test_perflab_ab_judges_pairs_measured_in_one_process(work, cli):
    """A/A, 3 rounds of one process each: both trees hold processes 1..3, and the point is judged."""
    ran = cli(
        "ab", "+experiment=quick/matmul", "experiment.size=64", "devices.threads=1", *FAST,
        "--min-processes", "3", "--max-processes", "3", "--out", str(work / "ab"), "--process-cv", "5", rc=None,
    )  # fmt: skip
    assert "both sides in one process, alternated sample by sample" in ran.err
    assert ran.rc in (0, 3), ran.err  # an A/A never FAILs
    for side in ("base", "new"):
        rows = results.load(work / "ab" / side)
        assert sorted(rows["process"].unique()) == [1, 2, 3]
