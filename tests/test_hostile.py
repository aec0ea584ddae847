"""What a user already has is never lost, hidden or silently wrong (issue 47): no output lands
on a file perflab wrote as truth, no run is written where a run already is or where no reader
looks, derived files heal from the run dirs (a done point is never measured twice), nothing is
deleted through a link, a claim's staleness is judged by its own heartbeat whatever the clocks
say, and ``perflab ab`` checks both sides before measuring either. Each case hashes the tree
before and after: nothing of the user's changes."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from test_contract import install  # noqa: F401  (a fixture: a user's package, installed)
from test_faults import make, no_hang, snapshot  # noqa: F401  (no_hang: a fixture)

from perflab.errors import ConfigError
from perflab.store import done_marks, ledger, point_claims
from perflab.store.rundir import RunRecord, RunWriter

from conftest import FAST

MATMUL = ["+experiment=quick/matmul", *FAST, "results.table=false"]


def seed(top: Path) -> dict[str, Path]:
    """A results tree as perflab writes it, without measuring: a complete run, a sweep of one
    point, the done index. Returns its truth files by name."""
    store = top / "outputs"
    run = store / "runs" / "2026-11-27_10-00-00_0a1b2c3d"
    point = store / "sweeps" / "2026-11-27_10-01-00_4e5f6a7b" / "0"
    for run_dir, run_id in ((run, "r1"), (point, "r2")):
        run_dir.mkdir(parents=True)
        row = {"run_id": run_id, "experiment": "matmul", "measurement": "m", "status": "ok"}
        RunWriter(run_dir).add(row, samples=[0.1, 0.2])
        RunRecord(run_id=run_id, experiment="matmul", config_hash="h", outcome="ok", complete=True, rows=1).save(
            run_dir
        )
    (point.parent / "multirun.yaml").write_text("hydra: {}\n")
    (point.parent / "sweep.csv").write_bytes((point / "results.csv").read_bytes())
    done_marks.rebuild_done(store)
    return {
        "results.csv": run / "results.csv",
        "samples.csv": run / "samples.csv",
        "run.json": run / "run.json",
        "sweep.csv": point.parent / "sweep.csv",
        "a new file in a run dir": run / "mine.csv",
        "a derived file": store / ".perflab" / "done" / done_marks.FORMAT,
    }


TRUTH = ["results.csv", "samples.csv", "run.json", "sweep.csv", "a new file in a run dir", "a derived file"]


# --- outputs aimed at truth: one rule, asked by every writer ---------------------------------


def _ledger(path: Path, top: Path) -> int:
    try:
        ledger.check(path)
    except ConfigError:
        return 2
    return 0


def _export(path: Path, top: Path, *more: str) -> int:
    from perflab import results

    return results.main(["export", str(path), str(top / "outputs"), *more])


def _report(path: Path, top: Path) -> int:
    from perflab import report

    return report.main([str(top / "outputs"), "-o", str(path)])


def _chapter(path: Path, top: Path) -> int:
    from perflab import chapter

    def measured() -> float:
        raise AssertionError("the chapter started measuring: its -o was taken")

    real, chapter.started_at = chapter.started_at, measured
    try:
        return chapter.main(["-o", str(path), "--store", str(top / "chapter")])
    finally:
        chapter.started_at = real


def _plot(path: Path, top: Path) -> int:
    from perflab.analysis import plots
    from perflab.store import files

    try:
        files.check_replace("--plot", path, plots.is_plot, "a plot")
    except ConfigError:
        return 2
    return 0


WRITERS = {
    "ledger": _ledger,
    "export": _export,
    "export --parquet": lambda p, t: _export(p, t, "--parquet"),
    "report -o": _report,
    "chapter -o": _chapter,
    "plots": _plot,
}


@pytest.mark.parametrize("truth", TRUTH)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_no_output_path_is_a_file_perflab_wrote_as_truth(tmp_path, capsys, writer, truth):
    paths = seed(tmp_path)
    before = snapshot(tmp_path)
    assert WRITERS[writer](paths[truth], tmp_path) == 2
    assert snapshot(tmp_path) == before, "nothing written, nothing changed"
    said = capsys.readouterr().err
    assert "Traceback" not in said
    if writer not in ("ledger", "plots"):  # the commands say it in one line (the checks raise it)
        assert len(said.strip().splitlines()) == 1 and "allowed:" in said, said


def test_the_rule_is_the_one_every_output_asks_and_says_why(tmp_path):
    paths = seed(tmp_path)
    with pytest.raises(ConfigError, match="it is in the run dir .*holds what its run wrote"):
        ledger.check(paths["results.csv"])
    with pytest.raises(ConfigError, match="it is in the sweep dir"):
        ledger.check(paths["sweep.csv"])
    with pytest.raises(ConfigError, match=r"it is under \.perflab/"):
        ledger.check(paths["a derived file"])
    link = tmp_path / "ledger.csv"
    link.symlink_to(paths["results.csv"])  # a link is judged by where it leads
    with pytest.raises(ConfigError, match="it is in the run dir"):
        ledger.check(link)
    ledger.check(tmp_path / "outputs" / "ledger.csv")  # beside the runs, not in one: fine


def test_a_ledger_aimed_at_a_runs_results_is_refused_before_the_job_and_leaves_a_users_folder(cli, work):
    """End to end: refused in one line, exit 2, the run's rows as they were; the job's own folder
    (hydra.run.dir at a folder of the user's) keeps the user's file and is not deleted."""
    paths = seed(work)
    mine = work / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    before = snapshot(work)
    ran = cli(*MATMUL, f"results.ledger={paths['results.csv']}", "hydra.run.dir=mine", rc=2)
    assert len(ran.err.strip().splitlines()) == 1 and "it is in the run dir" in ran.err
    assert snapshot(work) == before


# --- a run dir is written once, and only where it is read ------------------------------------


RUN_DIRS = {
    "a run dir": ("hydra.run.dir=outputs/runs/2026-11-27_10-00-00_0a1b2c3d", "it already holds a run"),
    "the store": ("hydra.run.dir=outputs", "it is the results store"),
    "runs/": ("hydra.run.dir=outputs/runs", "it holds runs"),
    "under .perflab": ("hydra.run.dir=outputs/.perflab/x", "under a hidden folder of the store"),
    "inside a run dir": ("hydra.run.dir=outputs/runs/2026-11-27_10-00-00_0a1b2c3d/x", "inside the run dir"),
    "a sweep dir": ("hydra.sweep.dir=outputs/sweeps/2026-11-27_10-01-00_4e5f6a7b", "it already holds a run"),
}


@pytest.mark.parametrize("case", list(RUN_DIRS))
def test_a_run_or_sweep_dir_that_holds_runs_or_is_never_read_is_refused(cli, work, case):
    seed(work)
    before = snapshot(work)
    where, phrase = RUN_DIRS[case]
    ran = cli(*(["-m"] if "sweep" in where else []), *MATMUL, where, rc=2)
    said = ran.err.strip().splitlines()
    assert len(said) == 1 and phrase in said[0] and "allowed: a new or empty folder" in said[0], ran.err
    assert snapshot(work) == before, "nothing written, nothing changed"


def test_the_api_refuses_a_run_dir_that_holds_a_run(work):
    from perflab.api import run
    from perflab.errors import Refused

    seed(work)
    point = work / "outputs" / "sweeps" / "2026-11-27_10-01-00_4e5f6a7b"
    before = snapshot(work)
    with pytest.raises(Refused, match="sweep_dir=.*/0: it already holds a run"):
        run("quick/matmul", FAST, sweep_dir=point, job_num=0)
    assert snapshot(work) == before


# --- derived files heal: a done mark is rebuilt, never measured again --------------------------


def _done(tmp_path: Path) -> tuple[Path, str, Path]:
    """A complete run with its done marker: (run dir, point key, marker)."""
    seed(tmp_path)
    store = tmp_path / "outputs"
    key = done_marks.point_key("h")
    (marker, _) = sorted((store / ".perflab" / "done" / key).iterdir())  # r1's, then r2's
    return store, key, marker


def _user_file(tmp_path: Path) -> Path:
    mine = tmp_path / "mine" / "notes.txt"
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text("the user's\n")
    return mine


MARKER_DAMAGE = {
    "cut short": lambda m, u: m.write_bytes(m.read_bytes()[:-5]),
    "empty": lambda m, u: m.write_bytes(b""),
    "bit-flipped": lambda m, u: m.write_bytes(bytes([m.read_bytes()[0] ^ 0x20]) + m.read_bytes()[1:]),
    "not text": lambda m, u: m.write_bytes(b"\xff\xfe\x00runs\n"),
    "a link": lambda m, u: (m.unlink(), m.symlink_to(u)),
    "a folder": lambda m, u: (m.unlink(), m.mkdir()),
    "a FIFO": lambda m, u: (m.unlink(), make(m, "fifo")),
    "a link loop": lambda m, u: (m.unlink(), make(m, "loop")),
    "the marks folder emptied": lambda m, u: [p.unlink() for p in m.parent.iterdir()],
    "the marks folder a link": lambda m, u: (
        [p.unlink() for p in m.parent.iterdir()],
        m.parent.rmdir(),
        m.parent.symlink_to(u.parent),
    ),
    "a file for the marks folder": lambda m, u: (
        [p.unlink() for p in m.parent.iterdir()],
        m.parent.rmdir(),
        m.parent.write_text("x"),
    ),
}


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("damage", list(MARKER_DAMAGE))
def test_a_damaged_done_marker_is_rebuilt_from_the_complete_run_not_measured_again(tmp_path, damage):
    store, key, marker = _done(tmp_path)
    mine = _user_file(tmp_path)
    user = snapshot(mine.parent)
    MARKER_DAMAGE[damage](marker, mine)
    found = done_marks.find_done(store, key)
    assert found is not None and RunRecord.read(found).complete, "the point is done: never measured again"
    assert done_marks.find_done(store, key) == found, "and its marker rebuilt"
    assert (store / ".perflab" / "done" / key).is_dir() and not (store / ".perflab" / "done" / key).is_symlink()
    assert snapshot(mine.parent) == user, "nothing of the user's deleted or written"


FORMAT_DAMAGE = {
    "a folder": lambda f, u: (f.unlink(), f.mkdir(), (f / "x").write_text("x")),
    "a FIFO": lambda f, u: (f.unlink(), make(f, "fifo")),
    "a link loop": lambda f, u: (f.unlink(), make(f, "loop")),
    "a link to a user's file": lambda f, u: (f.unlink(), f.symlink_to(u)),
    "missing": lambda f, u: f.unlink(),
}


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("damage", list(FORMAT_DAMAGE))
def test_a_format_mark_of_the_wrong_kind_is_rebuilt(tmp_path, damage):
    store, key, _ = _done(tmp_path)
    mine = _user_file(tmp_path)
    user = snapshot(mine.parent)
    mark = store / ".perflab" / "done" / done_marks.FORMAT
    FORMAT_DAMAGE[damage](mark, mine)
    assert done_marks.find_done(store, key) is not None
    assert mark.is_file() and not mark.is_symlink()
    assert done_marks.find_done(store, key) is not None, "every time, not only once"
    assert snapshot(mine.parent) == user


@pytest.mark.parametrize("linked", [".perflab", ".perflab/done", ".perflab/done/KEY"])
def test_nothing_is_deleted_through_a_link_in_the_derived_folders(tmp_path, linked):
    """A derived folder linked to a folder of the user's: a rebuild never deletes in it."""
    store, key, _ = _done(tmp_path)
    theirs = tmp_path / "theirs"
    for name in ("notes.txt", "done/old-notes", key, f"done/{key}/notes", done_marks.FORMAT):
        path = theirs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text("the user's\n")
    before = snapshot(theirs)
    where = store / linked.replace("KEY", key)
    import shutil

    shutil.rmtree(where)
    where.symlink_to(theirs)
    done_marks.rebuild_done(store)
    done_marks.find_done(store, key)
    from perflab import results

    assert results.main(["reindex", str(store)]) == 0
    after = snapshot(theirs)
    assert {k: v for k, v in after.items() if k in before} == before, "every file of the user's as it was"


def test_a_claims_folder_linked_to_a_users_folder_is_unlinked_not_written_through(tmp_path):
    mine = _user_file(tmp_path)
    before = snapshot(mine.parent)
    claims = tmp_path / ".perflab" / "claims"
    claims.parent.mkdir(parents=True)
    claims.symlink_to(mine.parent)
    got = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    assert isinstance(got, point_claims.HeldClaim) and not claims.is_symlink()
    got.release()
    assert snapshot(mine.parent) == before


@pytest.mark.slow  # two sweeps; the unit cases above show each damage
def test_a_sweep_after_its_done_marker_was_cut_short_measures_nothing_again(cli, work):
    args = ["-m", *MATMUL]
    cli(*args)
    (marker,) = [p for p in (work / "outputs" / ".perflab" / "done").rglob("*") if p.is_file() and "-p1" in str(p)]
    marker.write_bytes(marker.read_bytes()[:3])
    ran = cli(*args)
    assert "not a done marker" in ran.out and "sweep: 1 jobs: 1 done" in ran.out


# --- claims across clocks ----------------------------------------------------------------------


def _foreign_claim(tmp_path: Path, **fields) -> Path:
    path = tmp_path / ".perflab" / "claims" / "h.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": "another-node", "pid": 1, "run_dir": "x", "since": 0, **fields}))
    return path


