"""The warm cache (``.perflab/index/warm.arrow``): a load whose cached run dirs are unchanged maps
the frame the last full load built instead of decoding Parquet, and adds the rows of run dirs
since in the room after each column. It loads equal to a full load and to reading the run dirs,
its frame is writable without touching the file, and a damaged, truncated, stale or unwritable
cache never gives wrong rows."""

from __future__ import annotations

import os
import shutil
import stat

import pandas as pd
import pytest

from perflab.results import load
from perflab.store import index, warm
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


def test_one_experiment_and_merged_segments_load_as_the_run_dirs_say(tmp_path):
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


def _in_full(out, experiment=None):
    """``out`` loaded as it would be without a cache (the rows in the same order and types)."""
    kept = _cache(out).read_bytes() if _cache(out).is_file() else None
    if kept is not None:
        _cache(out).unlink()
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(warm, "MIN_ROWS", 10**9)  # none written by this load
            m.setattr(index, "_tidy", lambda *args: None)  # nor the tree's segments changed
            return load(out, experiment=experiment)
    finally:
        if kept is not None:
            _cache(out).write_bytes(kept)


def _segments_read(monkeypatch) -> list[str]:
    """The names of the segments each later load decodes."""
    names: list[str] = []
    read_segment = index._read_segment

    def reading(path, experiment):
        names.append(path.stem)
        return read_segment(path, experiment)

    monkeypatch.setattr(index, "_read_segment", reading)
    return names


def _new_run(out, name: str) -> None:
    """A run whose rows add a column, a category value and a model no earlier row has."""
    w = RunWriter(out / "runs" / name)
    for i in range(2):
        w.add(
            {
                "run_id": name,
                "experiment": "compile",
                "status": "ok",
                "median_s": 2.0 + i,
                "noisy": False,
                "timestamp": "2026-11-23T10:00:00+00:00",
                "items_unit": "tokens",
                "model": "zz-new",
                "cfg.compile.mode": "max-autotune",
            }
        )


