"""Readers on the tree a user really has: runs of several experiments mixed (a key one lacks stays
absent, integers stay integers), torn and foreign files, a damaged or outdated index, symlinked
folders; and outputs that never replace a file perflab did not write."""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pandas as pd
import pytest

from perflab import compare, report
from perflab.analysis import plots
from perflab.results import load
from perflab.results import main as results_main
from perflab.store import tree as store
from perflab.store.rundir import RunRecord, RunWriter

from conftest import FAST


def _run(root, name, experiment, rows, samples=(1.0, 1.1, 0.9), outcome="ok"):
    """A run dir as a job leaves it: its rows, raw samples and run.json."""
    w = RunWriter(root / "runs" / name)
    for r in rows:
        w.add({"run_id": name, "experiment": experiment, "status": "ok", **r}, samples=list(samples))
    RunRecord(run_id=name, experiment=experiment, config_hash=name, outcome=outcome, complete=outcome == "ok").save(
        root / "runs" / name
    )


@pytest.fixture
def mixed(tmp_path):
    """The README's tree in miniature: one matmul run (no device count: ``auto``), then a
    training sweep over strategy and device count."""
    out = tmp_path / "outputs"
    matmul = {"measurement": "cpu alone", "median_s": 0.02, "tflops": 0.1, "cfg.experiment.size": 256}
    _run(out, "m", "matmul", [matmul])
    for strategy in ("scratch", "ddp"):
        for count in (1, 2):
            _run(
                out,
                f"t-{strategy}-{count}",
                "train",
                [
                    {
                        "measurement": "train",
                        "median_s": 1.0 / count,
                        "items_per_s": 1000.0 * count,
                        "cfg.experiment.name": "train",
                        "cfg.devices.count": count,
                        "cfg.strategy.name": strategy,
                        "cfg.data.train_size": 1024,
                    }
                ],
                samples=[1.0 / count, 1.05 / count, 0.95 / count],
            )
    return out


def test_a_key_one_experiment_lacks_stays_absent_and_integers_stay_integers(mixed):
    df = load(mixed)
    for key in ("cfg.devices.count", "cfg.data.train_size", "cfg.experiment.size"):
        assert pd.api.types.is_integer_dtype(df[key]), (key, df[key].dtype)
    matmul, train = df[df.experiment == "matmul"], df[df.experiment == "train"]
    assert matmul["cfg.devices.count"].isna().all() and train["cfg.experiment.size"].isna().all()
    assert sorted(train["cfg.devices.count"].unique()) == [1, 2] and set(train["cfg.data.train_size"]) == {1024}
    assert (df["run_outcome"] == "ok").all()
    assert pd.api.types.is_integer_dtype(load(mixed)["cfg.devices.count"]), "the same through the index"


