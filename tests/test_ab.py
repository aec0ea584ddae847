"""perflab ab: processes alternate A B A B, a point undecided gets more of them until decided or
the budget ends, looks on a sparse schedule are paid for (Bonferroni over them), both trees are
written."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pandas as pd
import pytest

from perflab import ab, results
from perflab.analysis import verdicts
from perflab.analysis.comparison import CompareError, MetricError
from perflab.analysis.replicates import Measured
from perflab.analysis.stats import ALPHA
from perflab.store.rundir import RunWriter

from conftest import FAST, timed_row


def fake(between: float, slower: float = 1.0, seed: int = 0, identity: dict[str, dict[str, object]] | None = None):
    """A measure function that writes one matmul row per (side, process), the processes'
    medians spread ``between`` apart, NEW ``slower`` times slower, each side's rows with its
    ``identity`` columns (by side name); and the order of calls."""
    rng = np.random.default_rng(seed)
    calls: list[tuple[str, int]] = []

    def measure(side: ab.Side, k: int) -> int:
        calls.append((side.name, k))
        median = (slower if side.name == "new" else 1.0) * (1 + rng.normal(0, between))
        times = median * (1 + rng.normal(0, 0.002, 20))
        run = f"{side.name}{k}"
        RunWriter(side.tree / run).add(
            timed_row(
                times,
                run_id=run,
                experiment="matmul",
                measurement="cpu alone",
                process=k,
                tflops=1e-3 / float(np.median(times)),
                device_name="CPU (1 thread)",
                **{"cfg.experiment.size": 64, **(identity or {}).get(side.name, {})},
            ),
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
    table, code = ab.run([], *sides(tmp_path), measure=measure, say=seen.append)
    k = calls[-1][1]
    looks = ab.schedule(2, ab.MAX_PROCESSES)
    assert code == 0 and table["verdict"].tolist() == ["PASS"] and 2 < k < ab.MAX_PROCESSES  # decided: stops early
    assert "INCONCLUSIVE" in seen[0] and k in looks and len(seen) == looks.index(k) + 1  # a look on the schedule only
    assert table["base_processes"].item() == k


def test_the_budget_ends_the_run_and_undecided_is_exit_3(tmp_path):
    measure, calls = fake(0.05, seed=2)
    seen: list[str] = []
    table, code = ab.run([], *sides(tmp_path), budget_s=0, measure=measure, say=seen.append)
    assert code == 3 and calls[-1][1] == 2 and "the budget ends: 1 point(s) undecided" in seen[-1]


def test_the_budget_bounds_the_processes_not_max_processes(tmp_path):
    """Each process takes 10 s (a clock of the test's own): 300 s pay for 15 rounds, so an A/A
    run 20 % apart between processes looks at 2, 3, 4, 6, 8 and 12 and stops there, the rounds
    up to the next look (16) not fitting; undecided is exit 3."""
    measure, calls = fake(0.20, seed=3)
    now = [0.0]

    def timed(side: ab.Side, k: int) -> int:
        now[0] += 10
        return measure(side, k)

    seen: list[str] = []
    table, code = ab.run(
        [], *sides(tmp_path), budget_s=300, measure=timed, say=seen.append, clock=lambda: now[0], gate_pct=3
    )
    assert code == 3 and calls[-1][1] == 12 and table["base_processes"].item() == 12
    assert "the budget ends: 1 point(s) undecided after 12 processes a side (the next look, at 16" in seen[-1]


def test_the_looks_alpha_sums_to_at_most_alpha(tmp_path, monkeypatch):
    """Every look a run takes tests at alpha / the scheduled looks, so over all of them at most
    alpha; the schedule is sparse (10 looks up to 40 processes a side, not 39)."""
    assert ab.schedule(2, 40) == [2, 3, 4, 6, 8, 12, 16, 24, 32, 40]
    assert ab.schedule(5, 10) == [5, 6, 8, 10] and ab.schedule(2, 2) == [2]
    measure, _ = fake(0.20, seed=4)
    seen: list[str] = []
    judged, judge = [], verdicts.judge

    def judging(points, gate_pct, alpha, allow_mixed, floor=None, looks=1, paired=False):
        judged.append(looks)
        return judge(points, gate_pct, alpha, allow_mixed, floor, looks, paired)

    monkeypatch.setattr(verdicts, "judge", judging)
    ab.run([], *sides(tmp_path), max_processes=12, gate_pct=1, alpha=0.05, measure=measure, say=seen.append)
    levels = [float(re.search(r"at alpha ([0-9.e-]+)\)", line).group(1)) for line in seen if "look " in line]
    assert len(levels) == len(ab.schedule(2, 12)) == 6  # undecided to the end: every scheduled look taken
    assert sum(levels) <= 0.05 + 1e-12
    assert judged == [6] * 6, "the verdicts were judged at the same correction as said"


def test_metric_judges_by_that_column_and_one_no_row_has_is_compares_refusal(tmp_path, capsys):
    measure, _ = fake(0.01, slower=1.5)
    table, code = ab.run([], *sides(tmp_path / "a"), metric="median_s", measure=measure, say=lambda line: None)
    assert code == 1 and table["metric"].tolist() == ["median_s"]
    measure, _ = fake(0.01)
    with pytest.raises(MetricError, match=r"--metric tflop: no row of BASE \(.*\) has a value of it; allowed"):
        ab.run([], *sides(tmp_path / "b"), metric="tflop", measure=measure, say=lambda line: None)


def test_where_judges_only_those_rows_so_a_noisy_one_does_not_hold_the_run(tmp_path):
    """A model's one-sample ``load`` row varies 50 % between processes: judged, it keeps every run
    undecided; ``--where measurement!=load`` judges the rest, decided at the first look."""
    rng = np.random.default_rng(1)

    def measure(side: ab.Side, k: int) -> int:
        rows = []
        for name, between, n in (("forward", 0.01, 20), ("load", 0.5, 1)):
            times = (1 + rng.normal(0, between)) * (1 + rng.normal(0, 0.002, n))
            row = timed_row(times, run_id=f"{side.name}{k}", experiment="matmul", measurement=name, process=k)
            rows.append((row, times))
        writer = RunWriter(side.tree / f"{side.name}{k}")
        for row, times in rows:
            writer.add(row, samples=list(times))
        return 0

    quiet = {"max_processes": 4, "measure": measure, "say": lambda line: None}
    table, code = ab.run([], *sides(tmp_path / "all"), **quiet)
    assert code == 3 and dict(zip(table["measurement"], table["verdict"]))["load"] == "INCONCLUSIVE"
    table, code = ab.run([], *sides(tmp_path / "where"), where=["measurement!=load"], **quiet)
    assert code == 0 and table["measurement"].tolist() == ["forward"]
    assert table["new_processes"].item() < 4  # decided before the last look
    with pytest.raises(CompareError, match=r"--where measurement!=forward: every ok row has measurement=forward"):
        ab.run([], *sides(tmp_path / "none"), where=["measurement=forward", "measurement!=forward"], **quiet)


def side_of(logs: np.ndarray) -> Measured:
    """A side of simulated processes: their figures only (no samples: the t interval, no bootstrap)."""
    figures = np.exp(logs)
    return Measured(pd.DataFrame(), float(np.median(figures)), figures, [], [np.array([])] * len(figures), figures)


def sequential_aa(rng: np.random.Generator, cv: float, looks: list[int], paid: int, gate: float) -> str:
    """One simulated A/A run of ab's design: processes drawn at ``cv`` between them, judged at each
    scheduled look at ``paid`` looks' correction, stopped at the first decided look."""
    a, b = rng.normal(0, cv, looks[-1]), rng.normal(0, cv, looks[-1])
    for k in looks:
        point = verdicts.ComparedPoint("aa", "a/a", "median_s", side_of(a[:k]), side_of(b[:k]), higher=False)
        ((_, decision),) = verdicts.judge([point], gate, ALPHA, False, None, paid)
        if decision.verdict != "INCONCLUSIVE":
            break
    return decision.verdict.value


@pytest.mark.slow  # a simulation: in .ci/run's slow step, off the README's 3-minute set
def test_a_simulated_false_fail_rate_over_the_looks_stays_at_alpha():
    """400 A/A runs at 10 % between processes, up to 40 a side: with a gate of 0 every
    significant slowdown FAILs, the harshest case; a FAIL at any look happens at most alpha of
    the time (10 of 400 here), where testing every look at alpha would FAIL 60 of 400. At the
    10 % gate (5 FAIL) A/A runs end PASS, equivalent within it, before a 10 % change is detectable."""
    looks = ab.schedule(2, 40)
    for gate, paid, most in ((0, len(looks), ALPHA), (10, len(looks), ALPHA)):
        rng = np.random.default_rng(29)
        found = [sequential_aa(rng, 0.10, looks, paid, gate) for _ in range(400)]
        assert found.count("FAIL") / len(found) <= most, (gate, found.count("FAIL"))
        if gate:
            assert found.count("PASS") >= 0.95 * len(found)
    rng = np.random.default_rng(29)
    naive = [sequential_aa(rng, 0.10, looks, 1, 0) for _ in range(400)]
    assert naive.count("FAIL") / len(naive) > ALPHA  # why the looks are paid for


@pytest.mark.slow  # four fresh processes; ab's loop is tested fast above, its refusals below
def test_a_real_a_b_writes_both_trees_in_fresh_processes(cli, work, capsys):
    out = work / "ab"
    # the docs' kind of A/B: another thread count (a machine identity field) and a key set apart
    sides = ["--base-env", "OMP_NUM_THREADS=2", "--new-env", "OMP_NUM_THREADS=1", "--new", "bench.warmup=2"]
    args = ["ab", "+experiment=quick/matmul", *FAST, *sides, "--out", str(out)]
    ran = cli(*args, "--max-processes", "2", "--format", "json", rc=None)
    assert ran.rc in (0, 1, 3), ran.err
    points = [p for p in (json.loads(ran.out)["points"] if ran.out.strip() else []) if p.get("verdict")]
    if points:
        assert {p["base_processes"] for p in points} == {2} and {p["new_processes"] for p in points} == {2}
        assert not {p["verdict"] for p in points} & {"INCOMPARABLE"}, (
            "what the sides differ by is the change under test"
        )
    else:  # on a busy machine two threads' wall times are never judged, and it is said
        assert ran.rc == 3 and "left out rows measured on a busy machine" in ran.out + ran.err, ran.out + ran.err
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
        (["--metric", "device_name"], "--metric device_name: allowed: a numeric column, e.g. "),
        (["--where", "measurement"], "--where measurement: allowed: KEY=VALUE (rows that have it) or KEY!=VALUE"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(work, capsys, bad, line):
    with pytest.raises(SystemExit) as usage:
        ab.main(["+experiment=quick/matmul", *bad])
    err = capsys.readouterr().err
    assert usage.value.code == 2 and line in err and len(err.strip().splitlines()) == 1
    assert not (work / "ab").exists()  # refused before anything ran


@pytest.mark.parametrize("side", ["base", "new"])
def test_a_tree_already_in_out_is_refused_before_anything_runs(cli, work, side):
    """Either side's tree there already: never mixed with a new run's."""
    (work / "ab" / side).mkdir(parents=True)
    (work / "ab" / side / "results.csv").write_text("x\n")
    ran = cli("ab", "+experiment=quick/matmul", "--new-env", "OMP_NUM_THREADS=1", rc=2)
    assert ran.err.startswith("perflab ab: error: --out") and f"{side} is not empty" in ran.err
    assert len(ran.err.strip().splitlines()) == 1
    assert sorted(p.name for p in (work / "ab").iterdir()) == [side], "nothing measured, nothing written"


def git(*args: str, cwd) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_ref_that_is_no_commit_is_one_line_and_exit_2(work, capsys):
    assert ab.main(["+experiment=quick/matmul", "--base-ref", "HEAD"]) == 2  # no git repository here
    assert "--base-ref HEAD: not a commit of" in capsys.readouterr().err
    git("init", "-q", cwd=work)
    git("commit", "-q", "--allow-empty", "-m", "one", cwd=work)
    assert ab.main(["+experiment=quick/matmul", "--new-ref", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert (
        "--new-ref nosuch: not a commit of the git repository here" in err and "allowed: a branch, tag or commit" in err
    )
    with pytest.raises(SystemExit) as usage:
        ab.main(["+experiment=quick/matmul", "--install", "true"])
    assert usage.value.code == 2 and "--install true: allowed: with --base-ref or --new-ref" in capsys.readouterr().err
    assert not (work / "ab").exists()  # refused before anything ran


@pytest.mark.slow
def test_git_refs_as_sides_measure_each_commit_in_its_own_worktree(cli, work):
    git("init", "-q", cwd=work)
    (work / "code.py").write_text("VERSION = 1\n")
    git("add", "code.py", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    first = git("rev-parse", "HEAD", cwd=work)
    (work / "code.py").write_text("VERSION = 2\n")
    git("commit", "-qam", "two", cwd=work)
    second = git("rev-parse", "HEAD", cwd=work)
    installed = work / "installed.txt"
    refs = ["--base-ref", first, "--new-ref", "HEAD", "--install", f"git rev-parse HEAD >> {installed}"]
    ran = cli("ab", "+experiment=quick/matmul", *FAST, *refs, "--max-processes", "1", "--min-processes", "1", rc=None)
    assert ran.rc in (0, 1, 3), ran.err
    assert sorted(installed.read_text().split()) == sorted([first, second])  # once in each worktree, at its ref
    for side, sha in (("base", first), ("new", second)):
        (subject,) = set(results.load(work / "ab" / side)["subject"])
        assert sha.startswith(str(subject).removesuffix("+dirty")), (side, subject)
    assert len(git("worktree", "list", cwd=work).splitlines()) == 1  # the worktrees are gone again
    assert not (work / "ab" / "src" / "base").exists()


MACHINE = {"cpu_model": "Test CPU", "num_threads": 2, "torch": "2.14.1"}


def judged(tmp_path, base: ab.Side, new: ab.Side, new_identity: dict[str, object]) -> pd.DataFrame:
    """``perflab ab``'s loop on two sides whose rows differ by ``new_identity`` (an A/A otherwise)."""
    identity = {"base": MACHINE, "new": {**MACHINE, **new_identity}}
    measure, _ = fake(0.01, identity=identity)
    table, _ = ab.run([], base, new, min_processes=2, max_processes=2, measure=measure, say=lambda line: None)
    return table


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
def test_sides_under_another_thread_variable_compare_but_another_cpu_is_incomparable(tmp_path, name):
    """Another OMP_*/MKL_* variable explains num_threads (the change under test, said); a CPU model
    that differs too is still INCOMPARABLE (the sides' difference had turned every check off)."""
    sides = ab.Side("base", tmp_path / "1" / "base"), ab.Side("new", tmp_path / "1" / "new", env={name: "1"})
    table = judged(tmp_path, *sides, {"num_threads": 1})
    assert table["verdict"].item() in ("PASS", "INCONCLUSIVE") and not table["identity"].item()
    assert any("differ on purpose in num_threads: 2 vs 1" in n for n in table.attrs["notes"])
    sides = ab.Side("base", tmp_path / "2" / "base"), ab.Side("new", tmp_path / "2" / "new", env={name: "1"})
    table = judged(tmp_path, *sides, {"num_threads": 1, "cpu_model": "Other CPU"})
    assert table["verdict"].item() == "INCOMPARABLE"
    assert table["identity"].item() == "cpu_model: Test CPU vs Other CPU"  # num_threads: explained


def test_a_variable_that_sets_no_threads_explains_nothing(tmp_path):
    """Sides apart only by PYTHONPATH (a ref's worktree) or another variable: threads that differ
    are INCOMPARABLE, as in compare."""
    base = ab.Side("base", tmp_path / "base", env={"PYTHONPATH": "src/base", "MY_FLAG": "1"})
    new = ab.Side("new", tmp_path / "new", env={"PYTHONPATH": "src/new"})
    assert not base.explains(new)
    table = judged(tmp_path, base, new, {"num_threads": 1})
    assert table["verdict"].item() == "INCOMPARABLE" and "num_threads: 2 vs 1" in table["identity"].item()


def test_another_interpreter_explains_torch_not_the_cpu(tmp_path):
    """Another venv's python explains torch's version (and the libraries under it), not the CPU."""
    sides = ab.Side("base", tmp_path / "1" / "base"), ab.Side("new", tmp_path / "1" / "new", python="venv/bin/python")
    table = judged(tmp_path, *sides, {"torch": "2.15.0"})
    assert table["verdict"].item() != "INCOMPARABLE"
    assert any("differ on purpose in torch: 2.14.1 vs 2.15.0" in n for n in table.attrs["notes"])
    sides = ab.Side("base", tmp_path / "2" / "base"), ab.Side("new", tmp_path / "2" / "new", python="venv/bin/python")
    table = judged(tmp_path, *sides, {"torch": "2.15.0", "cpu_model": "Other CPU"})
    assert table["verdict"].item() == "INCOMPARABLE" and table["identity"].item().startswith("cpu_model:")
    sides = ab.Side("base", tmp_path / "3" / "base"), ab.Side("new", tmp_path / "3" / "new", python="venv/bin/python")
    assert judged(tmp_path, *sides, {"num_threads": 1})["verdict"].item() == "INCOMPARABLE"  # threads: not by python
