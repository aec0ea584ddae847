"""A cold load's two halves as issue 31 made them cheaper: files that share a header are parsed
together from their bytes (no decoding and re-encoding of every file), and the index segment is
written with dictionaries only where they pay. Neither changes a row, a type, or a note."""

from __future__ import annotations

import io

import pandas as pd
import pyarrow.parquet as pq
import pytest

from perflab.results import load
from perflab.store import index
from perflab.store.rows import (
    TORN,
    Notes,
    _text_dtypes,
    concat,
    csv_text,
    read_csv,
    read_many,
    type_config,
)


def _row(run: str, i: int, note: str) -> dict:
    return {
        "row_id": f"{run}#{i}",
        "run_id": run,
        "experiment": "matmul",
        "median_s": 0.1 * i,
        "note": note,
        "cfg.n": i,
    }


def _line_checked(paths, labels) -> pd.DataFrame:
    """What reading each file alone, line by line, gives."""
    each = [read_csv(p, notes=Notes()).assign(_file=label) for p, label in zip(paths, labels)]
    return concat([f for f in each if not f.empty])


def test_files_parsed_together_from_bytes_read_as_each_file_alone(tmp_path):
    """UTF-8 text beyond ASCII is parsed in the shared pass; a body of whitespace only (as
    str.strip sees it, non-ASCII spaces too) gives no rows and no note; undecodable bytes send
    the group to the line-checked reading, which skips that line and says so."""
    bodies = {
        "a": csv_text([_row("a", 1, "café ✓"), _row("a", 2, "naïve")]).encode(),
        "b": csv_text([_row("b", 1, "plain")]).encode(),
        "blank": csv_text([_row("blank", 1, "x")]).encode().split(b"\n")[0] + "\n\u00a0 \t\n".encode(),
    }
    paths = []
    for name, data in bodies.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.csv").write_bytes(data)
        paths.append(tmp_path / name / "results.csv")
    labels = [p.parent.name for p in paths]
    notes = Notes()
    together = read_many(paths, labels, "_file", notes)
    assert notes.kinds == {}
    assert together["note"].tolist() == ["café ✓", "naïve", "plain"]
    pd.testing.assert_frame_equal(together, _line_checked(paths, labels))

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.csv").write_bytes(
        bodies["b"].replace(b"plain", b"pl\xffain") + csv_text([_row("bad", 2, "ok")], header=False).encode()
    )
    notes = Notes()
    with_bad = read_many([*paths, bad / "results.csv"], [*labels, "bad"], "_file", notes)
    assert notes.kinds == {TORN: {str(bad / "results.csv"): 1}}
    assert with_bad["row_id"].tolist() == ["a#1", "a#2", "b#1", "bad#2"]


def _pandas_alone(data: bytes) -> pd.DataFrame:
    """The group as pandas' C parser alone reads it (as read_many did before Arrow took part)."""
    fields = data.split(b"\n")[0].decode().split(",")
    return type_config(
        pd.read_csv(io.BytesIO(data), low_memory=False, dtype=_text_dtypes(fields), skip_blank_lines=False)
    )


@pytest.mark.parametrize("short", [False, True], ids=["arrow and pandas", "a short line: pandas alone"])
def test_a_group_parsed_by_arrow_reads_as_pandas_alone_reads_it(tmp_path, short):
    """Every kind of column either parser may take: text and config keys with pandas' spellings
    of missing (``None``, ``<NA>``, ``nan``), integers with and without gaps (and past int64:
    pandas' unsigned ones), floats with ``nan`` and ``inf``, booleans with and without gaps, a
    column empty throughout, timestamps and a text column perflab does not know; the same values
    and types. A short line (pandas fills it with missing cells, Arrow refuses it) leaves the
    group to pandas."""
    header = "row_id,run_id,experiment,note,n,k,median_s,noisy,flag,empty,timestamp,mine,seed,"
    header += "cfg.m.size,cfg.m.dtype,cfg.m.on"
    lines = [
        "a#1,a,matmul,None,5,1,0.30000000000000004,True,True,,2026-11-22T10:00:00+00:00,x,9223372036854775808,64,float32,True",
        "a#2,a,matmul,<NA>,6,,nan,False,,,2026-11-22T10:00:01+00:00,y,18446744073709551615,,bfloat16,False",
        "a#3,a,matmul,caf\u00e9,7,3,inf,False,False,,,,1,128,nan,",
        "a#4,a,matmul,,8,4,1e-300,True,True,,2026-11-22T10:00:03+00:00,z,0,256,,True",
    ]
    if short:
        lines.append("a#5,a,matmul")
    data = ("\n".join([header, *lines]) + "\n").encode()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.csv").write_bytes(data)
    notes = Notes()
    got = read_many([tmp_path / "a" / "results.csv"], ["a"], "_file", notes)
    assert notes.kinds == {}
    pd.testing.assert_frame_equal(got.drop(columns="_file"), _pandas_alone(data), check_exact=True)
    assert (got["n"].dtype, got["k"].dtype, got["noisy"].dtype) == (
        ("float64", "float64", "object") if short else ("int64", "float64", "bool")
    )