def test_a_claim_stamped_in_the_future_goes_stale_by_this_readers_own_clock(tmp_path, monkeypatch):
    """A node whose clock is an hour ahead stamped the claim, then died: its mtime stays in the
    future, and the point is taken over once that mtime stood still for stale_s here."""
    path = _foreign_claim(tmp_path)
    ahead = path.stat().st_mtime + 3600
    os.utime(path, (ahead, ahead))
    now = [1000.0]
    monkeypatch.setattr(point_claims, "_clock", lambda: now[0])
    held = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    assert isinstance(held, point_claims.Holder) and held.age_s == 0, "just seen: fresh"
    now[0] += 30
    assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60), point_claims.Holder)
    now[0] += 31  # 61 s without a heartbeat, as this reader saw it
    got = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    assert isinstance(got, point_claims.HeldClaim)
    got.release()


def test_a_claim_that_beats_is_never_taken_over_however_its_clock_is_off(tmp_path, monkeypatch):
    path = _foreign_claim(tmp_path)
    now = [1000.0]
    monkeypatch.setattr(point_claims, "_clock", lambda: now[0])
    for beat in range(5):
        stamp = path.stat().st_mtime + 3600 + beat  # each heartbeat moves the (skewed) mtime
        os.utime(path, (stamp, stamp))
        assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60), point_claims.Holder)
        now[0] += 50


