"""Verdicts you can trust: four of them and never a silent pass, multiplicity control, machine
identity in every row, the code under test, flags without holes, exports for dashboards."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perflab import compare, history, results
from perflab.analysis import floor, replicates, stats, verdicts
from perflab.measure.instruments.gpu import throttle_words
from perflab.measure.instruments.machine import Machine, busy_reason
from perflab.measure.peaks import Peaks
from perflab.store.rundir import RunWriter

from conftest import FAST, requires_cuda, run_subprocess

ONE_THREAD = {"device_name": "CPU (1 thread)", "num_threads": 1}


def point(root, run, times, *, size=256, measurement="cpu alone", **columns):
    """One matmul row with its raw sample times, as a job writes it (numbers chosen by hand)."""
    median = float(np.median(times))
    RunWriter(root / run).add(
        {
            "run_id": run,
            "experiment": "matmul",
            "measurement": measurement,
            "status": "ok",
            "n": len(times),
            "median_s": median,
            "tflops": 2 * size**3 / median / 1e12,
            "device_name": "CPU (2 threads)",
            "num_threads": 2,
            "cpu_model": "Test CPU",
            "cfg.experiment.size": size,
            **columns,
        },
        samples=list(times),
    )


def noisy(rng, median, n, spread=0.01):
    return median * (1 + rng.normal(0, spread, n))


@pytest.fixture
def quiet(monkeypatch):
    """A quiet machine: 2 % between processes assumed where the trees measured none (a verdict's
    floor comes from the trees or --process-cv; the default, 10 %, would leave these undecided)."""
    monkeypatch.setattr(floor, "ASSUMED", floor.Floor(0.02, "assumed: a quiet machine's (the test's)"))


def test_two_threads_against_one_is_incomparable_not_a_pass(tmp_path, capsys):
    rng = np.random.default_rng(0)
    point(tmp_path / "base", "a", noisy(rng, 1.0, 20))
    point(tmp_path / "new", "b", noisy(rng, 2.0, 20), **ONE_THREAD)  # half the threads: half the speed
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new"), "--fail-if-slower", "10"]) == 3
    out = capsys.readouterr()
    assert "INCOMPARABLE" in out.out and "machine identity differs: num_threads: 2 vs 1" in out.out
    assert "1 point in both trees: 1 INCOMPARABLE -> exit 3" in out.err
    # On purpose, across identities: judged, and said so.
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new"), "--allow-mixed", "--format", "json"]) == 1
    (p,) = json.loads(capsys.readouterr().out)["points"]
    assert p["verdict"] == "FAIL" and "compared across identities on purpose" in p["why"]


def test_one_process_a_side_is_judged_against_the_floor_and_advice_is_in_processes(tmp_path, capsys):
    rng = np.random.default_rng(1)
    point(tmp_path / "base", "a", noisy(rng, 1.0, 30, 0.02))
    point(tmp_path / "new", "b", noisy(rng, 1.0, 30, 0.02))
    # 30 samples a side, 2 % apart by chance within a process, say nothing of the code: no p from them
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new"), "--fail-if-slower", "1"]) == 3
    (row,) = compare.ab(tmp_path / "base", tmp_path / "new", gate_pct=1, process_cv=0.02).to_dict("records")
    assert (row["verdict"], row["base_processes"], row["new_processes"]) == ("INCONCLUSIVE", 1, 1)
    assert "no affordable number of processes shows a change of 1 %" in row["why"]  # bounded, never 1296
    assert "between-process variation is unknown, judged against a floor of 2 % (--process-cv" in row["why"]
    (row,) = compare.ab(tmp_path / "base", tmp_path / "new", gate_pct=4, process_cv=0.02).to_dict("records")
    need = int(row["why"].split("about ")[1].split(" a side")[0])
    assert row["verdict"] == "INCONCLUSIVE" and f"(bench.processes={need}, or perflab ab)" in row["why"]
    # ... and that many processes of the floor's spread would detect a 4 % change.
    assert (
        replicates.detectable(need, need, 0.02, 2 * need - 2)
        <= 4
        < replicates.detectable(need - 1, need - 1, 0.02, 2 * need - 4)
    )
    assert "PASS means: not significantly slower by more than 1 %" in capsys.readouterr().out


@pytest.mark.usefixtures("quiet")
def test_one_busy_process_a_side_is_not_judged_against_the_floor_alone(tmp_path):
    """Samples 30 % wide: the median of one such process moves by more than 2 % on its own, so a
    15 % difference between two of them is no FAIL, while between quiet processes it is."""
    rng = np.random.default_rng(14)
    for size, spread in ((64, 0.30), (128, 0.005)):
        point(tmp_path / "base", f"a{size}", noisy(rng, 1.0, 10, spread), size=size)
        point(tmp_path / "new", f"b{size}", noisy(rng, 1.15, 10, spread), size=size)
    table = compare.ab(tmp_path / "base", tmp_path / "new").set_index("cfg.experiment.size")
    assert table["verdict"].to_dict() == {64: "INCONCLUSIVE", 128: "FAIL"}
    assert "what the samples' own spread makes a median vary by" in table.loc[64, "why"]


def processes(root, name, medians, n=20, spread=0.01, rng=None, **columns):
    """One run (process) per median: its samples around it, ``process`` 1..K."""
    rng = rng or np.random.default_rng(0)
    for k, median in enumerate(medians, 1):
        point(root, f"{name}{k}", noisy(rng, median, n, spread), process=k, **columns)


def test_one_process_a_side_is_judged_against_what_the_trees_measured_the_same_each_time(tmp_path, own_cache):
    """A/A on a VM whose processes differ by 15 %: one process a side 15 % apart is no FAIL (a 2 %
    floor false-FAILed half of such pairs) once the trees' own points of three processes a side
    measured that spread; the same compare gives the same verdict whatever ran in between (a floor
    pooled in ~/.cache over every ab of the machine gave FAIL, then INCONCLUSIVE)."""
    rng = np.random.default_rng(21)
    for side, median in {"base": 1.0, "new": 1.16}.items():  # one process a side, 15 % apart (log)
        point(tmp_path / "one" / side, side, noisy(rng, median, 30))
    one = [str(tmp_path / "one" / "base"), str(tmp_path / "one" / "new")]
    # Nothing measured there: the default floor (10 %), said; never the 2 % that made these pairs FAIL.
    (row,) = compare.ab(*one).to_dict("records")
    assert row["verdict"] != "FAIL" and "floor of 10 % (assumed: no point of these trees measured it" in row["why"]
    assert compare.ab(*one, process_cv=0.02)["verdict"].tolist() == ["FAIL"]  # what a 2 % floor said
    # The same trees with a point of three processes a side, 15 % between them: its spread is the floor.
    logs = np.array([0.15, -0.15, 0.0])
    for side, name, shift in (("base", "a", logs), ("new", "b", logs[::-1] + 0.01)):
        processes(tmp_path / "one" / side, name, np.exp(shift), rng=rng, size=128)
    first = compare.ab(*one).set_index("cfg.experiment.size")
    assert first.loc[256, "verdict"] == "INCONCLUSIVE" and first.loc[128, "verdict"] == "INCONCLUSIVE"
    assert "floor of 15 % (measured in these trees: 1 point of the experiment" in first.loc[256, "why"]
    # Other comparisons in between (of other trees) change nothing, and write nothing.
    processes(tmp_path / "k" / "base", "x", [1.0, 1.01, 0.99], rng=rng)
    processes(tmp_path / "k" / "new", "y", [1.0, 1.01, 0.99], rng=rng)
    assert compare.main([str(tmp_path / "k" / "base"), str(tmp_path / "k" / "new")]) in (0, 3)
    again = compare.ab(*one).set_index("cfg.experiment.size")
    pd.testing.assert_frame_equal(first, again)
    assert not any(own_cache.rglob("*"))  # no cache: nothing a verdict could read later


def test_significance_and_detectability_come_from_the_variation_between_processes(tmp_path):
    rng = np.random.default_rng(11)
    between = rng.normal(0, 0.01, 12)  # 1 % between processes; each process's samples 3 % wide
    processes(tmp_path / "base", "a", 1.0 + between[:6], spread=0.03, rng=rng, size=64)
    processes(tmp_path / "new", "b", 1.03 * (1.0 + between[6:]), spread=0.03, rng=rng, size=64)  # 3 % slower
    processes(tmp_path / "base", "c", [1.0], spread=0.001, rng=rng, size=128)  # one quiet process a side,
    processes(tmp_path / "new", "d", [1.01], spread=0.001, rng=rng, size=128)  # 1 % apart: no p from its samples
    table = compare.ab(tmp_path / "base", tmp_path / "new", gate_pct=10).set_index("cfg.experiment.size")
    six = table.loc[64]
    assert (six["base_processes"], six["new_processes"]) == (6, 6) and six["verdict"] == "PASS"
    assert six["significant"] and "1.03x slower" in six["why"] and 0.5 < six["cv_between_pct"] < 2
    assert six["ci_low"] < 1 / 1.03 < six["ci_high"] < 1  # the interval holds the change
    assert six["detectable_pct"] < 5
    one = table.loc[128]
    assert not one["significant"] and one["p_value"] > 0.5 and math.isnan(one["cv_between_pct"])


@pytest.mark.usefixtures("quiet")
def test_a_reason_every_point_shares_is_said_once(tmp_path, capsys):
    rng = np.random.default_rng(12)
    for size in (64, 128, 256):
        point(tmp_path / "base", f"a{size}", noisy(rng, 1.0, 20), size=size)
        point(tmp_path / "new", f"b{size}", noisy(rng, 1.0, 20), size=size)
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["verdict"] for p in out["points"]] == ["PASS"] * 3
    assert not any("floor" in p["why"] for p in out["points"])
    assert sum("floor of 2 %" in n for n in out["notes"]) == 1


def test_words_p_and_interval_agree_on_noisy_samples_at_both_levels():
    """The bug: 'significant: 1.51x slower than the baseline (p=1.6e-07, 95% CI of the speedup
    0.431-1.39)': a p-value from one test and an interval from another. Each level now has one
    model: on a thousand noisy pairs (ties too), significance and an interval without 1 go together."""
    rng = np.random.default_rng(13)
    for k in range(1000):
        m, n = rng.integers(3, 40, 2)
        a = np.exp(rng.normal(0, rng.uniform(0.01, 0.8), m))
        b = np.exp(rng.normal(rng.normal(0, 0.2), rng.uniform(0.01, 0.8), n))
        a, b = (np.round(a, 1), np.round(b, 1)) if k % 3 == 0 else (a, b)
        d = stats.compare_samples(a, b, higher_is_better=bool(k % 2))
        assert d.significant == (not d.ci_low <= 1 <= d.ci_high) == d.words.startswith("significant")
        assert d.ci_low <= d.speedup <= d.ci_high
        figures = [replicates.Measured(pd.DataFrame(), 1.0, np.array([]), [], [], x[:4]) for x in (a, b)]
        c = replicates.change(*figures)
        assert (c.p_value < 0.05) == (not c.ci_low <= 1 <= c.ci_high)
    loose = [
        replicates.Measured(pd.DataFrame(), 1.0, np.array([]), [], [], x) for x in ([0.9, 1.1, 1.0], [1.0, 1.2, 0.95])
    ]
    tight = [
        replicates.Measured(pd.DataFrame(), 1.0, np.array([]), [], [], x)
        for x in ([1.0, 1.001, 0.999], [1.0, 1.001, 1.0])
    ]
    assert np.ptp([replicates.change(*loose).ci_low, replicates.change(*loose).ci_high]) > 10 * np.ptp(
        [replicates.change(*tight).ci_low, replicates.change(*tight).ci_high]
    )


def test_every_points_change_at_once_is_each_points_own():
    """verdicts.judge takes every point's change in one ``changes`` call, numpy over all their
    arrays: each is the change of that point alone (1 to 12 processes a side, a damaged figure,
    processes of too few samples, pairs), by the model's statistics: the ratio of the sides'
    geometric means, their pooled log spread, the median of the processes' log IQR / 1.349."""
    rng = np.random.default_rng(7)

    def side(k: int) -> replicates.Measured:
        figures = rng.lognormal(0, 0.05, k)
        figures[: int(k > 1 and rng.random() < 0.2)] = np.nan  # left out of the figures, as damage
        processes = [rng.lognormal(0, 0.1, int(rng.choice([2, 3, 9, 100]))) for _ in range(k)]
        ids = [str(i) for i in range(k)]
        return replicates.Measured(pd.DataFrame(), 1.0, np.array([]), [], processes, figures, ids)

    for paired in (False, True):
        sides = [(side(int(rng.integers(1, 13))), side(int(rng.integers(1, 13)))) for _ in range(300)]
        floors = rng.choice([0.02, 0.1], len(sides)).tolist()
        together = replicates.changes(sides, level=0.001, floors=floors, paired=paired)
        assert sum(c.paired for c in together) > 200 if paired else not any(c.paired for c in together)
        for (base, new), cv, c in zip(sides, floors, together):
            alone = replicates.change(base, new, level=0.001, floor=cv, paired=paired)
            assert repr(c) == repr(alone)  # every field, NaN as NaN
            logs = [x.processes for x in (base, new)]
            within = [np.subtract(*np.percentile(np.log(p), [75, 25])) / 1.349 for s in logs for p in s if len(p) >= 3]
            np.testing.assert_equal(c.spread.within, float(np.median(within)) if within else math.nan)  # NaN: none of 3
            if paired:
                continue
            a, b = (np.log(x.figures[np.isfinite(x.figures)]) for x in (base, new))
            assert c.ratio == math.exp(b.mean() - a.mean())
            df = len(a) + len(b) - 2
            if df >= 1:
                pooled = math.sqrt(float(((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()) / df)
                assert c.spread.measured and (c.spread.between, c.spread.df) == (pooled, df)
            else:
                assert not c.spread.measured and c.spread.between >= cv


def test_the_smallest_attainable_p_and_the_repeats_a_change_needs():
    assert stats.smallest_p(3, 3) == pytest.approx(0.1) and stats.smallest_p(4, 4) == pytest.approx(2 / 70)
    rng = np.random.default_rng(2)
    wide, narrow = noisy(rng, 1.0, 30, 0.10), noisy(rng, 1.0, 30, 0.01)
    assert stats.repeats_needed(wide, wide, 2) > 20 * stats.repeats_needed(narrow, narrow, 2)
    assert stats.repeats_needed(narrow, narrow, 50) == 4  # at least what can be significant: 0.1 > 0.05 at 3
    assert math.isinf(stats.repeats_needed(narrow, narrow, 0))


def test_one_tree_of_two_subjects_gives_a_line_per_subject_never_pooled(tmp_path):
    rng = np.random.default_rng(22)
    point(tmp_path, "a", noisy(rng, 1.0, 10), subject="c0ffee1")
    point(tmp_path, "b", noisy(rng, 2.0, 10), subject="c0ffee2")  # the next commit: twice as slow
    table = compare.compare(tmp_path).set_index("subject")
    assert sorted(table.index) == ["c0ffee1", "c0ffee2"] and (table["runs"] == 1).all()
    assert table.loc["c0ffee2", "tflops"] < table.loc["c0ffee1", "tflops"] / 1.5


@pytest.mark.usefixtures("quiet")
def test_pass_fail_and_a_small_real_change_within_the_gate(tmp_path):
    rng = np.random.default_rng(3)
    for size, slower in ((64, 1.0), (128, 1.03), (256, 1.5)):  # unchanged, 3 % slower, 50 % slower
        point(tmp_path / "base", f"a{size}", noisy(rng, 1.0, 30), size=size)
        point(tmp_path / "new", f"b{size}", noisy(rng, slower, 30), size=size)
    table = compare.ab(tmp_path / "base", tmp_path / "new", gate_pct=10).set_index("cfg.experiment.size")
    assert table["verdict"].to_dict() == {64: "PASS", 128: "PASS", 256: "FAIL"}
    assert not table.loc[128, "significant"]  # real, but one process a side cannot show 3 %
    assert compare.verdict_of(table.reset_index()) == 1


@pytest.mark.usefixtures("quiet")
def test_forty_unchanged_points_give_no_significant_one(tmp_path):
    """Without multiplicity control about two of 40 unchanged points come out 'significant'."""
    rng = np.random.default_rng(4)
    for size in range(1, 41):
        point(tmp_path / "base", f"a{size}", noisy(rng, 1.0, 8, 0.05), size=size)
        point(tmp_path / "new", f"b{size}", noisy(rng, 1.0, 8, 0.05), size=size)
    table = compare.ab(tmp_path / "base", tmp_path / "new")
    assert (table["p_value"] < 0.05).sum() >= 1, "the raw tests do find 'significant' noise"
    assert not table["significant"].any() and "FAIL" not in set(table["verdict"])


@pytest.mark.usefixtures("quiet")
def test_points_in_one_tree_only_are_listed_and_a_lost_one_is_not_a_pass(tmp_path, capsys):
    rng = np.random.default_rng(5)
    base, new = tmp_path / "base", tmp_path / "new"
    point(base, "a", noisy(rng, 1.0, 30))
    point(new, "b", noisy(rng, 1.0, 30))
    point(base, "c", noisy(rng, 1.0, 30), measurement="crashed in new")
    point(new, "d", noisy(rng, 1.0, 30), measurement="new in new")
    assert compare.main([str(base), str(new)]) == 3
    err = capsys.readouterr().err
    assert "1 PASS; 1 only in base (not judged: no ok row of it in NEW); 1 only in new" in err
    assert compare.main([str(base), str(new), "--where", "measurement=cpu alone"]) == 0
    capsys.readouterr()
    # Nothing in both trees: could not judge.
    point(tmp_path / "gpu", "e", noisy(rng, 1.0, 30), device_name="NVIDIA H100 80GB HBM3")
    assert compare.main([str(base), str(tmp_path / "gpu")]) == 3
    assert "no point is in both trees" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:
        compare.main([str(base), str(new), "--alpha", "2"])
    assert usage.value.code == verdicts.USAGE_EXIT


@pytest.mark.usefixtures("quiet")
def test_json_and_github_action_benchmark_formats(tmp_path, capsys):
    rng = np.random.default_rng(6)
    point(tmp_path / "base", "a", noisy(rng, 1.0, 30))
    point(tmp_path / "new", "b", noisy(rng, 1.0, 30))
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["verdict"], out["exit_code"], out["gate_pct"], out["gate_given"]) == ("PASS", 0, 10.0, False)
    assert out["points"][0]["verdict"] == "PASS" and out["only_in_base"] == []
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new"), "--format", "github"]) == 0
    shaped = json.loads(capsys.readouterr().out)
    (entry,) = shaped["customBiggerIsBetter"]  # TFLOP/s: bigger is better
    assert shaped["customSmallerIsBetter"] == []
    assert set(entry) == {"name", "unit", "value", "range", "verdict", "extra"} and entry["unit"] == "TFLOP/s"
    assert entry["name"] == "matmul / cpu alone / experiment.size=256 / CPU" and entry["verdict"] == "PASS"
    assert entry["extra"].startswith("PASS")


def test_rows_carry_the_machine_identity_and_the_code_under_test(cli, work):
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    (work / "model.py").write_text("WORK = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "model.py"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=work, check=True)
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=work, text=True, capture_output=True).stdout
    cli("+experiment=quick/matmul", *FAST, "results.table=false")
    (work / "model.py").write_text("WORK = 2\n")  # an edit not committed: the subject says so
    cli("+experiment=quick/matmul", *FAST, "results.table=false")
    cli("+experiment=quick/matmul", *FAST, "results.table=false", "results.subject=v2.1")
    df = results.load("outputs").sort_values("timestamp")
    assert df["subject"].tolist() == [sha.strip(), sha.strip() + "+dirty", "v2.1"]
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    assert set(df["cpu_model"]) == {model}  # as the kernel reports it
    for column in ("cpu_physical_cores", "cpu_logical_cores", "num_threads", "memory_gb", "kernel", "torch", "mkl"):
        assert df[column].notna().all(), column
    records = [json.loads(p.read_text()) for p in sorted((work / "outputs" / "runs").glob("*/run.json"))]
    assert sorted(r["subject"] for r in records) == sorted(df["subject"]) and records[0]["perflab_version"]


@pytest.mark.slow
def test_a_gate_across_thread_counts_does_not_exit_0_for_real(tmp_path):
    """The issue's case as a CI user meets it: the base with 2 threads, the new run with
    OMP_NUM_THREADS=1, gated at 10 %: never exit 0."""
    args = ["+experiment=quick/matmul", "bench.repeats=10", "results.table=false"]
    run_subprocess(*args, "results.store=base", cwd=tmp_path)
    run_subprocess(*args, "results.store=new", cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    gate = subprocess.run(
        [sys.executable, "-m", "perflab.compare", "base", "new", "--fail-if-slower", "10"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert gate.returncode == 3 and "num_threads: 2 vs 1" in gate.stdout, gate.stdout + gate.stderr


def test_a_short_measurement_among_busy_processes_says_so(tmp_path):
    import torch

    a = torch.randn(256, 256)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)  # let them start spinning
        with Machine() as busy:
            for _ in range(100):
                a @ a
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert "of their runnable time waiting for a CPU" in busy_reason(busy.columns(), 0.25), busy.columns()
    assert busy.columns()["waited_pct"] > 25


def test_a_peak_above_100_percent_or_from_a_smaller_run_is_not_trusted(cli, work):
    host = socket.gethostname()
    device = "CPU (2 threads)" if __import__("torch").get_num_threads() == 2 else None
    if device is None:
        pytest.skip("the device description depends on the thread count")
    peaks = work / "peaks.json"
    peaks.write_text(json.dumps({host: {device: {"matmul_float32": 1e-6}}}))  # a "peak" no job stays under
    cli("+experiment=quick/matmul", *FAST, "results.table=false", f"results.peaks={peaks}", "results.store=old")
    row = results.load("old").iloc[0]
    assert row["pct_of_peak"] > 100 and "above 100 %, so that peak (results.peaks) was no peak" in row["suspect"]
    # A peak measured at 16x16 is no peak for 256x256 matmuls: not taken, and the row says why.
    Peaks(peaks, {}).save(device, {"matmul_float32": 1e-6, "matmul_float32_n": 16})
    cli("+experiment=quick/matmul", *FAST, "results.table=false", f"results.peaks={peaks}", "results.store=sized")
    row = results.load("sized").iloc[0]
    assert pd.isna(row.get("pct_of_peak")) and "comes from a 16x16 matmul" in row["peak_not_taken"]
    # A smaller run does not replace a larger run's peak.
    Peaks(peaks, {}).save(device, {"matmul_float32": 5.0, "matmul_float32_n": 1024})
    Peaks(peaks, {}).save(device, {"matmul_float32": 0.1, "matmul_float32_n": 256})
    assert Peaks.open(peaks, will_write=False).lookup(device, "matmul_float32") == 5.0


def test_throttle_reasons_in_words():
    assert throttle_words(0) == "none" and throttle_words(0x1) == "none"  # idle is no throttle
    assert throttle_words(0x4 | 0x40) == "software power cap, hardware thermal slowdown"


def test_parquet_export_holds_the_current_rows_only(tmp_path, capsys):
    tree = tmp_path / "outputs"
    RunWriter(tree / "runs" / "r0").add(
        {"run_id": "r0", "experiment": "matmul", "measurement": "z", "status": "ok", "median_s": 1.0}
    )
    run = tree / "runs" / "r1"
    writer = RunWriter(run)
    writer.add({"run_id": "r1", "experiment": "matmul", "measurement": "a", "status": "ok", "median_s": 1.0})
    assert len(results.load(tree)) == 2  # indexed now
    time.sleep(0.01)
    writer.add({"run_id": "r1", "experiment": "matmul", "measurement": "b", "status": "ok", "median_s": 2.0})
    assert len(results.load(tree)) == 3  # a second segment; the first one's row of r1 is superseded (r0's is not)
    assert len(list((tree / ".perflab" / "index").glob("*.parquet"))) == 2
    out = tmp_path / "all.parquet"
    assert results.main(["export", str(out), str(tree), "--parquet"]) == 0
    df = pd.read_parquet(out)
    assert sorted(df["row_id"]) == ["r0#1", "r1#1", "r1#2"] and sorted(df["measurement"]) == ["a", "b", "z"]
    assert results.main(["export", str(out), str(tree), "--parquet"]) == 0  # an earlier export: replaced
    foreign = tmp_path / "mine.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(foreign)
    assert results.main(["export", str(foreign), str(tree), "--parquet"]) == 2
    assert "exists and is not a file perflab wrote" in capsys.readouterr().err


def test_subjects_follow_commit_order_where_git_can_tell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], check=True)
    shas = []
    for i in range(3):
        Path("f").write_text(str(i))
        subprocess.run(["git", "add", "f"], check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", str(i)], check=True)
        shas.append(subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout)
    shas = [s.strip() for s in shas]
    measured = [shas[2], shas[0], shas[1]]  # measured out of order (a bisect, say)
    order = history.subject_order(measured, [f"2026-01-01T00:00:0{i}" for i in range(3)])
    assert [measured[i] for i in order] == shas


@pytest.mark.gpu
@requires_cuda
def test_gpu_rows_carry_clocks_temperature_power_and_throttle_reasons(cli, work):
    pytest.importorskip("pynvml", reason="needs nvidia-ml-py (perflab[gpu])")
    cli("+experiment=quick/matmul", "devices.spec=cuda", *FAST, "results.table=false")
    row = results.load("outputs").iloc[0]
    assert row["gpu_sm_clock_mhz"] > 0 and row["gpu_temp_c"] > 0 and row["gpu_power_w"] > 0
    assert isinstance(row["gpu_throttle"], str) and row["gpu_model"] and row["cudnn"] and row["cuda_driver"]


def test_a_significant_improvement_passes_even_where_a_slowdown_would_not_show(tmp_path):
    rng = np.random.default_rng(7)
    point(tmp_path / "base", "a", noisy(rng, 3.0, 12, 0.3))  # 10 % between processes: a 10 % slowdown would not show
    point(tmp_path / "new", "b", noisy(rng, 1.0, 12, 0.3))  # but 3x faster does
    (row,) = compare.ab(tmp_path / "base", tmp_path / "new", process_cv=0.10).to_dict("records")
    assert row["detectable_pct"] > 10 and row["verdict"] == "PASS" and "faster, significantly" in row["why"]


# --- damaged values, crashes and what a CI log reads -------------------------------------------


def _edit(run_dir, **cells):
    """Overwrite cells of a run's results.csv as text (a hand edit, a damaged copy)."""
    table = pd.read_csv(run_dir / "results.csv", dtype=str, keep_default_na=False)
    for column, value in cells.items():
        table[column] = value
    table.to_csv(run_dir / "results.csv", index=False)


@pytest.mark.usefixtures("quiet")
def test_unusable_values_are_left_out_said_and_a_point_with_none_is_inconclusive(tmp_path, capsys):
    rng = np.random.default_rng(7)
    point(tmp_path / "base", "a", noisy(rng, 1.0, 30))
    damaged = {
        "nan_samples": lambda d: point(d, "n", [math.nan] * 30),  # samples.csv seconds empty
        "text_metric": lambda d: (point(d, "t", noisy(rng, 1.0, 30)), _edit(d / "t", tflops="abc")),
        "negative_time": lambda d: (point(d, "m", noisy(rng, 1.0, 30)), _edit(d / "m", median_s="-1")),
    }
    for name, make in damaged.items():
        make(tmp_path / name)
        assert compare.main([str(tmp_path / "base"), str(tmp_path / name)]) == 3, name
        out, err = capsys.readouterr()
        assert "INCONCLUSIVE" in out and "note: matmul / cpu alone / experiment.size=256 / CPU: left out in NEW" in out
        assert "Traceback" not in err and err.strip().endswith("1 point in both trees: 1 INCONCLUSIVE -> exit 3")
    (row,) = compare.ab(tmp_path / "base", tmp_path / "text_metric").to_dict("records")
    assert row["why"].startswith("no usable tflops in NEW (left out in NEW: 1 row whose tflops is NaN, not a number")
    # A few bad samples among good ones: left out and said, the rest judged.
    point(tmp_path / "some", "s", noisy(rng, 1.0, 30))
    with open(tmp_path / "some" / "s" / "samples.csv", "a") as f:
        f.write("s#1,s,matmul,cpu alone,sample,30,nan\ns#1,s,matmul,cpu alone,sample,31,-1\n")
    (row,) = compare.ab(tmp_path / "base", tmp_path / "some").to_dict("records")
    assert row["verdict"] == "PASS" and row["left_out"].startswith("in NEW: 2 samples that give no positive tflops")
    # The statistics themselves never crash on such values.
    bad = np.array([math.nan, -1.0, 0.0, math.inf])
    assert math.isinf(stats.repeats_needed(bad, bad, 10))
    assert math.isnan(stats.compare_samples(bad, [1.0, 2.0, 3.0], higher_is_better=False).p_value)


def test_a_crash_is_one_line_and_exit_3_never_the_1_of_a_fail(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(8)
    point(tmp_path / "base", "a", noisy(rng, 1.0, 10))
    point(tmp_path / "new", "b", noisy(rng, 1.0, 10))

    def broken(*args, **kwargs):
        raise ValueError("cannot convert float NaN\nto integer")

    monkeypatch.setattr(verdicts, "judge", broken)  # damage no reader foresaw: a bug in the judging
    monkeypatch.delenv(verdicts.DEBUG_ENV, raising=False)
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new")]) == verdicts.UNJUDGED_EXIT
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "perflab compare: could not judge: ValueError: cannot convert float NaN to integer; "
        "PERFLAB_DEBUG=1 shows the traceback -> exit 3"
    ]
    monkeypatch.setenv(verdicts.DEBUG_ENV, "1")
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new")]) == 3
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_json_holds_valid_numbers_only_and_each_outcome_ends_with_its_exit_line(tmp_path, capsys):
    rng = np.random.default_rng(9)
    point(tmp_path / "base", "a", noisy(rng, 1.0, 3))
    point(tmp_path / "new", "b", noisy(rng, 1.0, 3))
    gate = ["--format", "json", "--fail-if-slower", "1"]
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new"), *gate]) == 3
    text, err = capsys.readouterr()

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    out = json.loads(text, parse_constant=refuse)
    (p,) = out["points"]
    assert out["verdict"] == "INCONCLUSIVE" and p["verdict"] == "INCONCLUSIVE"  # one of the four
    assert (p["base_processes"], p["new_processes"]) == (1, 1) and "cv_between_pct" not in p  # unknown: absent
    assert err.strip().endswith("-> exit 3")
    point(tmp_path / "other", "c", noisy(rng, 1.0, 3), size=64)  # no point in both trees
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "other")]) == 3
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith(
            "0 points in both trees; 1 only in base (not judged: no ok row of it in NEW); 1 only in new -> exit 3"
        )
    )


