"""``python -m perflab.results``: past runs like ``git log``, one run's table, reindex, export;
and the terminal: a status line while measuring (on a terminal only), tables that wrap."""

from __future__ import annotations

import io
import json
import os
import re
import shutil

import pandas as pd
import pytest

from perflab import app, results
from perflab.analysis.table import job_table
from perflab.job import context
from perflab.store.rundir import folder_id

from conftest import FAST

# One worker builds the runs below, once, and runs every test of this module.
pytestmark = pytest.mark.xdist_group("results_history")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A run, a sweep of two points (one refused) and a training run: built once per module."""
    root = tmp_path_factory.mktemp("history")
    jobs = [
        ["+experiment=quick/matmul", *FAST, "results.table=false"],
        [
            "-m",
            "+experiment=quick/matmul",
            *FAST,
            "devices.spec=cpu,[cuda:99]",
            "devices.on_missing=error",
            "results.table=false",
        ],
        [
            "+experiment=quick/train",
            "data.train_size=256",
            "data.test_size=64",
            "trainer.epochs=1",
            *FAST,
            "results.table=false",
        ],
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for args in jobs:
            assert app.main(args) == 0, args
    return root / "outputs"


@pytest.fixture
def history(built, work):
    """Each test's own copy of the tree (some damage it)."""
    shutil.copytree(built, work / "outputs")
    return work / "outputs"


def test_the_run_list_shows_each_run_with_its_outcome_keys_and_figure(history, capsys):
    assert results.main([str(history)]) == 0
    out = capsys.readouterr().out
    blocks = [b for b in out.split("\n") if b and not b.startswith(" ")]
    assert len(blocks) == 4, out  # newest first: train, the sweep's two points, the matmul run
    assert blocks[0].split()[3] == "train" and "ok (" in blocks[0]
    assert "refused" in out and "devices.spec=[cuda:99]: this machine has no CUDA device" in out
    assert "images/s" in out and re.search(r"\d [TGM]FLOP/s", out), "a matmul's rate, in the unit it reads best in"
    assert re.search(r"\n    [^\n:]+: [\d.,]+ [TGM]FLOP/s", out), "the figure named by its row's measurement"
    assert "devices.spec=cpu" in out, "the keys a point set"