@pytest.mark.parametrize("pid", [2**70, 0, -1, 99999999])
def test_a_claim_with_a_pid_no_process_can_have_is_taken_over_without_a_traceback(tmp_path, pid):
    _foreign_claim(tmp_path, host=socket.gethostname(), pid=pid)
    got = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    assert isinstance(got, point_claims.HeldClaim)
    got.release()


# --- perflab ab checks both sides before measuring either --------------------------------------


@pytest.fixture
def measured(monkeypatch):
    """Every process ab would start, recorded instead of run."""
    from perflab.job import processes

    started: list[list[str]] = []
    monkeypatch.setattr(processes, "run_one", lambda args, **kw: started.append(list(args)) or 0)
    return started


AB_MISTAKES = {
    "a bad --new value": (["--new", "experiment.size=-3"], "new side: experiment.size=-3"),
    "a bad --base key": (["--base", "bench.repeat=3"], "base side: bench.repeat=3: unknown key"),
    "a bad --new key in a sweep": (
        ["-m", "experiment.size=16,32", "--new", "bench.repeat=3"],
        "new side: bench.repeat",
    ),
    "a bad --new type in a sweep": (["-m", "experiment.size=16,32", "--new", "bench.repeats=x"], "bench.repeats=x"),
    "no --new-python": (["--new-python", "/no/such/python"], "--new-python /no/such/python: no such program"),
    "--out a results tree": (["--new-env", "OMP_NUM_THREADS=1", "--out", "outputs"], "--out "),
    "--out a run dir": (
        ["--new-env", "OMP_NUM_THREADS=1", "--out", "outputs/runs/2026-11-27_10-00-00_0a1b2c3d"],
        "it is a run dir",
    ),
    "--out a folder of the user's": (["--new-env", "OMP_NUM_THREADS=1", "--out", "mine"], "mine/notes.txt is there"),
}


