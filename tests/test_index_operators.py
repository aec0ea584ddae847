"""The index keeps each profiled run's operators.csv beside its rows (a table keyed by row id, as
the samples are): load_operators reads a results tree's from it, the same frame the files give,
parses no operators.csv of a run dir indexed already, and reads again one that changed."""

from __future__ import annotations

import json
import logging

import pandas as pd
import pytest

from perflab.measure import operators
from perflab.results import load, load_operators
from perflab.store import files, index
from perflab.store.rundir import RunWriter

OPS = {"aten::mm": 2e-3, "aten::gelu": 1e-3, "my_block": 3.2e-3}


def _profiled(run_dir, name: str, k: int, experiment: str, rows: int = 1) -> None:
    """A run of ``rows`` profiled rows, each with its operator lines (``process`` ``k``, or none: 0)."""
    w = RunWriter(run_dir)
    for m in range(rows):
        row = {"run_id": name, "experiment": experiment, "status": "ok", "measurement": f"m{m}"}
        row |= {"process": k or None, "median_s": 0.006 * (k + 1)}
        written = w.add(row, samples=[0.006, 0.0061, 0.0062])
        lines = pd.DataFrame(
            {
                "operator": list(OPS),
                "kind": ["op", "op", "range"],
                "device": "cpu",
                "calls": 1.0,
                "self_s": [t * (k + 1) for t in OPS.values()],
            }
        )
        operators.write(run_dir, written, lines.assign(share=lines["self_s"] / 0.007, profiled_s=0.007))


def _tree(root):
    """Five runs of two experiments: four profiled (one without a process number), one not."""
    for k in range(4):
        _profiled(root / "runs" / f"r{k}", f"r{k}", k, ("matmul", "train")[k % 2], rows=1 + k % 2)
    RunWriter(root / "runs" / "plain").add({"run_id": "plain", "experiment": "matmul", "status": "ok"})
    return root


def _from_files(tree):
    """The operators of the tree's run dirs, each operators.csv parsed (runs/ is no results tree)."""
    return load_operators(tree / "runs")


def _no_csv(monkeypatch) -> None:
    """From here on, parsing any CSV file fails the test (perflab's reader, pandas' or Arrow's)."""
    import pyarrow.csv

    def parsed(*args, **kwargs):
        raise AssertionError("a CSV was parsed: the index holds what was asked for")

    for module, name in ((index, "read_many"), (pd, "read_csv"), (pyarrow.csv, "read_csv")):
        monkeypatch.setattr(module, name, parsed)


def test_operators_come_from_the_index_as_from_the_files_and_no_csv_is_parsed_again(tmp_path, monkeypatch):
    tree = _tree(tmp_path / "outputs")
    expected = _from_files(tree)
    assert list(expected.columns) == [*operators.KEYS, *operators.COLUMNS, "run_dir"]
    assert len(expected) == 3 * 6 and set(expected["experiment"]) == {"matmul", "train"}
    assert expected["row_id"].is_monotonic_increasing, "sorted by row_id"
    cold = load_operators(tree)  # the index built: rows, samples, operators
    assert list((tree / ".perflab" / "index" / index.OPERATORS_TABLE.name).glob("*.parquet"))
    pd.testing.assert_frame_equal(cold, expected)
    _no_csv(monkeypatch)
    warm = load_operators(tree)
    pd.testing.assert_frame_equal(warm, expected)
    assert warm["row_id"].dtype == "string" and warm["process"].dtype == "string"
    assert warm["self_s"].dtype == "float64" and warm["run_dir"].dtype == "string"
    assert sorted(set(warm["process"].dropna())) == ["1", "2", "3"], "a process number as text, never 1.0"
    first = warm[warm["row_id"] == "r1#1"]
    assert first["operator"].tolist() == list(OPS), "each row's operators in the order written"
    assert first["run_dir"].iloc[0] == str((tree / "runs" / "r1").resolve())


def test_operators_are_indexed_by_a_load_of_rows(tmp_path, monkeypatch):
    tree = _tree(tmp_path / "outputs")
    expected = _from_files(tree)
    load(tree)  # the index built by the rows' reader
    _no_csv(monkeypatch)
    pd.testing.assert_frame_equal(load_operators(tree), expected)