def test_lines_start_with_the_command_as_typed(cli, work):
    assert cli("compare", str(work / "nowhere"), rc=2).err.startswith("perflab compare: error: ")
    assert cli("results", str(work / "nowhere"), rc=2).err.startswith("perflab results: error: ")


def test_only_a_time_or_a_rate_must_be_positive_an_accuracy_of_0_is_a_value():
    rows = pd.DataFrame({"row_id": ["a", "b"], "test_acc": [0.0, 0.5], "median_s": [0.0, 1.0]})
    assert compare.measured(rows, "test_acc", {}).value == 0.25 and not compare.measured(rows, "test_acc", {}).left_out
    timed = compare.measured(rows, "median_s", {})
    assert timed.value == 1.0 and timed.left_out == ["1 row whose median_s is NaN, not a number or <= 0"]


def test_an_a_a_whose_interval_lies_within_the_gate_ends_pass(tmp_path):
    """Six processes a side 6 % apart between them, the same on both sides: a 10 % change is not
    yet detectable at alpha (power 0.8), but the interval at that level excludes a slowdown
    beyond 10 %: equivalent within the gate, PASS, and the why says how slow at most."""
    rng = np.random.default_rng(5)
    logs = 0.85 * np.array([0.06, -0.06, 0.03, -0.03, 0.09, -0.09])  # 6 % between processes
    processes(tmp_path / "base", "a", np.exp(logs), rng=rng)
    processes(tmp_path / "new", "b", np.exp(logs[::-1]), rng=rng)
    (row,) = compare.ab(tmp_path / "base", tmp_path / "new", gate_pct=10).to_dict("records")
    assert row["detectable_pct"] > 10 and row["verdict"] == "PASS", row["why"]
    assert "slower at this level: within the 10 % gate" in row["why"]
    # The same spread 12 % apart: its interval reaches beyond the gate, never a PASS.
    processes(tmp_path / "slow", "c", 1.12 * np.exp(logs[::-1]), rng=rng)
    (row,) = compare.ab(tmp_path / "base", tmp_path / "slow", gate_pct=10).to_dict("records")
    assert row["verdict"] != "PASS"