def test_a_new_run_is_added_after_the_cached_rows_as_a_full_load_gives_them(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    load(out)  # the cache written
    before = _cache(out).read_bytes()
    _new_run(out, "new")
    read = _segments_read(monkeypatch)
    first = load(out)  # its rows read from CSV (a new segment), no segment decoded
    assert read == []
    second = load(out)  # its segment decoded, the cached rows not
    assert len(read) == 1
    for got in (first, second):
        pd.testing.assert_frame_equal(got, _in_full(out))
        _as_the_run_dirs_say(got, out)
    assert _cache(out).read_bytes() == before  # not rewritten: the new rows were added in memory
    assert first["cfg.compile.mode"].notna().sum() == 2 and "zz-new" in set(first["model"])


def test_one_experiment_from_the_cache_is_as_from_the_segments(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    load(out)
    _new_run(out, "new")
    load(out)
    read = _segments_read(monkeypatch)
    for experiment in ("matmul", "compile", "absent"):
        read.clear()
        got = load(out, experiment=experiment)
        assert len(read) == 1  # with the cache: the new run's segment alone
        kept = _cache(out).read_bytes()
        _cache(out).unlink()
        pd.testing.assert_frame_equal(got, load(out, experiment=experiment))
        _cache(out).write_bytes(kept)


@pytest.mark.parametrize("change", ["a run dir gone", "a results.csv rewritten in place", "no room left"])
def test_what_the_cache_cannot_hold_loads_in_full_and_rebuilds_it(tmp_path, monkeypatch, change):
    out = _tree(tmp_path)
    if change == "no room left":
        monkeypatch.setattr(warm, "SPARE", 10**9)  # no room after the rows
        monkeypatch.setattr(warm, "MIN_ROOM", 0)
    load(out)
    before = _cache(out).read_bytes()
    if change == "a run dir gone":
        shutil.rmtree(out / "runs" / "r2")
    elif change == "no room left":
        _new_run(out, "new")
    else:
        results = out / "runs" / "r1" / "results.csv"
        text = results.read_text()
        with results.open("r+") as f:  # in place: its folder unchanged
            f.write(text.replace("0.5", "7.5", 1))
    got = load(out)
    _as_the_run_dirs_say(got, out)
    assert _cache(out).read_bytes() != before  # rebuilt for what the run dirs hold now
    read = _segments_read(monkeypatch)
    _same(load(out), got)
    assert read == []


def test_a_column_of_another_type_in_a_new_run_loads_in_full(tmp_path):
    out = _tree(tmp_path)
    load(out)
    w = RunWriter(out / "runs" / "odd")
    w.add({"run_id": "odd", "experiment": "matmul", "status": "ok", "cfg.matmul.size": "big"})
    got = load(out)
    pd.testing.assert_frame_equal(got, _in_full(out))
    assert "big" in set(got["cfg.matmul.size"].astype(str))


def test_new_runs_one_by_one_merge_only_the_newest_segments(tmp_path):
    out = _tree(tmp_path)
    load(out)
    index_dir = _cache(out).parent
    (oldest,) = sorted(p.stem for p in index_dir.glob("seg-*.parquet"))
    for i in range(3 * index.MAX_SEGMENTS):
        _run(out, f"n{i}", rows=1)
        got = load(out)
        segments = sorted(p.stem for p in index_dir.glob("seg-*.parquet"))
        assert len(segments) <= index.MAX_SEGMENTS
        assert segments[0] == oldest  # the tree's first segment (12 rows) never rewritten for 1-row runs
    _as_the_run_dirs_say(got, out)
    pd.testing.assert_frame_equal(got, _in_full(out))


def test_new_runs_past_the_codes_a_category_held_widen_it(tmp_path, monkeypatch):
    out = tmp_path / "outputs"
    for i in range(120):  # 120 run dirs and experiments: one byte a code
        w = RunWriter(out / "runs" / f"r{i:03d}")
        w.add({"run_id": f"r{i:03d}", "experiment": f"e{i:03d}", "status": "ok", "median_s": 1.0})
    load(out)
    load(out)  # the cache written
    for i in range(120, 140):
        w = RunWriter(out / "runs" / f"r{i:03d}")
        w.add({"run_id": f"r{i:03d}", "experiment": f"e{i:03d}", "status": "ok", "median_s": 1.0})
    read = _segments_read(monkeypatch)
    got = load(out)
    assert read == []  # the cached rows kept, not a full load
    assert got["experiment"].cat.codes.dtype.itemsize == 2 and got["experiment"].nunique() == 140
    pd.testing.assert_frame_equal(got, _in_full(out))
    _as_the_run_dirs_say(got, out)


def test_one_experiment_reads_a_column_its_new_rows_fill_that_its_cached_rows_left_empty(tmp_path):
    out = _tree(tmp_path)
    load(out)  # the cache: its matmul rows hold no cfg.train.size
    w = RunWriter(out / "runs" / "late")
    w.add({"run_id": "late", "experiment": "matmul", "status": "ok", "median_s": 1.0, "cfg.train.size": 7})
    got = load(out, experiment="matmul")
    assert list(got["cfg.train.size"].dropna()) == [7]
    kept = _cache(out).read_bytes()
    _cache(out).unlink()
    pd.testing.assert_frame_equal(got, load(out, experiment="matmul"))
    _cache(out).write_bytes(kept)


def test_run_dirs_read_twice_in_one_load_of_a_tree_that_cannot_be_written_all_load(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    load(out)  # the cache
    _run(out, "x", rows=2)
    load(out)  # x's segment
    (x_segment,) = [p for p in _cache(out).parent.glob("seg-*.parquet") if "x" in pd.read_parquet(p)["run_id"].values]
    x_segment.write_bytes(b"garbage")  # found damaged by the next load, after it read a new run
    _run(out, "a", rows=2)
    monkeypatch.setattr(index, "_write_segment", lambda *args: None)  # nothing can be written
    got = load(out)
    assert {"x", "a"} <= set(got["run_id"])
    _as_the_run_dirs_say(got, out)


def test_merging_segments_whose_run_dirs_are_all_gone_removes_them(tmp_path):
    out = _tree(tmp_path)
    load(out)
    for i in range(index.MAX_SEGMENTS + 1):  # one segment a run, not merged: one experiment's loads
        _run(out, f"s{i}", rows=1)
        load(out, experiment="matmul")
    for i in range(index.MAX_SEGMENTS + 1):
        shutil.rmtree(out / "runs" / f"s{i}")
    got = load(out)
    segments = list(_cache(out).parent.glob("seg-*.parquet"))
    assert len(segments) == 1  # the first; each of the others held a run dir now gone
    again = load(out)
    assert not any("damaged" in n for n in again.attrs["notes"])
    _as_the_run_dirs_say(got, out)
    _same(again, got)


def test_one_experiment_of_a_tree_whose_column_mixes_types_is_as_from_the_segments(tmp_path):
    out = _tree(tmp_path)
    w = RunWriter(out / "runs" / "odd")
    w.add({"run_id": "odd", "experiment": "train", "status": "ok", "median_s": 1.0, "cfg.matmul.size": "big"})
    load(out)
    load(out)  # cfg.matmul.size holds numbers and text: a cache of it (if Arrow keeps one) reads no experiment
    pd.testing.assert_frame_equal(load(out, experiment="matmul"), _in_full(out, "matmul"))


@pytest.mark.parametrize("cached", [True, False])
def test_one_experiment_leaves_out_new_runs_that_name_none(tmp_path, monkeypatch, cached):
    if not cached:
        monkeypatch.setattr(warm, "MIN_ROWS", 10**9)
    out = _tree(tmp_path)
    load(out)
    w = RunWriter(out / "runs" / "nameless")
    w.add({"run_id": "nameless", "status": "ok", "median_s": 1.0})
    for _ in range(2):  # read from CSV, then from its segment
        got = load(out, experiment="matmul")
        assert "nameless" not in set(got["run_id"]) and set(got["experiment"]) == {"matmul"}


def test_an_experiment_named_by_a_number_after_the_cache_loads_in_full(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    load(out)
    w = RunWriter(out / "runs" / "y")
    w.add({"run_id": "y", "experiment": "2024", "status": "ok", "median_s": 1.0})
    read = _segments_read(monkeypatch)
    got = load(out)  # categories of numbers do not join the cache's text ones: a full load
    assert read and list(got["row_id"]) == [*_in_full(out)["row_id"]]
    assert sorted(got["experiment"].astype(str).unique()) == ["2024", "matmul", "train"]


def test_a_header_alone_keeps_the_cache_in_use(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    load(out)
    header = (out / "runs" / "r0" / "results.csv").read_text().splitlines()[0]
    (out / "runs" / "empty").mkdir()
    (out / "runs" / "empty" / "results.csv").write_text(header + "\n")  # a run that wrote no row yet
    read = _segments_read(monkeypatch)
    got = load(out)
    assert read == []
    pd.testing.assert_frame_equal(got, _in_full(out))


def test_a_tree_fallen_below_the_size_it_is_kept_for_gives_its_cache_up(tmp_path, monkeypatch):
    out = _tree(tmp_path)
    monkeypatch.setattr(warm, "MIN_ROWS", 12)  # the tree: 12 rows
    load(out)
    assert _cache(out).is_file()
    shutil.rmtree(out / "runs" / "r3")
    got = load(out)
    assert not _cache(out).exists()
    _as_the_run_dirs_say(got, out)


def test_a_column_of_two_kinds_arrow_would_take_is_never_cached(tmp_path):
    """Arrow keeps ints and floats in one object column as doubles (1 would read back 1.0): no
    cache is kept of such a column, a float column beside it is."""
    path = tmp_path / warm.NAME
    two_kinds = pd.DataFrame({"x": pd.Series([1, 2.5, None], dtype=object), "y": [1.0, 2.0, 3.0]})
    warm.write(path, two_kinds, {}, None)
    assert not path.exists()
    warm.write(path, two_kinds[["y"]], {}, None)
    assert path.is_file()
