"""The index holds what the readers read: rows and raw samples (keyed by row id), read back with
only the experiment, the columns and the rows asked for; a damaged segment, or something that is
no file where one belongs, is rebuilt from the run dirs, never read as numbers, never waited on."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pandas as pd
import pytest

from perflab.analysis.replicates import samples_by_row
from perflab.results import load, load_rows, load_samples
from perflab.store import index, rows
from perflab.store.rundir import RunRecord, RunWriter


def _tree(root, runs=6):
    """Run dirs of one or two rows, each with its samples, of two experiments."""
    for r in range(runs):
        name, experiment = f"r{r}", ("matmul", "train")[r % 2]
        w = RunWriter(root / "runs" / name)
        for m in range(1 + r % 2):
            row = {"run_id": name, "experiment": experiment, "status": "ok", "measurement": f"m{m}"}
            row |= {"median_s": 0.1 * (r + 1), "cfg.experiment.size": 64 * (m + 1)}
            w.add(row, samples=[0.1 * (r + 1) + 0.001 * i for i in range(5)], warmup=[1.0])
        RunRecord(run_id=name, experiment=experiment, config_hash=name, outcome="ok", complete=True).save(w.run_dir)
    return root


def _index(root):
    return root / ".perflab" / "index"


def test_samples_come_from_the_index_and_no_samples_csv_is_parsed_again(tmp_path, monkeypatch):
    tree = _tree(tmp_path / "outputs")
    from_csv = load(tree, samples=True)
    monkeypatch.setattr(index, "SAMPLES_BATCH", 4)  # parsed a few run dirs at a time, as a big tree's
    df = load(tree)  # builds the index: rows and samples
    assert list(_index(tree).glob(f"{index.SAMPLES_DIR}/*.parquet")), "the samples are in the index"

    def parsed(*args, **kwargs):
        raise AssertionError("a CSV was parsed: the index holds these samples")

    monkeypatch.setattr(index, "read_many", parsed)
    wanted = sorted(df.loc[df["experiment"] == "train", "row_id"])
    got = load_samples(tree, row_ids=wanted)
    assert sorted(set(got["row_id"])) == wanted, "the samples of the rows asked for, and no other"
    expected = from_csv[from_csv["row_id"].isin(wanted)]
    key = ["row_id", "phase", "i"]
    pd.testing.assert_frame_equal(
        got.sort_values(key).reset_index(drop=True)[["row_id", "phase", "seconds"]].astype(str),
        expected.sort_values(key).reset_index(drop=True)[["row_id", "phase", "seconds"]].astype(str),
    )
    by_row = samples_by_row([tree], row_ids=wanted)
    assert sorted(by_row) == wanted and all(len(v) == 5 for v in by_row.values()), "the warm-up is not a sample"
    np.testing.assert_allclose(by_row["r1#2"], [0.2 + 0.001 * i for i in range(5)])


def test_samples_of_a_run_dir_that_changed_are_its_current_ones(tmp_path):
    tree = _tree(tmp_path / "outputs")
    load(tree)
    w = RunWriter(tree / "runs" / "r0")
    w.add({"run_id": "r0", "experiment": "matmul", "status": "ok", "measurement": "late"}, samples=[9.0, 9.5])
    by_row = samples_by_row([tree])
    assert list(by_row["r0#2"]) == [9.0, 9.5] and len(by_row["r0#1"]) == 5, "read again, each sample once"


def test_a_load_of_rows_stamps_no_samples_and_a_changed_samples_csv_is_read_by_the_next_read_of_samples(
    tmp_path, monkeypatch
):
    """A load of rows alone does not look at the samples.csv or operators.csv of the run dirs it
    finds indexed (a change there leaves the rows as they are): a samples.csv rewritten since is
    not parsed by it, and is by the next read of samples, which gives the new samples; a run dir
    a load of rows reads from CSV is indexed with its samples' stamp, never parsed again."""
    tree = _tree(tmp_path / "outputs")
    rows_before = load(tree)
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: stats.append(str(path)) or real_stat(path, *a, **k))
    samples_csv = tree / "runs" / "r2" / "samples.csv"
    text = samples_csv.read_text()
    samples_csv.write_text(text.replace("sample,0,0.3", "sample,0,7.5", 1))  # the first sample of r2#1 rewritten
    parsed = []
    read_many = index.read_many
    monkeypatch.setattr(index, "read_many", lambda paths, *a, **k: parsed.extend(paths) or read_many(paths, *a, **k))
    pd.testing.assert_frame_equal(load(tree), rows_before)
    matmul = rows_before.loc[rows_before["experiment"] == "matmul", "row_id"]
    assert list(load(tree, experiment="matmul")["row_id"]) == list(matmul)
    assert not parsed and not [p for p in stats if p.endswith(("samples.csv", "operators.csv"))]
    assert samples_by_row([tree])["r2#1"][0] == 7.5, "read again by a read of samples"
    assert parsed == [samples_csv.with_name("results.csv"), samples_csv]
    late = {"run_id": "r9", "experiment": "matmul", "status": "ok", "measurement": "m0"}
    RunWriter(tree / "runs" / "r9").add(late, samples=[1.0])
    parsed.clear()
    assert "r9#1" in set(load(tree)["row_id"]) and len(parsed) == 2, "the new run dir's rows and samples"
    parsed.clear()
    assert list(samples_by_row([tree])["r9#1"]) == [1.0] and not parsed, "indexed with its samples' stamp"


