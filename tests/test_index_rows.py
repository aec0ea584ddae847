"""The index gives each row id once, as reading the run dirs one by one does: a segment's manifest
holds the span of its row ids when each is there once, so that a load of segments whose spans are
apart skips the look; a run dir copied within the tree (its row ids twice) still loads once,
whatever wrote the index."""

from __future__ import annotations

import json
import shutil

import pandas as pd

from perflab.results import load
from perflab.store import index
from perflab.store.rundir import RunWriter


def _run(out, name: str, rows: int = 2, experiment: str = "matmul") -> None:
    w = RunWriter(out / "runs" / name)
    for i in range(rows):
        w.add({"run_id": name, "experiment": experiment, "status": "ok", "median_s": 0.5 + i, "cfg.size": 64 * i})


def _manifests(out) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / ".perflab" / "index").glob("*.json"))]


def _same(through_index, files) -> None:
    """The same rows, values and types (the columns in any order)."""
    in_order = lambda df: df.sort_values(["row_id", "run_dir"], ignore_index=True)  # noqa: E731
    pd.testing.assert_frame_equal(in_order(through_index), in_order(files), check_like=True)  # run_dir last here


def test_a_run_dir_copied_in_the_tree_loads_once_through_the_index_cold_warm_and_merged(tmp_path):
    out = tmp_path / "outputs"
    for i in range(3):
        _run(out, f"r{i}")
    shutil.copytree(out / "runs" / "r1", out / "runs" / "r1-copy")  # its row ids twice in the tree
    files = load(out / "runs")  # not a results tree: read run dir by run dir
    assert len(files) == 6 and files["row_id"].is_unique
    cold = load(out)  # the index built
    assert [m["row_ids"] for m in _manifests(out)] == [None]
    _same(cold, files)
    _same(load(out), files)  # warm: the segment's manifest says it must look
    _same(load(out, experiment="matmul"), files)
    for i in range(index.MAX_SEGMENTS + 1):  # a segment a new run dir, then all merged into one
        _run(out, f"s{i}", rows=1)
        grown = load(out)
    assert len(_manifests(out)) <= 2 and _manifests(out)[0]["row_ids"] is None
    _same(grown, load(out / "runs"))
    assert len(grown) == 6 + index.MAX_SEGMENTS + 1


def test_segments_apart_in_row_ids_are_not_looked_through_and_an_older_manifest_loads_the_same(tmp_path):
    out = tmp_path / "outputs"
    for i in range(3):
        _run(out, f"r{i}")
    load(out)
    assert [m["row_ids"] for m in _manifests(out)] == [["r0#1", "r2#2"]]
    _same(load(out), load(out / "runs"))
    _run(out, "r3")  # a new run: its rows a segment of their own, their ids after all the others
    assert len(load(out)) == 8
    assert [m["row_ids"] for m in _manifests(out)] == [["r0#1", "r2#2"], ["r3#1", "r3#2"]]
    assert index._apart([("r0#1", "r2#2"), ("r3#1", "r3#2")])
    shutil.copytree(out / "runs" / "r2", out / "runs" / "r2-copy")  # unique in itself, not beside r2
    after = load(out)
    assert _manifests(out)[-1]["row_ids"] == ["r2#1", "r2#2"]
    assert not index._apart([("r0#1", "r2#2"), ("r3#1", "r3#2"), ("r2#1", "r2#2")])
    assert len(after) == 8, "the copy's rows are there twice across two segments: kept once"
    _same(after, load(out / "runs"))
    for path in (out / ".perflab" / "index").glob("*.json"):  # as perflab 0.3 wrote them: no row_ids
        manifest = json.loads(path.read_text())
        del manifest["row_ids"]
        path.write_text(json.dumps(manifest))
    _same(load(out), after)
    _same(load(out, experiment="matmul"), after)


def test_a_warm_load_looks_for_repeated_row_ids_only_where_parts_overlap(tmp_path, monkeypatch):
    """Counted through the real look (index._twice): none on a warm load, none beside a segment
    of no rows (a run dir of foreign rows only), one where a copied run dir's rows overlap."""
    out = tmp_path / "outputs"
    for i in range(3):
        _run(out, f"r{i}")
    load(out)
    foreign = out / "runs" / "foreign"
    foreign.mkdir(parents=True)
    (foreign / "results.csv").write_text("a,b\n1,2\n")  # not perflab's: skipped, a segment of no rows
    load(out)
    assert [m["row_ids"] for m in _manifests(out)] == [["r0#1", "r2#2"], None]
    looks = []
    real = index._twice
    monkeypatch.setattr(index, "_twice", lambda df: looks.append(len(df)) or real(df))
    assert len(load(out)) == 6 and looks == []
    _run(out, "r3")
    assert len(load(out)) == 8 and looks == []
    shutil.copytree(out / "runs" / "r3", out / "runs" / "r3-copy")
    assert len(load(out)) == 8 and looks == [10]


def test_a_segment_gives_only_the_rows_of_run_dirs_the_walk_finds_as_stamped(tmp_path):
    """Segments are read while the run dirs are walked, and their rows kept only where the walk
    finds each run dir as the segment's manifest stamped it: of a segment of three run dirs, one
    unchanged (its rows from the index), one gone (none of its rows) and one changed (its rows
    from the files, once, in their new form); and a segment whose run dirs all went gives none."""
    out = tmp_path / "outputs"
    _run(out, "r0")
    load(out)
    for name in ("r1", "r2", "r3"):
        _run(out, name)
    load(out)  # r1, r2 and r3: a segment of their own
    assert len(_manifests(out)) == 2
    shutil.rmtree(out / "runs" / "r2")
    RunWriter(out / "runs" / "r3").add({"run_id": "r3", "experiment": "matmul", "status": "ok", "median_s": 9.0})
    for _ in range(2):  # the changed run dir read again (a third segment), then through the index
        df = load(out)
        _same(df, load(out / "runs"))
        assert sorted(df["row_id"]) == ["r0#1", "r0#2", "r1#1", "r1#2", "r3#1", "r3#2", "r3#3"]
        assert sorted(load(out, experiment="matmul")["median_s"]) == [0.5, 0.5, 0.5, 1.5, 1.5, 1.5, 9.0]
    shutil.rmtree(out / "runs" / "r1")
    shutil.rmtree(out / "runs" / "r3")
    assert sorted(load(out)["row_id"]) == ["r0#1", "r0#2"]
