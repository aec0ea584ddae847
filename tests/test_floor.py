"""The floor of one-process verdicts: --process-cv, else the between-process variation the same
experiment's points of two or more processes measured in the trees, else FLOOR_CV; never a cache."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perflab import compare
from perflab.analysis import floor, replicates
from perflab.store.rundir import RunWriter

from conftest import timed_row

MACHINE = {"cpu_model": "Test CPU", "cpu_physical_cores": 2, "num_threads": 2, "torch": "2.14.1"}


def tree(path, medians, sizes=(64, 128, 256), experiment="matmul", **identity):
    """A tree: each size a point, one process (its own run) per median."""
    rng = np.random.default_rng(len(str(path)))
    for k, median in enumerate(medians, 1):
        writer = RunWriter(path / f"{experiment}{k}")
        for size in sizes:
            times = median * (1 + rng.normal(0, 0.005, 20))
            row = timed_row(
                times,
                run_id=f"{path.name}{experiment}{k}",
                experiment=experiment,
                measurement="cpu alone",
                process=k,
                tflops=1e-3 / float(np.median(times)),
                device_name="CPU (2 threads)",
                **{"cfg.experiment.size": size, **MACHINE, **identity},
            )
            writer.add(row, samples=list(times))
    return path


def test_the_floor_pools_the_points_that_measured_one_weighted_by_their_freedom():
    assert floor.measured([]) is floor.ASSUMED and floor.ASSUMED.cv == replicates.FLOOR_CV
    assert floor.measured([(math.nan, 0), (0.3, 0)]) is floor.ASSUMED  # one process a side measures nothing
    found = floor.measured([(0.1, 4), (0.2, 1)])
    assert found.cv == pytest.approx(math.sqrt((4 * 0.01 + 0.04) / 5)) and "2 points" in found.source
    assert floor.given(0.05) == floor.Floor(0.05, "--process-cv")


def test_each_experiment_is_floored_by_its_own_points_never_anothers(tmp_path):
    """matmul's points of three processes a side (20 % apart) set matmul's floor; the other
    experiment, one process a side, keeps the default: spreads are never pooled across work."""
    base, new = tmp_path / "base", tmp_path / "new"
    tree(base, [1.0, 1.2, 0.83], sizes=(64, 128))
    tree(new, [0.83, 1.0, 1.2], sizes=(64, 128))
    tree(base, [1.0], sizes=(64, 128), experiment="infer")
    tree(new, [1.01], sizes=(64, 128), experiment="infer")
    table = compare.ab(base, new).set_index(["experiment", "cfg.experiment.size"])
    assert "measured in these trees" not in " ".join(table.loc["infer", "why"])
    assert "floor of 10 % (assumed" in table.loc[("infer", 64), "why"]
    assert table.loc[("matmul", 64), "base_processes"] == 3
    given = compare.ab(base, new, process_cv=0.05).set_index(["experiment", "cfg.experiment.size"])
    assert "floor of 5 % (--process-cv" in given.loc[("infer", 128), "why"]
