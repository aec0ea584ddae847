"""The floor of one-process verdicts: looked up once per machine (not at all under --process-cv),
written only by the commands that are asked to keep it, and keyed by the machine identity as
compare reads it (old caches' keys still read)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perflab import compare, results
from perflab.analysis import comparison, floor
from perflab.measure.environment import identity_key
from perflab.store.rundir import RunWriter

from conftest import timed_row

MACHINE = {"cpu_model": "Test CPU", "cpu_physical_cores": 2, "num_threads": 2, "torch": "2.14.1"}


def tree(path, medians, sizes=(64, 128, 256), **identity):
    """A matmul tree: each size a point, one process (its own run) per median."""
    rng = np.random.default_rng(len(str(path)))
    for k, median in enumerate(medians, 1):
        writer = RunWriter(path / f"p{k}")
        for size in sizes:
            times = median * (1 + rng.normal(0, 0.005, 20))
            row = timed_row(
                times,
                run_id=f"{path.name}{k}",
                experiment="matmul",
                measurement="cpu alone",
                process=k,
                tflops=1e-3 / float(np.median(times)),
                device_name="CPU (2 threads)",
                **{"cfg.experiment.size": size, **MACHINE, **identity},
            )
            writer.add(row, samples=list(times))
    return path


@pytest.fixture
def trees(tmp_path):
    return tree(tmp_path / "base", [1.0, 1.03, 0.97]), tree(tmp_path / "new", [1.0, 0.98, 1.02])


def test_the_statistics_write_no_floor_and_compare_keeps_it_only_when_asked(trees):
    base, new = trees
    series: list = []
    comparison.ab(base, new, series=series)
    assert len(series) == 6 and not floor.path().exists()  # three points, two sides: handed back, not written
    compare.ab(base, new)
    assert not floor.path().exists()  # a reader, unasked
    assert compare.main([str(base), str(new)]) in (0, 3) and not floor.path().exists()
    assert compare.main([str(base), str(new), "--keep-floor"]) in (0, 3)
    (entry,) = json.loads(floor.path().read_text()).values()
    assert sorted(entry["series"]) == ["tflops base1", "tflops new1"]  # a series: a side's first run


def test_a_machines_floor_is_looked_up_once_and_not_at_all_under_process_cv(trees, monkeypatch):
    base, new = trees
    one = [tree(base.parent / "one-base", [1.0]), tree(base.parent / "one-new", [1.01])]
    looked: list[dict] = []
    real = floor.of_machine
    monkeypatch.setattr(floor, "of_machine", lambda identity: looked.append(identity) or real(identity))
    table = compare.ab(*one)
    assert len(table) == 3 and len(looked) == 1  # three points, one machine
    looked.clear()
    reads: list[int] = []
    real_read = floor._read
    monkeypatch.setattr(floor, "_read", lambda: reads.append(1) or real_read())
    compare.ab(*one, process_cv=0.05)
    assert not looked and not reads


def test_the_kept_machine_is_compares_identity_and_old_caches_still_read(tmp_path):
    """One identity text for INCOMPARABLE and the cache's key: the key of an identity as text
    (what earlier releases kept under) finds the series kept for these rows."""
    rows = results.load(tree(tmp_path / "t", [1.0]))
    expected = {"cpu_model": "Test CPU", "cpu_physical_cores": "2", "num_threads": "2", "torch": "2.14.1"}
    assert floor.machine(rows) == expected
    assert dict(comparison._Cells(rows).machine(np.arange(len(rows)))) == expected
    floor.path().parent.mkdir(parents=True, exist_ok=True)
    old = {identity_key(expected): {"machine": expected, "series": {"tflops r1": {"cv": 0.07, "df": 4}}}}
    floor.path().write_text(json.dumps(old))
    found = floor.of(rows)
    assert found.cv == pytest.approx(0.07) and "kept from 1 earlier series" in found.source