def test_compare_finds_the_baseline_and_scaling_per_experiment(mixed, tmp_path, capsys):
    table = compare.compare(mixed, baseline="devices.count=1")
    train = table[table.experiment == "train"].set_index(["cfg.strategy.name", "cfg.devices.count"])
    assert train.loc[("ddp", 1), "significance"] == "baseline"
    assert train.loc[("ddp", 2), "speedup_vs_baseline"] == pytest.approx(2.0)
    assert train.loc[("scratch", 2), "efficiency"] == pytest.approx(1.0)
    assert "matmul: no baseline: none of its points has devices.count=1" in table.attrs["notes"]
    assert table[table.experiment == "matmul"]["significance"].isna().all(), "no problem hidden in a cell"
    assert compare.main([str(mixed), "--experiment", "train", "--baseline", "devices.count=1"]) == 0
    capsys.readouterr()
    for bad, said in (
        ("devices.count=99", "--baseline devices.count=99: no ok row has devices.count=99; allowed: devices.count="),
        ("devices.count", "--baseline devices.count: allowed: KEY=VALUE"),
        ("nope=1", "--baseline nope=1: not a key of these results"),
    ):
        assert compare.main([str(mixed), "--baseline", bad]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    pytest.importorskip("matplotlib")
    assert compare.main([str(mixed), "--plot", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "scaling.png").is_file()


def test_the_report_labels_keys_as_their_values(mixed):
    pytest.importorskip("matplotlib")
    html = report.build(mixed)
    assert "1024.0" not in html and "2.0 devices" not in html and "nan" not in html.lower().split("<script")[0]
    assert "2 devices" in html and 'class="noplot failed"' not in html


# --- what readers skip, rebuild and say -----------------------------------------------------------


def test_torn_foreign_and_linked_files_are_skipped_and_said_once_per_kind(mixed, tmp_path, caplog):
    results = mixed / "runs" / "m" / "results.csv"
    whole = results.read_bytes()
    row = whole.splitlines()[1].replace(b"m#1", b"m#2")
    results.write_bytes(whole + row[: len(row) - 2])  # a row cut short (a copy that stopped): "25" of "256"
    secret = tmp_path / "secret.csv"
    secret.write_text("user,password\nbob,hunter2\n")
    for name in ("foreign", "foreign2"):
        (mixed / "runs" / name).mkdir()
        (mixed / "runs" / name / "results.csv").write_text("user,password\nbob,hunter2\n")
    (mixed / "runs" / "linked").mkdir()
    (mixed / "runs" / "linked" / "results.csv").symlink_to(secret)
    with caplog.at_level(logging.WARNING, logger="perflab"):
        df = load(mixed)
    assert len(df) == 5 and "hunter2" not in df.to_csv()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert any("skipped 1 torn or malformed line: " in line and "runs/m/results.csv" in line for line in lines)
    assert any("skipped 2 files that perflab did not write" in line for line in lines)
    assert any("skipped 1 symlinked results.csv" in line for line in lines)
    assert load(mixed).attrs["notes"] == df.attrs["notes"], "said again when read through the index"
    assert results_main(["export", str(tmp_path / "all.csv"), str(mixed)]) == 0
    assert "hunter2" not in (tmp_path / "all.csv").read_text()
    assert load(mixed / "runs" / "m" / "results.csv")["row_id"].tolist() == ["m#1"], "a file given alone, too"


@pytest.mark.parametrize("damage", ["no _source", "a directory", "another format", "junk manifest"])
def test_a_damaged_or_outdated_index_segment_is_rebuilt_by_the_reader(mixed, damage, caplog):
    expected = sorted(load(mixed)["row_id"])
    index = mixed / ".perflab" / "index"
    (manifest,) = index.glob("*.json")
    segment = manifest.with_suffix(".parquet")
    if damage == "no _source":
        pd.read_parquet(segment).drop(columns=["_source"]).to_parquet(segment)
    elif damage == "a directory":
        segment.unlink()
        segment.mkdir()
    elif damage == "another format":  # what an older perflab wrote: source -> stamp, no format
        manifest.write_text(json.dumps(json.loads(manifest.read_text())["sources"]))
    else:
        manifest.write_text("{junk")
    with caplog.at_level(logging.WARNING, logger="perflab"):
        assert sorted(load(mixed)["row_id"]) == expected
    said = "index segment written by another perflab version" if damage == "another format" else "damaged index segment"
    assert f"rebuilt 1 {said}" in caplog.text
    caplog.clear()
    assert sorted(load(mixed)["row_id"]) == expected and "rebuilt" not in caplog.text, "rebuilt once, for good"
    assert not segment.exists()


def test_symlinked_runs_and_index_are_followed_by_writers_and_readers_alike(cli, work, tmp_path):
    disk = tmp_path / "disk2"
    (disk / "runs").mkdir(parents=True)
    (disk / "index").mkdir()
    (work / "outputs" / ".perflab").mkdir(parents=True)
    (work / "outputs" / "runs").symlink_to(disk / "runs")
    (work / "outputs" / ".perflab" / "index").symlink_to(disk / "index")
    (disk / "runs" / "loop").symlink_to(disk)  # a link loop ends
    cli("+experiment=quick/matmul", *FAST, "results.table=false")
    assert len(list((disk / "runs").glob("*/results.csv"))) == 1, "the writer went through the link"
    assert len(load(work / "outputs")) == 1, "and the reader sees what it wrote"
    assert list((disk / "index").glob("*.parquet")), "the index too, in the link's target"
    assert len(load(work / "outputs")) == 1


def test_rows_of_a_killed_run_are_marked_by_its_outcome(mixed):
    record = RunRecord.read(mixed / "runs" / "t-ddp-2")
    assert load(mixed)["run_outcome"].eq("ok").all()
    record.outcome, record.complete = "running", False  # killed: its run.json never said more
    record.save(mixed / "runs" / "t-ddp-2")
    df = load(mixed)
    assert df.loc[df.run_id == "t-ddp-2", "run_outcome"].tolist() == ["running"]
    assert df.loc[df.run_id != "t-ddp-2", "run_outcome"].eq("ok").all()
    assert load(mixed / "runs")["run_outcome"].eq("running").sum() == 1, "the same outside a store"


@pytest.mark.timeout(60)  # without the rule a FIFO blocks its reader for ever: this fails instead
def test_a_fifo_or_folder_in_place_of_a_run_file_is_skipped_and_said(mixed, tmp_path, capsys, caplog):
    expected = sorted(load(mixed)["row_id"])
    (mixed / "runs" / "x").mkdir()
    os.mkfifo(mixed / "runs" / "x" / "results.csv")
    (mixed / "runs" / "y").mkdir()
    (mixed / "runs" / "y" / "run.json").mkdir()
    (mixed / "runs" / "m" / "samples.csv").unlink()
    os.mkfifo(mixed / "runs" / "m" / "samples.csv")
    os.mkfifo(mixed / "runs" / "t-ddp-1" / "run.json.new")
    os.replace(mixed / "runs" / "t-ddp-1" / "run.json.new", mixed / "runs" / "t-ddp-1" / "run.json")
    with caplog.at_level(logging.WARNING, logger="perflab"):
        df = load(mixed)
        assert sorted(df["row_id"]) == [r for r in expected if not r.startswith("t-ddp-1")]
        assert "m#1" not in set(compare.samples_by_row([mixed]))
    lines = [r.getMessage() for r in caplog.records]
    said = "non-regular files (a FIFO, a device, a folder) where perflab keeps a run's files"
    assert any(f"skipped 3 {said}" in line and "runs/x/results.csv" in line for line in lines), lines
    assert any("skipped 1 non-regular file (" in line and "runs/m/samples.csv" in line for line in lines), lines
    assert any("left out 1 run whose run.json is unreadable" in line for line in lines), lines
    assert compare.main([str(mixed), str(mixed)]) == 3  # judged (3 samples a side: inconclusive), not hung
    assert results_main([str(mixed)]) == 0
    out = capsys.readouterr().out
    assert f"skipped 3 {said}" in out and "t-ddp-1" not in out.split("skipped")[0]


def test_missing_rows_and_unreadable_records_one_rule_for_every_reader(tmp_path, capsys, caplog):
    tree = tmp_path / "d1"
    for name, damage in (("cut", "inside the header"), ("bare", "header only")):
        _run(tree, name, "matmul", [{"measurement": "cpu alone", "median_s": 0.02, "tflops": 0.1}])
        record = RunRecord.read(tree / "runs" / name)
        record.rows = 1
        record.save(tree / "runs" / name)
        results = tree / "runs" / name / "results.csv"
        header = results.read_text().splitlines()[0]
        results.write_text(header[:20] if damage == "inside the header" else header + "\n")
    shutil.rmtree(tree / ".perflab", ignore_errors=True)
    assert results_main([str(tree)]) == 0
    out = capsys.readouterr().out
    assert out.count("ok (1 of its 1 rows missing)") == 2
    assert "2 rows missing: a results.csv holds fewer rows than its run.json counts" in out
    for where in (tree, tree / "runs"):  # through the index, and run dir by run dir
        with caplog.at_level(logging.WARNING, logger="perflab"):
            assert load(where).empty
        assert "2 rows missing" in caplog.text and "skipped 1 torn or malformed line" in caplog.text
        caplog.clear()
    _run(tmp_path / "b", "b", "matmul", [{"measurement": "cpu alone", "median_s": 0.02, "tflops": 0.1}])
    assert compare.main([str(tmp_path / "b"), str(tree)]) == 2
    assert f"compare: error: NEW ({tree}): no rows to compare (" in capsys.readouterr().err


# --- outputs never replace a user's file ----------------------------------------------------------


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_report_and_plots_replace_only_what_perflab_wrote(mixed, tmp_path, capsys):
    mine = tmp_path / "mine.html"
    mine.write_text("my notes\n")
    link = tmp_path / "link.html"
    link.symlink_to(mine)
    for out in (mine, link, tmp_path):
        assert report.main([str(mixed), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and f"-o={out}" in err
    assert mine.read_text() == "my notes\n"
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "scaling.png").write_bytes(b"my picture")
    for where in (folder, mine, "/dev/null"):
        assert compare.main([str(mixed), "--plot", str(where)]) == 2
        assert "perflab compare: error: --plot=" in capsys.readouterr().err
    assert (folder / "scaling.png").read_bytes() == b"my picture" and mine.read_text() == "my notes\n"
    if plots.SOFTWARE and pytest.importorskip("matplotlib"):
        fresh = tmp_path / "fresh"
        assert compare.main([str(mixed), "--plot", str(fresh)]) == 0
        assert compare.main([str(mixed), "--plot", str(fresh)]) == 0, "a plot perflab wrote is replaced"
        assert report.main([str(mixed), "-o", str(tmp_path / "r.html")]) == 0
        assert report.main([str(mixed), "-o", str(tmp_path / "r.html")]) == 0


@pytest.mark.slow
def test_the_readmes_own_sequence_in_one_tree(cli, work, capsys):
    """One quick/matmul run, then the README's training sweep, in the same ./outputs: compare
    with a baseline, --plot and the report all work on it."""
    cli("+experiment=quick/matmul", *FAST, "results.table=false")
    cli(
        "-m",
        "+experiment=quick/train",
        "strategy=scratch,ddp",
        "devices.count=1,2",
        "data.train_size=1024",
        "trainer.epochs=4",
        "results.table=false",
    )
    assert compare.main(["outputs", "--experiment", "train", "--baseline", "devices.count=1"]) == 0
    out = capsys.readouterr().out
    assert out.count("| baseline |") == 2 and "no baseline" not in out
    pytest.importorskip("matplotlib")
    assert compare.main(["outputs", "--plot", "plots/"]) == 0
    assert (work / "plots" / "scaling.png").is_file()
    assert report.main(["outputs", "-o", "r.html"]) == 0
    html = (work / "r.html").read_text()
    assert "1024.0" not in html and "2.0 devices" not in html and 'class="noplot failed"' not in html
    df = load("outputs")
    assert pd.api.types.is_integer_dtype(df["cfg.devices.count"])
    assert sorted(df["cfg.devices.count"].dropna().unique()) == [1, 2]
    assert np.array_equal(sorted(df["cfg.data.train_size"].dropna().unique()), [1024])
    assert store.is_store(work / "outputs") and os.path.isdir(work / "outputs" / ".perflab" / "index")
