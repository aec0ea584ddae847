"""The warm cache (``.perflab/index/warm.arrow``): a load of unchanged segments maps the frame the
last full load built instead of decoding Parquet. It loads equal to reading the run dirs, its
frame is writable without touching the file, and a damaged, truncated, stale or unwritable
cache never gives wrong rows."""

from __future__ import annotations

import os
import shutil
import stat
import threading

import pandas as pd
import pytest

from perflab.results import load
from perflab.store import index, tree, warm
from perflab.store.rundir import RunWriter


@pytest.fixture(autouse=True)
def _small_trees_cached(monkeypatch):
    """These trees hold a few rows: kept as a big tree's are."""
    monkeypatch.setattr(warm, "MIN_ROWS", 0)


def _run(out, name: str, rows: int = 3, experiment: str = "matmul") -> None:
    w = RunWriter(out / "runs" / name)
    for i in range(rows):
        w.add(
            {
                "run_id": name,
                "experiment": experiment,
                "status": "ok" if i else "error",
                "median_s": 0.5 + i,
                "noisy": bool(i % 2),
                "timestamp": "2026-11-22T10:00:00+00:00",
                "note": None if i else "first",
                "items_unit": "images",  # text perflab does not know: pandas' str (string on pandas 2)
                "model": None if i == 2 else f"net{i}",
                f"cfg.{experiment}.size": 64 * i,
            }
        )


def _tree(tmp_path):
    out = tmp_path / "outputs"
    for i in range(4):
        _run(out, f"r{i}", experiment=("matmul", "train")[i % 2])
    load(out)  # the index built (new rows: no cache yet)
    return out


def _cache(out):
    return out / ".perflab" / "index" / warm.NAME


def _as_the_run_dirs_say(got, out) -> None:
    """``got`` (a load of the tree ``out``) holds the rows its run dirs hold, read as files."""
    files = load(out / "runs").sort_values("row_id", ignore_index=True)
    pd.testing.assert_frame_equal(got.sort_values("row_id", ignore_index=True), files, check_like=True)


def _same(a, b) -> None:
    pd.testing.assert_frame_equal(a, b)
    assert a.attrs == b.attrs


def test_a_warm_load_maps_the_cache_and_loads_as_the_run_dirs_do(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    built = load(out)  # every segment read whole: the cache written
    assert _cache(out).is_file()

    def no_segment_read(*args):
        raise AssertionError("a warm load read a segment: the cache was not used")

    with monkeypatch.context() as m:
        m.setattr(index, "_read_segment", no_segment_read)
        mapped = load(out)
    _same(mapped, built)
    assert not any("damaged" in n for n in mapped.attrs["notes"])
    _as_the_run_dirs_say(mapped, out)
    assert isinstance(mapped["cfg.matmul.size"].array, pd.arrays.IntegerArray)


def test_the_frame_is_writable_and_a_write_never_reaches_the_cache(tmp_path):
    out = _tree(tmp_path)
    built = load(out)
    mapped = load(out)
    before = _cache(out).read_bytes()
    mapped.loc[0, "median_s"] = 99.0
    mapped.loc[1, "cfg.matmul.size"] = 7
    mapped.loc[2, "noisy"] = True
    mapped.loc[0, "row_id"] = "changed"
    mapped["median_s"] += 1
    assert mapped.loc[0, "median_s"] == 100.0 and mapped.loc[0, "row_id"] == "changed"
    assert _cache(out).read_bytes() == before
    _same(load(out), built)


def test_a_frame_still_mapping_the_cache_survives_its_replacement(tmp_path):
    out = _tree(tmp_path)
    load(out)
    mapped = load(out)
    kept = mapped.copy()
    _run(out, "new")
    load(out)  # a new segment
    load(out)  # the cache rewritten: a new file
    pd.testing.assert_frame_equal(mapped, kept)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "a folder"])
def test_a_damaged_cache_is_rebuilt_with_a_note_never_wrong_rows(tmp_path, damage):
    out = _tree(tmp_path)
    built = load(out)
    path = _cache(out)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"\0junk" * 100)
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
        path.mkdir()
    again = load(out)
    pd.testing.assert_frame_equal(again, built)
    if damage in ("truncated", "garbage"):
        assert any("damaged warm cache" in n for n in again.attrs["notes"])
    _same(load(out), built)  # rebuilt (a folder removed first), then mapped
    assert _cache(out).is_file()