def test_load_rows_reads_only_the_columns_asked_for(tmp_path):
    tree = _tree(tmp_path / "outputs")
    whole = load(tree, experiment="train")
    for _ in range(2):  # from CSV (the index built), then from the index
        got = load_rows(tree, experiment="train", columns=["median_s", "cfg.experiment.size"])
        assert set(got.columns) == {"row_id", "experiment", "run_dir", "median_s", "cfg.experiment.size"}
        pd.testing.assert_frame_equal(got, whole[list(got.columns)], check_categorical=False)
        assert got["cfg.experiment.size"].dtype == "Int64", "the type it was written with"


def _damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "a page":  # the last byte of a column of numbers' values: only a checksum finds it
        import pyarrow.parquet as pq

        group = pq.ParquetFile(path).metadata.row_group(0)
        chunk = next(c for c in map(group.column, range(group.num_columns)) if c.physical_type == "DOUBLE")
        data[chunk.data_page_offset + chunk.total_compressed_size - 1] ^= 0x01
    elif how == "the footer":  # its statistics decide which row groups are read
        data[-20] ^= 0x01
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["a page", "the footer", "cut short"])
@pytest.mark.parametrize("which", ["rows", "samples"])
def test_a_damaged_segment_is_rebuilt_from_the_run_dirs(tmp_path, caplog, which, how):
    tree = _tree(tmp_path / "outputs")
    rows_before, samples_before = load(tree), samples_by_row([tree])
    (manifest,) = _index(tree).glob("*.json")
    segment = manifest.with_suffix(".parquet")
    _damage(segment if which == "rows" else segment.parent / index.SAMPLES_DIR / segment.name, how)
    with caplog.at_level(logging.WARNING, logger="perflab"):
        after = samples_by_row([tree]) if which == "samples" else None
        again = load(tree)
    pd.testing.assert_frame_equal(again, rows_before)
    if after is not None:
        assert after.keys() == samples_before.keys() and all((after[k] == v).all() for k, v in samples_before.items())
    assert "rebuilt 1 damaged index segment" in caplog.text
    assert not segment.exists() and len(list(_index(tree).glob("*.json"))) == 1


@pytest.mark.timeout(60)  # a FIFO opened for reading blocks for ever: this fails instead
@pytest.mark.parametrize("what", ["a FIFO", "a symlink"])
def test_no_file_where_a_segment_belongs_is_waited_on_or_deleted_through(tmp_path, what):
    tree = _tree(tmp_path / "outputs")
    expected = load(tree)
    (manifest,) = _index(tree).glob("*.json")
    mine = tmp_path / "mine.parquet"  # a user's file a link points to: never touched
    for segment in (manifest.with_suffix(".parquet"), _index(tree) / index.SAMPLES_DIR / f"{manifest.stem}.parquet"):
        mine.write_bytes(segment.read_bytes())
        segment.unlink()
        if what == "a FIFO":
            os.mkfifo(segment)
        else:
            segment.symlink_to(mine)
    if what == "a symlink":  # the link holds the right bytes: the manifest says otherwise
        data = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**data, "files": {k: [1, v[1]] for k, v in data["files"].items()}}))
    assert sorted(samples_by_row([tree])) == sorted(expected["row_id"])
    pd.testing.assert_frame_equal(load(tree), expected)
    assert mine.is_file() and not manifest.exists(), "the link removed, what it points to kept"


def test_a_samples_note_is_said_by_a_read_of_samples_on_every_read(tmp_path, caplog):
    tree = _tree(tmp_path / "outputs")
    with (tree / "runs" / "r2" / "samples.csv").open("a") as f:
        f.write("r2#1,r2,matmul,m0,sam")  # torn
    load(tree)
    for _ in range(2):  # from CSV, then from the index's manifest
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="perflab"):
            samples_by_row([tree])
        assert f"{rows.TORN.format(n=1, s='')}: {tree / 'runs' / 'r2' / 'samples.csv'}" in caplog.text


def test_an_earlier_versions_warm_cache_is_removed(tmp_path):
    tree = _tree(tmp_path / "outputs")
    load(tree)
    (_index(tree) / "warm.arrow").write_bytes(b"\0" * 4096)
    load(tree)
    assert not (_index(tree) / "warm.arrow").exists()


