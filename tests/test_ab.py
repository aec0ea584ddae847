"""perflab ab: processes alternate A B A B, a point undecided gets more of them until decided or
the budget ends, looks are paid for (Bonferroni over the planned looks), both trees are written."""

from __future__ import annotations

import json
import subprocess

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