def test_the_cache_follows_run_dirs_that_change_go_or_come(tmp_path):
    out = _tree(tmp_path)
    load(out)
    load(out)
    _run(out, "r1", rows=5, experiment="train")  # r1 rewritten: more rows
    changed = load(out)
    assert (changed["run_id"] == "r1").sum() == 3 + 5  # a RunWriter appends
    for path in (out / "runs" / "r2").iterdir():
        path.unlink()
    (out / "runs" / "r2").rmdir()
    for _ in range(3):  # changed, rebuilt, mapped: each as the run dirs say
        gone = load(out)
        assert "r2" not in set(gone["run_id"]) and (gone["run_id"] == "r1").sum() == 8
        _as_the_run_dirs_say(gone, out)


def test_an_interrupted_cache_write_leaves_a_tree_that_loads(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    built = load(out)
    _cache(out).unlink()

    def cut(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(warm.os, "replace", cut)
    _same(load(out), built)
    assert not _cache(out).exists()
    assert not [p for p in _cache(out).parent.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    _same(load(out), built)


def test_a_read_only_tree_loads_without_a_cache(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    out = _tree(tmp_path)
    built = load(out)
    _cache(out).unlink()
    folder = _cache(out).parent
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        _same(load(out), built)
        assert not _cache(out).exists()
    finally:
        folder.chmod(stat.S_IRWXU)


def test_one_experiment_and_compaction_do_not_use_a_cache_of_other_rows(tmp_path):
    out = _tree(tmp_path)
    load(out)
    load(out)
    one = load(out, experiment="matmul")
    assert set(one["experiment"]) == {"matmul"}
    for i in range(index.MAX_SEGMENTS + 1):
        _run(out, f"s{i}", rows=1)
        load(out)
    _as_the_run_dirs_say(load(out), out)


def test_a_small_tree_keeps_no_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(warm, "MIN_ROWS", 13)  # the tree holds 12 rows
    out = _tree(tmp_path)
    built = load(out)
    assert not _cache(out).exists()
    _same(load(out), built)


def _folders_kept(out) -> dict:
    """The folders the cache says it was built on."""
    import json

    import pyarrow as pa

    with pa.memory_map(str(_cache(out))) as source:
        return json.loads(pa.ipc.open_file(source).schema.metadata[b"perflab"])["folders"]


def test_the_cache_keeps_the_folders_the_walk_lists(tmp_path):
    out = tmp_path / "outputs"
    for i in range(2):
        _run(out, f"r{i}")
    w = RunWriter(out / "sweeps" / "s1" / "0")
    w.add({"run_id": "s1-0", "experiment": "matmul", "status": "ok", "median_s": 1.0})
    (out / "sweeps" / "s1" / "empty").mkdir()  # listed too: a run dir may appear there
    load(out)
    load(out)
    kept = _folders_kept(out)
    assert set(kept) == {".", "runs", "sweeps", os.path.join("sweeps", "s1"), os.path.join("sweeps", "s1", "empty")}
    for folder, stamp in kept.items():
        assert stamp == tree.folder_stamp(os.stat(out / folder))
    assert tree.folders_unchanged(out, kept)


@pytest.mark.parametrize("change", ["a new run dir", "a run dir gone"])
def test_a_run_dir_come_or_gone_skips_the_cache_and_decodes_beside_the_walk(tmp_path, monkeypatch, change):
    out = _tree(tmp_path)
    load(out)  # the cache written
    if change == "a new run dir":
        _run(out, "new", rows=2)
    else:
        shutil.rmtree(out / "runs" / "r2")
    decoded, maps = threading.Event(), []
    walked = []
    read_segment, sources, read = index._read_segment, index._sources, warm.read

    def reading(*args):
        decoded.set()
        return read_segment(*args)

    def walking(*args):  # the walk ends only once a segment was read: the two overlap
        walked.append(decoded.wait(timeout=30))
        return sources(*args)

    def mapping(*args):
        maps.append(read(*args))
        return maps[-1]

    monkeypatch.setattr(index, "_read_segment", reading)
    monkeypatch.setattr(index, "_sources", walking)
    monkeypatch.setattr(warm, "read", mapping)
    got = load(out)
    assert maps == [None] and walked == [True]  # no cache mapped; the segments read during the walk
    _as_the_run_dirs_say(got, out)


def test_a_results_csv_rewritten_in_place_still_makes_the_cache_stale(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    load(out)
    kept = _folders_kept(out)
    results = out / "runs" / "r1" / "results.csv"
    text = results.read_text()
    with results.open("r+") as f:  # in place: no folder changes
        f.write(text.replace("0.5", "7.5", 1))
    assert tree.folders_unchanged(out, kept)
    maps: list = []
    read = warm.read
    monkeypatch.setattr(warm, "read", lambda *args: maps.append(read(*args)) or maps[-1])
    got = load(out)
    assert maps and maps[0] is not None  # the precheck passed: the walk found the change
    assert 7.5 in set(got.loc[got["run_id"] == "r1", "median_s"])
    _as_the_run_dirs_say(got, out)
