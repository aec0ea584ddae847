"""Rows on disk: flattening, atomic job files, a shared ledger under concurrency, load()."""

from __future__ import annotations

import csv
import multiprocessing as mp
from pathlib import Path

import pandas as pd
import pytest

from perflab.results import ResultsWriter, append_to_ledger, flatten, load, summary_table, write_csv


def row(run: str, i: int, **extra) -> dict:
    return {"row_id": f"{run}#{i}", "run_id": run, "experiment": "matmul", "measurement": f"m{i}",
            "status": "ok", "n": 5, "median_s": 0.25 * (i + 1), "noisy": False, "error": "",
            "timestamp": "2026-11-22T10:00:00+00:00", "cuda": "13.0", **extra}


def test_flatten_names_every_leaf():
    flat = flatten({"experiment": {"name": "matmul", "size": 64}, "devices": {"spec": ["cuda:0", "cpu"]}, "seed": 0})
    assert flat == {"cfg.experiment.name": "matmul", "cfg.experiment.size": 64,
                    "cfg.devices.spec": '["cuda:0", "cpu"]', "cfg.seed": 0}


def test_round_trip_to_pandas_with_dtypes(tmp_path):
    size = {"cfg.experiment.size": 64}
    write_csv(tmp_path / "results.csv", [row("r1", 0, **size), row("r1", 1, status="error", error="RuntimeError: boom",
                                                                   **size)])
    df = load(tmp_path / "results.csv")
    assert list(df["measurement"]) == ["m0", "m1"]
    assert df["median_s"].tolist() == [0.25, 0.5]
    assert df["n"].dtype == "Int64" and df["noisy"].dtype == "boolean"
    assert pd.api.types.is_datetime64_any_dtype(df["timestamp"])
    assert isinstance(df["status"].dtype, pd.CategoricalDtype)
    assert df["cuda"].tolist() == ["13.0", "13.0"]  # a version stays text, not the float 13.0
    assert df.loc[1, "error"] == "RuntimeError: boom" and pd.isna(df.loc[0, "error"])
    assert df["cfg.experiment.size"].tolist() == [64, 64]


def test_ledger_survives_different_column_sets(tmp_path):
    ledger = tmp_path / "ledger.csv"
    append_to_ledger(ledger, [row("a", 0)])
    append_to_ledger(ledger, [row("b", 0, tflops=1.5)])
    append_to_ledger(ledger, [row("c", 0)])
    with ledger.open() as f:
        lines = f.read().splitlines()
    assert sum(1 for line in lines if line.startswith("row_id,")) == 1
    df = load(ledger)
    assert df["run_id"].tolist() == ["a", "b", "c"]
    assert pd.isna(df.loc[0, "tflops"]) and df.loc[1, "tflops"] == 1.5


def _append_many(ledger: str, worker: int, count: int) -> None:
    for i in range(count):
        extra = {f"only_worker_{worker}": i} if i % 5 == 0 else {}
        append_to_ledger(Path(ledger), [row(f"w{worker}", i, **extra)])


def test_many_processes_append_to_one_ledger(tmp_path):
    ledger = tmp_path / "outputs" / "results.csv"
    workers, count = 6, 20
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(ledger), w, count)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with ledger.open(newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert sum(1 for r in rows if r and r[0] == "row_id") == 1
    assert all(len(r) == len(header) for r in body)
    ids = {r[header.index("row_id")] for r in body}
    assert ids == {f"w{w}#{i}" for w in range(workers) for i in range(count)}
    assert {f"only_worker_{w}" for w in range(workers)} <= set(header)


def test_writer_keeps_every_finished_row_and_samples(tmp_path):
    run = tmp_path / "run"
    writer = ResultsWriter(run, tmp_path / "ledger.csv")
    writer.add(row("r", 0), samples=[1.0, 2.0], warmup=[5.0])
    writer.add(row("r", 1))
    assert len(load(run / "results.csv")) == 2
    samples = load(run, samples=True)
    assert samples["seconds"].tolist() == [5.0, 1.0, 2.0]
    assert samples["phase"].tolist() == ["warmup", "sample", "sample"]
    assert not list(run.glob(".*.tmp"))  # atomic writes leave no temp files


def test_writer_keeps_rows_another_process_wrote_to_the_same_job(tmp_path):
    parent = ResultsWriter(tmp_path / "job", None)
    parent.add({"run_id": "r", "measurement": "before", "status": "ok"})
    ResultsWriter(tmp_path / "job", None).add({"run_id": "r", "measurement": "rank 0", "status": "ok"})  # e.g. DDP
    parent.add({"run_id": "r", "measurement": "after", "status": "error"})
    df = load(tmp_path / "job" / "results.csv")
    assert df["measurement"].tolist() == ["before", "rank 0", "after"]
    assert df["row_id"].tolist() == ["r#1", "r#2", "r#3"]


def test_load_a_tree_keeps_each_row_once(tmp_path):
    out = tmp_path / "outputs"
    for run in ("r1", "r2"):
        w = ResultsWriter(out / "runs" / run, out / "results.csv")
        w.add(row(run, 0))
    df = load(out)  # finds both job files and the ledger that repeats them
    assert sorted(df["row_id"]) == ["r1#0", "r2#0"]
    assert load(out / "runs" / "r1")["run_id"].tolist() == ["r1"]


def test_load_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nope")


def test_summary_table_shows_status_and_throughput():
    text = summary_table([{**row("r", 0), "median_s": 0.0123, "iqr_s": 0.0001, "tflops": 12.5},
                          {"measurement": "copy", "status": "skipped", "error": "needs a CUDA device"}])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["measurement", "status", "n"]
    assert "12.3 ms" in lines[2] and "12.5 TFLOP/s" in lines[2]
    assert "skipped" in lines[3] and "needs a CUDA device" in lines[3]