@pytest.mark.parametrize("case", list(AB_MISTAKES))
def test_ab_checks_both_sides_and_out_before_measuring_either(cli, work, measured, case):
    seed(work)
    _user_file(work)
    before = snapshot(work)
    flags, phrase = AB_MISTAKES[case]
    ran = cli("ab", *MATMUL, *flags, rc=2)
    said = ran.err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("perflab ab: error: ") and phrase in said[0], ran.err
    assert measured == [], "neither side measured"
    assert snapshot(work) == before


# --- no traceback, no silent exit: what the user wrote is named in one line --------------------

POST_INIT = (
    "from dataclasses import dataclass\n"
    "from perflab.experiment import ExperimentConfig\n"
    "@dataclass\n"
    "class Config(ExperimentConfig):\n"
    "    rows: int = 8\n"
    "    def __post_init__(self):\n"
    "        self.ratio = 1 / (self.rows - 8)  # the user's bug\n"
    "def run(ctx):\n"
    "    pass\n"
)


def test_a_users_module_calling_sys_exit_on_import_is_named_and_breaks_only_itself(install, cli, work):  # noqa: F811
    sources = {"edgepkg/__init__.py": "", "edgepkg/exp.py": "import sys\nsys.exit(3)\n"}
    install("edgepkg", {"quits": "edgepkg.exp"}, sources)
    listed = cli()
    assert "quits" in listed.out and "it calls sys.exit(3) as it is imported" in listed.out
    ran = cli("+experiment=quits", rc=2)
    assert ran.err == (
        "perflab: error: experiment quits (edgepkg.exp, from edgepkg 0.1.0): cannot import it: it calls "
        "sys.exit(3) as it is imported; allowed: a module that imports (fix it, or pip uninstall edgepkg)\n"
    )
    assert "matmul" in cli(*MATMUL, "results.table=true").out, "every other experiment runs"


