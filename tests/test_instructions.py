"""bench.instructions: instruction counts under callgrind, refused where they cannot be counted,
and judged exactly (a tolerance, no test between processes) by compare."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from perflab import compare, results
from perflab.analysis import verdicts
from perflab.store.columns import EXACT, higher_is_better, unit_of
from perflab.store.rundir import RunWriter

from conftest import FAST

needs_valgrind = pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")


def test_a_job_that_cannot_count_is_refused_in_one_line_before_measuring(cli, monkeypatch, tmp_path):
    ran = cli("+experiment=quick/train", "bench.instructions=true", *FAST, rc=2)
    assert "bench.instructions=true: train does not say its work as source text to count" in ran.err
    assert "allowed: false (experiments that count them: matmul)" in ran.err
    assert not (tmp_path / "outputs").exists() or results.load("outputs").empty
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no valgrind on PATH
    ran = cli("+experiment=quick/matmul", "bench.instructions=true", *FAST, rc=2)
    assert "bench.instructions=true: valgrind is not installed (apt-get install valgrind)" in ran.err
    assert "allowed: false, or install valgrind" in ran.err


def test_the_instructions_column_is_an_exact_lower_is_better_count():
    assert "instructions" in EXACT and not higher_is_better("instructions")
    assert unit_of("instructions") == "instructions"


def counted(root, run, instructions, spread=0.1, process=1, size=64):
    """One matmul row with its instruction count (as bench.instructions writes it)."""
    RunWriter(root / run).add(
        {
            "run_id": run,
            "experiment": "matmul",
            "measurement": "cpu alone",
            "status": "ok",
            "n": 3,
            "median_s": 1e-3 * (1 + np.random.default_rng(process).normal(0, 0.3)),  # a noisy machine's time
            "tflops": 1e-3,
            "instructions": instructions,
            "instructions_spread_pct": spread,
            "device_name": "CPU (1 thread)",
            "num_threads": 1,
            "cpu_model": "Test CPU",
            "process": process,
            "cfg.experiment.size": size,
        },
        samples=[1e-3, 1.1e-3, 0.9e-3],
    )


def test_compare_judges_instruction_counts_against_the_tolerance_not_a_test(tmp_path, capsys):
    base, new = tmp_path / "base", tmp_path / "new"
    cases = {  # size: (base count, new count, spread within a count %)
        64: (3_904_842, 3_904_760, 0.4),  # the same code: PASS
        128: (1_000_000, 1_020_000, 0.1),  # 2 % more: FAIL, with one process a side
        256: (1_000_000, 950_000, 0.1),  # 5 % fewer: PASS
        512: (1_000_000, 1_000_000, 3.0),  # counts that vary by 3 %: not exact here
        1024: (1_000_000, 0, 0.1),  # a count of nothing: damage, never a pass
    }
    for size, (a, b, spread) in cases.items():
        counted(base, f"a{size}", a, spread, size=size)
        counted(new, f"b{size}", b, spread, size=size)
    table = compare.ab(base, new, metric="instructions").set_index("cfg.experiment.size")
    expected = {64: "PASS", 128: "FAIL", 256: "PASS", 512: "INCONCLUSIVE", 1024: "INCONCLUSIVE"}
    assert table["verdict"].to_dict() == expected
    assert table.loc[1024, "why"].startswith("no usable instructions in NEW (left out in NEW: 1 row whose instructions")
    assert table.loc[128, "why"].startswith("2 % more instructions: beyond the 1 % tolerance of an exact count")
    assert "vary by 3 %" in table.loc[512, "why"] and table.loc[64, "detectable_pct"] == verdicts.EXACT_TOLERANCE_PCT
    assert compare.main([str(base), str(new), "--metric", "instructions", "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "FAIL" and all(p["metric"] == "instructions" for p in out["points"])
    # Compared by time (the default), the trees say that their counts are there to judge.
    assert (
        "matmul: both trees count instructions: --metric instructions judges them, exactly"
        in (compare.ab(base, new).attrs["notes"])
    )


def test_instruction_counts_between_processes_count_as_their_noise(tmp_path):
    for k, (a, b) in enumerate(((1_000_000, 1_000_500), (1_000_400, 1_030_000)), 1):
        counted(tmp_path / "base", f"a{k}", a, process=k)
        counted(tmp_path / "new", f"b{k}", b, process=k)
    (row,) = compare.ab(tmp_path / "base", tmp_path / "new", metric="instructions").to_dict("records")
    assert (row["verdict"], row["base_processes"], row["new_processes"]) == ("INCONCLUSIVE", 2, 2)
    assert row["cv_between_pct"] > 1


@pytest.mark.slow
@needs_valgrind
def test_a_job_counts_its_instructions_under_callgrind(cli):
    """Real valgrind, a small matmul (4 of 64² a call): the row carries a count its repeats agree on."""
    cli("+experiment=quick/matmul", "experiment.size=64", "bench.instructions=true", *FAST)
    (row,) = results.load("outputs").to_dict("records")
    assert row["instructions"] > 1000 and row["instructions_spread_pct"] < verdicts.EXACT_TOLERANCE_PCT
    assert row["median_s"] > 0  # time beside it
