"""perflab ab: processes alternate A B A B, a point undecided gets more of them until decided or
the budget ends, looks are paid for (Bonferroni over the planned looks), both trees are written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perflab import ab, results
from perflab.store.rundir import RunWriter

from conftest import FAST


def fake(between: float, slower: float = 1.0, seed: int = 0):
    """A measure function that writes one matmul row per (side, process), the processes'
    medians spread ``between`` apart, NEW ``slower`` times slower; and the order of calls."""
    rng = np.random.default_rng(seed)
    calls: list[tuple[str, int]] = []

    def measure(side: ab.Side, k: int) -> int:
        calls.append((side.name, k))
        median = (slower if side.name == "new" else 1.0) * (1 + rng.normal(0, between))
        times = median * (1 + rng.normal(0, 0.002, 20))
        run = f"{side.name}{k}"
        RunWriter(side.tree / run).add(
            {
                "run_id": run,
                "experiment": "matmul",
                "measurement": "cpu alone",
                "status": "ok",
                "process": k,
                "n": len(times),
                "median_s": float(np.median(times)),
                "tflops": 1e-3 / float(np.median(times)),
                "device_name": "CPU (1 thread)",
                "cfg.experiment.size": 64,
            },
            samples=list(times),
        )
        return 0

    return measure, calls


def sides(tmp_path):
    return ab.Side("base", tmp_path / "base"), ab.Side("new", tmp_path / "new")


def test_processes_alternate_and_a_clear_slowdown_fails_at_the_first_look(tmp_path):
    measure, calls = fake(0.01, slower=1.5)
    table, code = ab.run([], *sides(tmp_path), min_processes=3, measure=measure, say=lambda line: None)
    assert calls == [("base", 1), ("new", 1), ("new", 2), ("base", 2), ("base", 3), ("new", 3)]  # A B, B A, A B
    assert code == 1 and table["verdict"].tolist() == ["FAIL"]
    assert (table["base_processes"].item(), table["new_processes"].item()) == (3, 3)


def test_an_undecided_point_gets_more_processes_until_decided(tmp_path):
    measure, calls = fake(0.02, seed=1)  # A/A, 2 % between processes: 2 a side cannot show 10 %
    seen: list[str] = []
    table, code = ab.run([], *sides(tmp_path), max_processes=12, measure=measure, say=seen.append)
    k = calls[-1][1]
    assert code == 0 and table["verdict"].tolist() == ["PASS"] and 2 < k < 12
    assert "INCONCLUSIVE" in seen[0] and len(seen) == k - 1  # a look after each round from the second
    assert table["base_processes"].item() == k


def test_the_budget_ends_the_run_and_undecided_is_exit_3(tmp_path):
    measure, calls = fake(0.05, seed=2)
    seen: list[str] = []
    table, code = ab.run([], *sides(tmp_path), budget_s=0, measure=measure, say=seen.append)
    assert code == 3 and calls[-1][1] == 2 and "the budget ends: 1 point(s) undecided" in seen[-1]


def test_looks_are_paid_for_so_a_false_alarm_stays_at_alpha(tmp_path):
    """A/A runs of up to five looks each: a FAIL at most as often as alpha allows (none of
    ten here), each look testing at alpha / planned looks."""
    assert ab.planned_looks(2, 10) == 9
    fails = 0
    for seed in range(10):
        measure, _ = fake(0.03, seed=100 + seed)
        _, code = ab.run([], *sides(tmp_path / str(seed)), max_processes=6, gate_pct=3, measure=measure, say=print)
        fails += code == 1
    assert fails == 0


def test_a_real_a_b_writes_both_trees_in_fresh_processes(cli, work, capsys):
    out = work / "ab"
    # the docs' kind of A/B: another thread count (a machine identity field) and a key set apart
    sides = ["--base-env", "OMP_NUM_THREADS=2", "--new-env", "OMP_NUM_THREADS=1", "--new", "bench.warmup=2"]
    args = ["ab", "+experiment=quick/matmul", *FAST, *sides, "--out", str(out)]
    ran = cli(*args, "--max-processes", "2", "--format", "json", rc=None)
    assert ran.rc in (0, 1, 3), ran.err
    verdict = json.loads(ran.out)
    points = verdict["points"]
    assert points and {p["base_processes"] for p in points} == {2} and {p["new_processes"] for p in points} == {2}
    assert not {p["verdict"] for p in points} & {"INCOMPARABLE"}, "what the sides differ by is the change under test"
    for side in ("base", "new"):
        rows = results.load(out / side)
        assert sorted(set(rows["process"])) == [1, 2]
    assert cli(*args, rc=2).err.startswith("perflab ab: error: --out")  # both trees there: never mixed


@pytest.mark.parametrize(
    "bad, line",
    [
        (["--min-processes", "5", "--max-processes", "3"], "--min-processes 5: allowed: at most --max-processes"),
        (["--base-env", "NOVALUE"], "'NOVALUE': allowed: NAME=VALUE"),
        (["--budget", "-1"], "'-1': allowed: a number of minutes > 0, e.g. 5"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(work, capsys, bad, line):
    with pytest.raises(SystemExit) as usage:
        ab.main(["+experiment=quick/matmul", *bad])
    err = capsys.readouterr().err
    assert usage.value.code == 2 and line in err and len(err.strip().splitlines()) == 1
    assert not (work / "ab").exists()  # refused before anything ran