def test_a_changed_operators_csv_is_read_again(tmp_path, monkeypatch):
    """The rows stay as they were: only operators.csv changed (its stamp is in the run dir's)."""
    tree = _tree(tmp_path / "outputs")
    load_operators(tree)
    with (tree / "runs" / "r2" / "operators.csv").open("a") as f:
        f.write("r2#1,r2,2,matmul,m0,0.018,aten::add,op,cpu,2.0,0.0004,0.05,0.007\n")
    (tree / "runs" / "r0" / "operators.csv").unlink()
    got = load_operators(tree)
    pd.testing.assert_frame_equal(got, _from_files(tree))
    added = got[got["operator"] == "aten::add"]
    assert added["row_id"].tolist() == ["r2#1"] and added["calls"].tolist() == [2.0]
    assert "r0#1" not in set(got["row_id"]), "an operators.csv gone: its lines gone"
    _no_csv(monkeypatch)
    pd.testing.assert_frame_equal(load_operators(tree), got)


def test_an_index_built_before_operators_were_indexed_is_rebuilt(tmp_path, caplog):
    """A format-4 segment (perflab before operators were indexed: rows and samples alone) is
    rebuilt from its run dirs, never read as if it held no operators."""
    tree = _tree(tmp_path / "outputs")
    expected = _from_files(tree)
    load(tree)
    where = tree / ".perflab" / "index"
    (manifest,) = where.glob("*.json")
    data = json.loads(manifest.read_text())
    del data["files"][index.OPERATORS_TABLE.name]
    data["format"], data["sample_notes"] = 4, data.pop("table_notes")
    data["sources"] = {source: stamp[:6] for source, stamp in data["sources"].items()}  # no operators.csv stamped
    manifest.write_text(json.dumps(data))
    (where / index.OPERATORS_TABLE.name / f"{manifest.stem}.parquet").unlink()
    with caplog.at_level(logging.WARNING, logger="perflab"):
        got = load_operators(tree)
    pd.testing.assert_frame_equal(got, expected)
    assert "rebuilt 1 index segment written by another perflab version" in caplog.text
    assert not manifest.exists()
    assert [json.loads(p.read_text())["format"] for p in where.glob("*.json")] == [index.FORMAT]


def test_a_damaged_operators_segment_is_rebuilt_from_the_run_dirs(tmp_path, caplog):
    tree = _tree(tmp_path / "outputs")
    expected = load_operators(tree)
    (segment,) = (tree / ".perflab" / "index" / index.OPERATORS_TABLE.name).glob("*.parquet")
    segment.write_bytes(segment.read_bytes()[:-100])
    with caplog.at_level(logging.WARNING, logger="perflab"):
        got = load_operators(tree)
    pd.testing.assert_frame_equal(got, expected)
    assert "rebuilt 1 damaged index segment" in caplog.text


def test_an_index_that_cannot_be_written_still_gives_the_operators(tmp_path, monkeypatch):
    """A tree the index cannot be written in (read-only): the operators read from the files are
    given from memory, the same frame."""
    tree = _tree(tmp_path / "outputs")
    expected = _from_files(tree)

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files, "write_atomic", refused)
    pd.testing.assert_frame_equal(load_operators(tree), expected)
    assert not list((tree / ".perflab" / "index").glob("*.json")), "nothing written"


def test_a_torn_line_of_operators_csv_is_skipped_and_said_on_every_read(tmp_path, caplog):
    tree = _tree(tmp_path / "outputs")
    with (tree / "runs" / "r1" / "operators.csv").open("a") as f:
        f.write("r1#1,r1,1,train,m0,0.012,aten::a")  # torn
    for _ in range(2):  # from the files (the index built), then from the index's manifest
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="perflab"):
            got = load_operators(tree)
        assert "skipped 1 torn or malformed line" in caplog.text and "r1/operators.csv" in caplog.text
        assert len(got) == 3 * 6


@pytest.mark.parametrize("first", ["files", "index"])
def test_a_run_dir_copied_in_the_tree_gives_its_operators_once(tmp_path, first):
    import shutil

    tree = _tree(tmp_path / "outputs")
    if first == "index":
        load(tree)
    shutil.copytree(tree / "runs" / "r1", tree / "runs" / "r1-copy")  # its row ids twice in the tree
    for _ in range(2):
        got = load_operators(tree)
        assert len(got) == 3 * 6 and not got.duplicated(["row_id", "operator", "kind", "device"]).any()
