"""load() gives each column the type perflab.store.columns names, on whichever pandas is
installed: pyproject allows pandas 2 and 3, and .ci/run runs this file on the lowest allowed."""

from __future__ import annotations

import pandas as pd
import pytest

from perflab.results import load
from perflab.store import columns
from perflab.store.rundir import RunWriter


def kind_holds(kind: str, dtype) -> bool:
    """Whether ``dtype`` is what a column of ``kind`` loads as (text: a pandas string dtype, never object)."""
    return {
        "text": lambda: isinstance(dtype, pd.StringDtype),
        "float": lambda: pd.api.types.is_float_dtype(dtype),
        "int": lambda: str(dtype) == "Int64",
        "flag": lambda: str(dtype) == "boolean",
        "category": lambda: isinstance(dtype, pd.CategoricalDtype),
        "time": lambda: isinstance(dtype, pd.DatetimeTZDtype) and str(dtype.tz) == "UTC",
    }[kind]()


def rows(run: str) -> list[dict]:
    return [
        {
            "row_id": f"{run}#{i}",
            "run_id": run,
            "experiment": "matmul",
            "measurement": f"m{i}",
            "status": "ok",
            "error": "" if i else "boom",
            "job_num": 3,
            "n": 5,
            "median_s": 0.25 * (i + 1),
            "noisy": bool(i),
            "timestamp": "2026-11-22T10:00:00+00:00",
            "cuda": "13.0",
            "git_sha": "1e5",
            "cfg.size": 64,
        }
        for i in range(2)
    ]


@pytest.mark.parametrize("where", ["tree", "tree again (its index)", "run dirs"])
def test_every_known_column_loads_as_its_kind(tmp_path, where):
    out = tmp_path / "outputs"
    for run in ("r1", "r2"):
        w = RunWriter(out / "runs" / run)
        for r in rows(run):
            w.add(r)
    if where == "tree again (its index)":
        load(out)
    df = load(*(sorted((out / "runs").iterdir()) if where == "run dirs" else [out]))
    assert len(df) == 4
    known = {c: columns.COLUMNS[c].kind for c in df if c in columns.COLUMNS and columns.COLUMNS[c].kind}
    assert {"row_id", "run_dir", "job_num", "noisy", "status", "timestamp", "median_s"} <= set(known)
    wrong = {c: str(df[c].dtype) for c, kind in known.items() if not kind_holds(kind, df[c].dtype)}
    assert not wrong, f"pandas {pd.__version__}: columns not of their kind: {wrong}"
    assert str(df["cfg.size"].dtype) == "Int64", "an integer config key stays integer"
    assert df["git_sha"].iloc[0] == "1e5", "text stays text"
