"""The one vocabulary: what a column is (perflab.store.columns) and how a job or row ended
(perflab.store.outcome), read the same way by the rows, loading, compare and the terminal."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perflab import compare
from perflab.analysis.table import figure, rate
from perflab.job.ending import Result
from perflab.store import columns
from perflab.store.outcome import ROW_STATUSES, Outcome, exit_code
from perflab.store.rows import csv_text, fix_dtypes, order_columns, read_csv


def test_rows_lead_with_the_tables_columns_in_its_order_then_the_rest_then_config():
    given = ["cfg.trainer.lr", "my_figure", "tflops", "status", "row_id", "median_s"]
    assert order_columns(given) == ["row_id", "status", "median_s", "tflops", "my_figure", "cfg.trainer.lr"]


def test_a_cell_is_read_back_as_the_table_says(tmp_path):
    path = tmp_path / "results.csv"
    row = {"row_id": "007", "run_id": "r1", "job_num": "3", "noisy": "True", "median_s": "junk"}
    row |= {"status": "ok", "git_sha": "1e5"}
    path.write_text(csv_text([row], list(row)))
    df = fix_dtypes(read_csv(path))
    assert df["row_id"].iloc[0] == "007" and df["git_sha"].iloc[0] == "1e5", "text stays text"
    assert str(df["job_num"].dtype) == "Int64" and str(df["noisy"].dtype) == "boolean"
    assert pd.isna(df["median_s"].iloc[0]), "a damaged figure reads as missing"
    assert str(df["status"].dtype) == "category"


def test_units_and_directions_come_from_one_table():
    assert columns.unit_of("bus_gbps") == "GB/s (bus)"
    assert rate({"bus_gbps": 12.0}, "bus_gbps") == "12 GB/s (bus)", "the terminal says what compare says"
    assert rate({"items_per_s": 20000.0, "items_unit": "tokens"}) == "20,000 tokens/s"
    assert figure({"median_s": 0.0015}, "median_s") == "1.5 ms"
    assert columns.higher_is_better("tflops") and not columns.higher_is_better("median_s")
    assert columns.higher_is_better("tokens_per_s"), "a user's own rate is judged as a rate"
    assert compare.higher_is_better is columns.higher_is_better


def test_each_outcome_has_one_exit_code_and_says_whether_it_failed():
    tmp = Path(".")
    assert [Result(o, tmp).exit_code for o in ("ok", "done", "skipped")] == [0, 0, 0]
    assert Result("refused", tmp).exit_code == 2 and Result("cancelled", tmp).exit_code == 130
    assert exit_code("not an outcome") == 1, "an unknown word never passes"
    assert Outcome("oom").failed and not Outcome("skipped").failed
    assert set(ROW_STATUSES) < set(Outcome) and Outcome.REFUSED not in ROW_STATUSES