def test_show_prints_one_runs_table_by_id_prefix(history, capsys):
    run_id = results.runs(history)[0][1].run_id
    assert results.main(["show", run_id[:20], str(history)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(run_id) and "measurement" in out and "images/s" in out
    assert results.main(["show", "nope", str(history)]) == 2
    assert "nope: no run with that id" in capsys.readouterr().err
    for ref in ("", "/etc"):  # not a run: refused, not an empty table
        assert results.main(["show", ref, str(history)]) == 2
    assert results.main(["show"]) == 2 and "show: needs RUN" in capsys.readouterr().err


def test_reindex_and_export(history, capsys, work):
    assert results.main(["reindex", str(history)]) == 0
    assert "complete runs" in capsys.readouterr().out
    assert results.main(["export", str(work / "all.csv"), str(history)]) == 0
    assert len(results.load(work / "all.csv")) == len(results.load(history))
    assert results.main([str(work / "nowhere")]) == 2
    assert results.main(["reindex", str(work / "nowhere")]) == 2 and not (work / "nowhere").exists()
    assert results.main(["export"]) == 2 and "export: needs FILE" in capsys.readouterr().err
    (work / "notes.txt").write_text("mine\n")
    assert results.main(["export", str(work / "notes.txt"), str(history)]) == 2
    assert (work / "notes.txt").read_text() == "mine\n", "a file that is not an export is never replaced"
    assert results.main(["export", str(work / "all.csv"), str(history)]) == 0  # an earlier export is


def test_a_damaged_run_is_left_out_and_said_and_damaged_cells_read_as_missing(history, capsys):
    (first, _), (second, _), (third, _) = results.runs(history)[:3]
    (first / "run.json").write_text("[1]")
    record = json.loads((second / "run.json").read_text())
    (second / "run.json").write_text(json.dumps({**record, "started": 5}))
    assert results.main([str(history)]) == 0
    out = capsys.readouterr().out
    said = "left out 2 runs whose run.json is unreadable (damaged, or not perflab's)"
    assert f"{said}: {first / 'run.json'}, {second / 'run.json'}" in out and third.name in out
    df = results.load(history)  # the loader: the same rule, said in the same words
    assert not ({first.name, second.name} & {os.path.basename(d) for d in df["run_dir"]})
    assert any(note.startswith(said) for note in df.attrs["notes"])
    missing = df["median_s"].isna().sum()
    table = pd.read_csv(third / "results.csv", dtype=str, keep_default_na=False)
    table.loc[0, "median_s"] = "notanumber"
    table.to_csv(third / "results.csv", index=False)
    df = results.load(history)
    assert pd.api.types.is_numeric_dtype(df["median_s"]) and df["median_s"].isna().sum() == missing + 1


def test_notes_wrap_instead_of_being_cut():
    note = "nn.DataParallel splits batches over CUDA devices only: on the CPU it runs the module once " * 2
    text = job_table([{"measurement": "epoch", "status": "ok", "note": note}])
    assert "runs the module once" in text.replace("\n    ", " ") and max(map(len, text.splitlines())) <= 120


def test_the_flags_column_is_named_and_only_there_when_a_row_is_flagged():
    calm = {"measurement": "alone", "status": "ok", "n": 6, "median_s": 0.09, "iqr_s": 0.001}
    noisy = {**calm, "measurement": "together", "noisy": True}
    flagged = job_table([calm, noisy]).splitlines()
    assert flagged[0].split()[-1] == "flags" and flagged[-1].split()[-1] == "noisy"
    assert "flags" not in job_table([calm]).splitlines()[0]


def test_a_status_line_shows_on_a_terminal_and_erases_itself(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Terminal()
    monkeypatch.setattr(context.sys, "stderr", err)
    clock = iter([0.0, 1.0, 2.0, 3.0])
    monkeypatch.setattr(context.time, "monotonic", lambda: next(clock))
    with context.Status("cpu alone") as status:
        status.sampled()
        status.sampled()
    text = err.getvalue()
    assert "measuring cpu alone: 1 samples" in text and text.endswith("\r\033[K")


def test_the_run_id_shown_is_found_in_the_run_folders_name(history, capsys):
    """``perflab results`` showed ``20261124-111316-4ecf12b771c1`` for the folder
    ``…_05555a3e``: now the id names its folder (a sweep job's: the sweep's id and its number),
    and that part alone finds the run."""
    found = results.runs(history)
    assert len(found) == 4
    for run_dir, record in found:
        short = folder_id(run_dir)
        assert short and record.run_id.split("-")[2] == short, (run_dir, record.run_id)
        where = str(run_dir.relative_to(history))
        assert short.split(".")[0] in where
        assert results.find_run(short, history) == run_dir
    assert sum("." in folder_id(d) for d, _ in found) == 2  # the sweep's two jobs
    assert results.main([str(history)]) == 0
    listed = capsys.readouterr().out
    for run_dir, record in found:
        assert record.run_id in listed and folder_id(run_dir).split(".")[0] in listed


def test_an_iqr_of_few_samples_and_a_tiny_rate_read_as_what_they_are():
    """From 3 samples an IQR says little: "?" (the n beside it), never a reassuring "0.0%"; a rate
    of 2.51e-05 TFLOP/s reads 25.1 MFLOP/s, in the progress line and the job's table alike."""
    from perflab.analysis.table import progress_line

    few = {"measurement": "cpu alone", "status": "ok", "n": 3, "median_s": 0.19, "iqr_s": 0.0, "tflops": 2.51e-05}
    line = progress_line(few, "tflops")
    assert "IQR ?, n=3" in line and "25.1 MFLOP/s" in line and "e-05" not in line
    assert "0.0%" not in job_table([few], metric="tflops") and "25.1 MFLOP/s" in job_table([few], metric="tflops")
    enough = {**few, "n": 5, "iqr_s": 0.019, "tflops": 0.131}
    assert "IQR 10.0%, n=5" in progress_line(enough, "tflops") and "0.131 TFLOP/s" in progress_line(enough, "tflops")