def test_a_bug_in_a_users_config_post_init_is_one_line_naming_it(install, cli, work):  # noqa: F811
    install("edgepkg", {"buggy": "edgepkg.exp"}, {"edgepkg/__init__.py": "", "edgepkg/exp.py": POST_INIT})
    for sweep in ([], ["-m", "experiment.rows=8,9"]):  # checked without Hydra, and by Hydra's config
        ran = cli(*sweep, "+experiment=buggy", *FAST, rc=2)
        said = ran.err.strip().splitlines()
        assert len(said) == 1 and "Traceback" not in ran.err, ran.err
        assert "its Config (edgepkg.exp.Config) raised ZeroDivisionError: division by zero" in said[0], said[0]
    assert not (work / "outputs").exists() or not list((work / "outputs").rglob("results.csv"))


def test_a_preset_that_is_not_utf8_is_one_line_naming_it(cli, work):
    preset = work / "conf" / "experiment" / "latin.yaml"
    preset.parent.mkdir(parents=True)
    preset.write_bytes("# @package _global_\n# caf\xe9\ndefaults:\n  - /experiment/quick/matmul\n".encode("latin-1"))
    ran = cli("--config-dir", "conf", "+experiment=latin", *FAST, rc=2)
    said = ran.err.strip().splitlines()
    assert len(said) == 1 and "latin.yaml" in said[0] and "UTF-8" in said[0] and "Traceback" not in ran.err, ran.err


def test_a_deeply_nested_peaks_file_is_one_line(cli, work):
    (work / "peaks.json").write_text("[" * 100_000 + "]" * 100_000)
    ran = cli(*MATMUL, "results.peaks=peaks.json", rc=None)
    assert "Traceback" not in ran.out + ran.err and "RecursionError" not in ran.out + ran.err
    assert "results.peaks=peaks.json" in ran.out + ran.err


def _unreadable(monkeypatch, *folders: Path) -> None:
    """``folders`` cannot be listed, as for a user without the permission (tests run as root,
    whom chmod does not stop)."""
    real = os.scandir
    refused = {os.path.realpath(f) for f in folders}

    def scandir(path="."):
        if os.path.realpath(path) in refused:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_a_tree_that_cannot_be_read_is_an_error_never_no_runs(work, capsys, monkeypatch):
    from perflab import results

    seed(work)
    _unreadable(monkeypatch, work / "outputs")
    assert results.main(["outputs"]) == 2
    assert capsys.readouterr().err.strip() == "perflab results: error: outputs: cannot read it (Permission denied) " + (
        "(run an experiment first, or give the results tree)"
    )
    with pytest.raises(FileNotFoundError, match="cannot read it"):
        results.load("outputs")


def test_a_folder_of_the_tree_that_cannot_be_read_is_said(work, capsys, monkeypatch):
    from perflab import results

    seed(work)
    _unreadable(monkeypatch, work / "outputs" / "sweeps")
    assert results.main(["outputs"]) == 0
    said = capsys.readouterr().out
    assert "skipped 1 folder that could not be read (Permission denied): runs there are not loaded" in said
    assert "outputs/sweeps" in said and "r1" in said


def test_an_index_that_cannot_be_used_leaves_the_run_dirs_read_and_says_so(work, monkeypatch, caplog):
    from perflab import results
    from perflab.store import index

    seed(work)

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(work / "outputs" / ".perflab" / "index"))

    monkeypatch.setattr(index, "load_tree", refused)
    df = results.load("outputs")
    assert sorted(df["run_id"]) == ["r1", "r2"], "every row, from the run dirs themselves"
    assert "without its index, which could not be used" in " ".join(df.attrs["notes"])