def test_the_gate_reads_slower_as_time_over_the_bases(tmp_path):
    """A 10 % gate fails a point 10.5 % slower (its time 1.105x the base's), as asv's factor 1.1
    and the equivalence rule read it; read as a speedup above 0.9 it had passed (1.11x needed)."""
    rng = np.random.default_rng(7)
    medians = np.array([1.0, 1.002, 0.998, 1.001, 0.999, 1.0])
    processes(tmp_path / "base", "a", medians, spread=0.001, rng=rng)
    processes(tmp_path / "new", "b", 1.105 * medians, spread=0.001, rng=rng)
    (row,) = compare.ab(tmp_path / "base", tmp_path / "new", gate_pct=10).to_dict("records")
    assert 1.1 < 1 / row["speedup"] < 1.11
    assert row["verdict"] == "FAIL" and "slower: beyond the 10 % gate" in row["why"], row["why"]
    (row,) = compare.ab(tmp_path / "base", tmp_path / "new", gate_pct=11).to_dict("records")
    assert row["verdict"] == "PASS", row["why"]


def test_ab_sides_differ_only_in_the_identity_fields_their_difference_explains(tmp_path):
    """perflab ab's sides under another OMP_NUM_THREADS differ in num_threads on purpose: said,
    judged; a CPU model that differs too is still INCOMPARABLE (it had turned every check off)."""
    from perflab import ab

    base, new = ab.Side("base", tmp_path / "b", env={"OMP_NUM_THREADS": "2"}), ab.Side("new", tmp_path / "n")
    assert base.explains(new) == {"num_threads"}
    assert ab.Side("a", tmp_path, python="venv/bin/python").explains(new) >= {"torch", "mkl"}
    assert not ab.Side("a", tmp_path).explains(new)
    from perflab.measure.environment import IDENTITY

    assert {*ab.BY_ENVIRONMENT, *ab.BY_INTERPRETER} <= set(IDENTITY), "fields a renamed identity would drop"
    threads = ab.Side("a", tmp_path, overrides=["devices.threads=4"])
    assert threads.explains(ab.Side("b", tmp_path, overrides=["devices.threads=1"])) == {"num_threads"}
    assert not threads.explains(ab.Side("b", tmp_path, overrides=["devices.threads=4", "bench.repeats=3"]))
    rng = np.random.default_rng(6)
    processes(tmp_path / "b", "a", [1.0, 1.01, 0.99], rng=rng)
    processes(tmp_path / "n", "b", [1.0, 1.01, 0.99], rng=rng, **ONE_THREAD)
    processes(tmp_path / "other", "c", [1.0, 1.01, 0.99], rng=rng, cpu_model="Other CPU", **ONE_THREAD)
    table = compare.ab(tmp_path / "b", tmp_path / "n", explained=base.explains(new))
    assert table["verdict"].tolist() != ["INCOMPARABLE"] and not table["identity"].item()
    assert any("differ on purpose in num_threads: 2 vs 1" in n for n in table.attrs["notes"])
    table = compare.ab(tmp_path / "b", tmp_path / "other", explained=base.explains(new))
    assert table["verdict"].tolist() == ["INCOMPARABLE"] and "cpu_model" in table["identity"].item()
    assert "num_threads" not in table["identity"].item()


def test_a_change_no_number_of_processes_could_show_is_infinite_not_an_overflow():
    """One degree of freedom and a tiny level (a Bonferroni share of thousands of points): the
    quantile is huge and exp of it past floats; detectable says inf, as for no processes."""
    assert replicates.detectable(2, 2, 0.05, 1, level=0.05 / 3000) == math.inf
    assert replicates.detectable(2, 2, 0.05, 1) < math.inf