@pytest.mark.parametrize("stamp", ["2026-11-22T10:00:00+00:00", "1700000000"], ids=["times", "numbers"])
def test_a_group_arrow_reads_whole_is_not_parsed_again_by_pandas(tmp_path, monkeypatch, stamp):
    """Text, integers and timestamps (read by Arrow as text, as pandas reads them): no pandas pass
    over the group, the same frame, and its columns writable as pandas' own. A timestamp column
    of numbers only (which pandas reads as numbers) is pandas' to parse."""
    data = f"row_id,run_id,n,note,timestamp\na#1,a,5,x,{stamp}\na#2,a,6,,\n".encode()  # no floats: pandas' in pandas 2
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.csv").write_bytes(data)
    alone = _pandas_alone(data)
    if ":" in stamp:
        monkeypatch.setattr(pd, "read_csv", lambda *a, **k: pytest.fail("pandas parsed the group"))
    got = read_many([tmp_path / "a" / "results.csv"], ["a"], "_file", Notes())
    pd.testing.assert_frame_equal(got.drop(columns="_file"), alone, check_exact=True)
    got.loc[0, "n"] = 7  # no read-only array of Arrow's underneath
    assert got["n"].tolist() == [7, 6]


def test_a_segment_holds_dictionaries_but_for_floats_and_the_statistics_a_load_filters_on(tmp_path):
    """Floats (measurements: seldom a value twice) are written plain; text, categories and
    integers as dictionaries; every column keeps its statistics (the warm load's row-group
    filter on ``experiment``, its constant and empty Int64 columns)."""
    df = pd.DataFrame(
        {
            "experiment": pd.Series(["matmul", "matmul", "train"], dtype="category"),
            "median_s": [0.1, 0.2, 0.3],
            "cfg.n": pd.array([64, 64, None], dtype="Int64"),
            "mixed": [1, "x", None],  # numbers in one run, text in another: written as text
        }
    )
    before = df.copy()
    segment = pq.ParquetFile(io.BytesIO(index.to_parquet(df)))
    pd.testing.assert_frame_equal(df, before)  # the caller's frame is not changed
    assert segment.metadata.num_row_groups == 2  # a row group a stretch of one experiment
    first = segment.metadata.row_group(0)
    encodings = {first.column(i).path_in_schema: first.column(i).encodings for i in range(first.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["median_s"]
    assert all("RLE_DICTIONARY" in encodings[c] for c in ("experiment", "cfg.n", "mixed"))
    stats = [first.column(i).statistics for i in range(first.num_columns)]
    assert all(s is not None and s.has_min_max for s in stats)
    assert segment.read().column("mixed").to_pylist() == ["1", "x", None]


def test_a_cold_load_and_the_warm_load_after_it_give_the_same_frame(tmp_path):
    """The frame read from CSV (cold) and the one read back from the segment it wrote (warm)."""
    for name, note in (("r1", "café"), ("r2", "plain")):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "results.csv").write_text(csv_text([_row(name, 1, note), _row(name, 2, note)]))
    cold, warm = load(tmp_path), load(tmp_path)
    assert len(cold) == 4 and cold["median_s"].dtype == "float64"
    pd.testing.assert_frame_equal(cold, warm)