def test_a_run_dir_copied_in_the_tree_gives_its_samples_once(tmp_path):
    import shutil

    tree = _tree(tmp_path / "outputs")
    shutil.copytree(tree / "runs" / "r1", tree / "runs" / "r1-copy")  # its row ids twice in the tree
    for _ in range(2):  # from CSV (the index built), then from the index
        by_row = samples_by_row([tree])
        assert len(by_row["r1#1"]) == 5 and len(by_row["r1#2"]) == 5


@pytest.mark.timeout(60)
def test_a_fifo_where_the_samples_folder_belongs_is_replaced_by_the_folder(tmp_path):
    tree = _tree(tmp_path / "outputs")
    _index(tree).mkdir(parents=True)
    os.mkfifo(_index(tree) / index.SAMPLES_DIR)
    expected = load(tree, samples=True)
    assert len(samples_by_row([tree])) == len(set(expected["row_id"]))
    assert list((_index(tree) / index.SAMPLES_DIR).glob("*.parquet")), "the index written after all"


@pytest.mark.parametrize("indexed", [False, True])
def test_a_reading_walks_the_tree_once_for_rows_and_samples_and_says_what_load_samples_says(
    tmp_path, monkeypatch, caplog, indexed
):
    """results.Reading (compare, history and the report read through it): its rows are load()'s,
    its samples load_samples()', and the tree is walked once for both; a torn samples line is said
    by the read of samples as load_samples says it, whether its run dir was indexed before
    (``indexed``) or is read from CSV by this reading."""
    from perflab.results import Reading

    tree = _tree(tmp_path / "outputs")
    with (tree / "runs" / "r2" / "samples.csv").open("a") as f:
        f.write("r2#1,r2,matmul,m0,sam")  # torn
    if indexed:
        load(tree)
    expected_rows = load(tree) if indexed else None
    walks = []
    real_walk = index._sources
    monkeypatch.setattr(index, "_sources", lambda *a, **k: walks.append(1) or real_walk(*a, **k))
    reading = Reading(tree)
    got = reading.rows()
    wanted = sorted(got.loc[got["experiment"] == "matmul", "row_id"])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="perflab"):
        by_row = samples_by_row([tree], row_ids=wanted, reading=reading)
    assert len(walks) == 1, "one walk of the tree for its rows and their samples"
    assert f"{rows.TORN.format(n=1, s='')}: {tree / 'runs' / 'r2' / 'samples.csv'}" in caplog.text
    assert sorted(by_row) == wanted
    expected = samples_by_row([tree], row_ids=wanted)
    assert all(np.array_equal(by_row[r], expected[r]) for r in wanted), "the samples load_samples reads"
    if expected_rows is not None:
        pd.testing.assert_frame_equal(got, expected_rows)


def test_samples_by_row_is_the_same_from_the_index_from_run_dirs_and_across_row_groups(tmp_path, monkeypatch, caplog):
    """Each row's usable samples, in order, whether read from the index (its row groups a few
    samples long: a row's samples split between two), from the run dirs' CSVs or from two places;
    an unusable sample left out and said, a row whose samples are all unusable there and empty, a
    row of a warm-up alone not there."""
    from perflab.analysis.replicates import RowSeconds, row_samples

    root = tmp_path / "outputs"
    w = RunWriter(root / "runs" / "a")
    row = {"run_id": "a", "experiment": "matmul", "status": "ok", "median_s": 0.1}
    w.add({**row, "measurement": "m0"}, samples=[0.1, float("nan"), 0.3, -1.0, 0.5], warmup=[1.0])
    w.add({**row, "measurement": "m1"}, samples=[0.0, -2.0], warmup=[1.0])
    w.add({**row, "measurement": "m2"}, warmup=[1.0])
    w.add({**row, "measurement": "m3"}, samples=[0.7, 0.8, 0.9, 1.1, 1.2, 1.3, 1.4], warmup=[1.0, 2.0])
    expected = {"a#1": [0.1, 0.3, 0.5], "a#2": [], "a#4": [0.7, 0.8, 0.9, 1.1, 1.2, 1.3, 1.4]}
    monkeypatch.setattr(index, "SAMPLE_GROUP", 3)  # row groups of 3 samples
    for places in ([root], [root], [root / "runs" / "a"], [root, root / "runs" / "a"]):  # CSV, index, run dir, both
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="perflab"):
            got = samples_by_row(places)
        assert isinstance(got, RowSeconds) and sorted(got) == sorted(expected), places
        assert {k: list(v) for k, v in got.items()} == expected, places
        assert "left out 4 unusable samples (NaN, not a number, or <= 0 s) of the rows: a#1, a#2" in caplog.text
        ids = ["a#4", "zz", "a#2", "a#1"]
        frame = pd.DataFrame({"row_id": ids, "median_s": 0.1})
        as_dict, flat = row_samples(frame, "median_s", dict(got)), row_samples(frame, "median_s", got)
        assert list(flat.recorded) == [True, False, True, True] and list(flat.row) == [0] * 7 + [3] * 3
        for field in ("row", "seconds", "every", "clean", "recorded"):
            np.testing.assert_array_equal(getattr(flat, field), getattr(as_dict, field))
