"""The result store: it never clobbers, never loses, knows what is really done, refuses bad
paths before measuring, and loads a tree fast through an index it can rebuild."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from perflab.errors import ConfigError
from perflab.results import load
from perflab.store import done_marks, files, index, ledger, point_claims
from perflab.store.rows import csv_text, read_csv
from perflab.store.rundir import RunRecord, RunWriter

from conftest import FAST


def row(run: str, i: int, **extra) -> dict:
    return {
        "row_id": f"{run}#{i}",
        "run_id": run,
        "experiment": "matmul",
        "measurement": f"m{i}",
        "status": "ok",
        "n": 5,
        "median_s": 0.25 * (i + 1),
        "noisy": False,
        "error": "",
        "timestamp": "2026-11-22T10:00:00+00:00",
        "cuda": "13.0",
        **extra,
    }


@pytest.fixture
def readonly(tmp_path):
    """A read-only filesystem (a tmpfs mounted ro): read-only even for root, like a real one."""
    where = tmp_path / "ro"
    where.mkdir()
    (where / "seed").mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", str(where)], check=False)


# --- files ----------------------------------------------------------------------------------


def test_new_files_honour_the_umask_and_rewrites_keep_mode_and_group(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "results.csv"
        files.write_atomic(path, "a\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        os.chmod(path, 0o664)
        os.chown(path, -1, 65534)  # nogroup: a shared group
        files.write_atomic(path, "b\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o664 and path.stat().st_gid == 65534
        assert path.read_text() == "b\n"
        files.append_text(tmp_path / "samples.csv", "x\n", header="h\n")
        assert stat.S_IMODE((tmp_path / "samples.csv").stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_a_symlink_is_written_through_and_survives(tmp_path):
    real = tmp_path / "real.csv"
    real.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    files.write_atomic(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_a_device_is_never_replaced(tmp_path):
    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a clone of /dev/null
    with pytest.raises(OSError, match="a character device"):
        files.write_atomic(dev, "x")
    assert stat.S_ISCHR(dev.stat().st_mode)
    with pytest.raises(ConfigError) as err:
        ledger.check(dev)
    assert err.value.line() == (
        f"results.ledger={dev}: a character device, not a regular file; allowed: {ledger.ALLOWED}"
    )


def test_an_append_after_a_torn_line_starts_fresh_and_the_torn_line_is_skipped(tmp_path, caplog):
    path = tmp_path / "ledger.csv"
    ledger.append(path, [row("a", 0)])
    with path.open("a") as f:
        f.write("b#0,b,matmul,m0,o")  # a short write: disk full, a killed writer
    ledger.append(path, [row("c", 0)])
    df = load(path)
    assert df["run_id"].tolist() == ["a", "c"] and df.attrs.get("skipped_lines", 1) >= 0
    assert "skipped 1 torn or malformed line" in caplog.text


def test_binary_junk_lines_are_skipped_not_fatal(tmp_path):
    path = tmp_path / "results.csv"
    path.write_bytes(
        csv_text([row("a", 0)]).encode() + b"\x00\xff\xfe junk\n" + csv_text([row("a", 1)], header=False).encode()
    )
    assert read_csv(path)["row_id"].tolist() == ["a#0", "a#1"]


def test_ledger_survives_different_column_sets(tmp_path):
    path = tmp_path / "ledger.csv"
    ledger.append(path, [row("a", 0)])
    ledger.append(path, [row("b", 0, tflops=1.5)])
    ledger.append(path, [row("c", 0)])
    lines = path.read_text().splitlines()
    assert sum(1 for line in lines if line.startswith("row_id,")) == 1
    df = load(path)
    assert df["run_id"].tolist() == ["a", "b", "c"]
    assert pd.isna(df.loc[0, "tflops"]) and df.loc[1, "tflops"] == 1.5


# Each writer is a fresh interpreter that imports perflab.store.ledger alone: a multiprocessing child
# would import this test module again, and through conftest torch and Hydra (seconds each).
APPEND_EACH = (
    "import json, sys; from pathlib import Path; from perflab.store import ledger\n"
    "for r in json.loads(sys.argv[2]): ledger.append(Path(sys.argv[1]), [r])"
)


def _rows_of(worker: int, count: int) -> list[dict]:
    return [row(f"w{worker}", i, **({f"only_worker_{worker}": i} if i % 5 == 0 else {})) for i in range(count)]


def test_many_processes_append_to_one_ledger(tmp_path):
    path = tmp_path / "ledger.csv"
    writers = [
        subprocess.Popen([sys.executable, "-c", APPEND_EACH, str(path), json.dumps(_rows_of(w, 15))]) for w in range(4)
    ]
    assert [p.wait(timeout=120) for p in writers] == [0, 0, 0, 0]
    with path.open(newline="") as f:
        lines = list(csv.reader(f))
    header, body = lines[0], lines[1:]
    assert all(len(r) == len(header) for r in body)
    assert {r[0] for r in body} == {f"w{w}#{i}" for w in range(4) for i in range(15)}
    assert {f"only_worker_{w}" for w in range(4)} <= set(header), "new columns from every writer, in one header"


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"\x00\x01\x02binary\xff\n", "not a CSV text file"),
        (b"date,amount\n2026-01-01,3\n", "not a perflab ledger (its header starts date,amount)"),
    ],
)
def test_a_foreign_file_as_the_ledger_is_refused_untouched(tmp_path, content, problem):
    path = tmp_path / "ledger.csv"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        ledger.check(path)
    assert problem in err.value.line()
    assert path.read_bytes() == content


# --- run dirs, ids, load ----------------------------------------------------------------------


def test_writer_keeps_every_finished_row_and_samples(tmp_path):
    run = tmp_path / "run"
    writer = RunWriter(run, ledger=tmp_path / "ledger.csv")
    writer.add(row("r", 0), samples=[1.0, 2.0], warmup=[5.0])
    writer.add(row("r", 1))
    assert len(load(run / "results.csv")) == 2 and len(load(tmp_path / "ledger.csv")) == 2
    samples = load(run, samples=True)
    assert samples["seconds"].tolist() == [5.0, 1.0, 2.0]
    assert samples["phase"].tolist() == ["warmup", "sample", "sample"]
    assert not list(run.glob(".*.tmp"))


def test_samples_of_many_runs_load_together_and_only_perflab_s(tmp_path):
    """A tree's samples.csv files are parsed in one pass; one without the samples' columns (or
    torn) is left out or trimmed, as when each was read alone, and said."""
    for i in range(3):
        RunWriter(tmp_path / "sweep" / str(i)).add(row(f"r{i}", 0), samples=[1.0 + i, 2.0 + i])
    (tmp_path / "sweep" / "2" / "samples.csv").write_text("row_id,run_id,x\nr2#1,r2,3\n")  # no seconds
    torn = tmp_path / "sweep" / "1" / "samples.csv"
    torn.write_text(torn.read_text() + "r1#1,r1,matmul,m0,sample,2,9")  # its last line cut short
    samples = load(tmp_path / "sweep", samples=True)
    assert sorted(samples["seconds"].tolist()) == [1.0, 2.0, 2.0, 3.0]
    notes = " ".join(samples.attrs["notes"])
    assert "1 file that perflab did not write" in notes and "1 torn or malformed line" in notes, notes


def test_writer_keeps_rows_another_process_wrote_to_the_same_job(tmp_path):
    parent = RunWriter(tmp_path / "job")
    parent.add({"run_id": "r", "measurement": "before", "status": "ok"})
    RunWriter(tmp_path / "job").add({"run_id": "r", "measurement": "rank 0", "status": "ok"})  # e.g. DDP
    parent.add({"run_id": "r", "measurement": "after", "status": "error"})
    df = load(tmp_path / "job" / "results.csv")
    assert df["measurement"].tolist() == ["before", "rank 0", "after"]
    assert df["row_id"].tolist() == ["r#1", "r#2", "r#3"]


def test_runs_in_dirs_with_the_same_name_keep_all_their_rows(cli, work):
    cli("+experiment=quick/matmul", *FAST, "hydra.run.dir=a/run")
    cli("+experiment=quick/matmul", *FAST, "hydra.run.dir=b/run")
    df = load(work / "a", work / "b")
    assert len(df) == 2 and df["row_id"].nunique() == 2


def test_load_a_tree_through_its_index_matches_reading_every_file(tmp_path):
    out = tmp_path / "outputs"
    for i in range(5):
        w = RunWriter(out / "runs" / f"r{i}")
        w.add(row(f"r{i}", 0, **({"tflops": 1.0} if i % 2 else {"note": "text"})))
    first = load(out)
    assert sorted(first["run_id"]) == [f"r{i}" for i in range(5)]
    assert list((out / ".perflab" / "index").glob("*.parquet")), "the index was written"
    RunWriter(out / "runs" / "r1").add(row("r1", 1))  # a run dir that changed since
    RunWriter(out / "runs" / "r9").add(row("r9", 0))  # and a new one
    second = load(out)
    assert sorted(second["row_id"]) == sorted([*first["row_id"], "r1#1", "r9#0"])
    import shutil

    shutil.rmtree(out / ".perflab")  # the index is derived: losing it loses nothing
    third = load(out)
    assert sorted(third["row_id"]) == sorted(second["row_id"])
    # the same frame, values and types, through the index (a segment and a run appended) or not
    in_order = lambda df: df.sort_values("row_id", ignore_index=True)  # noqa: E731
    pd.testing.assert_frame_equal(in_order(second), in_order(third))
    fourth = load(out)  # warm: the index just rebuilt
    pd.testing.assert_frame_equal(in_order(fourth), in_order(third))
    assert load(out, experiment="nope").empty


def test_a_run_dir_reached_twice_is_one_run_dir_and_a_dangling_record_link_is_said_once(tmp_path):
    """The walk knows a run dir by its files, not by listing it: a folder link to a run dir
    (``latest``) finds the same run dir once, and what is said of its files is said once; a
    run.json that is a dangling link leaves its run out (index.RECORD_UNREADABLE's rule), cold
    and warm alike."""
    from perflab.store.tree import run_dirs

    out = tmp_path / "outputs"
    RunWriter(out / "runs" / "r0").add(row("r0", 0))
    RunWriter(out / "runs" / "r1").add(row("r1", 0))
    (out / "runs" / "r2").mkdir()
    (out / "runs" / "r2" / "results.csv").write_text(csv_text([row("r2", 0)]))
    (out / "runs" / "r2" / "run.json").symlink_to(tmp_path / "nowhere.json")
    (out / "latest").symlink_to(out / "runs" / "r2", target_is_directory=True)
    found = sorted(p.relative_to(out).as_posix() for p in run_dirs(out))
    assert len(found) == 3 and found[1:] == ["runs/r0", "runs/r1"]  # r2 once, by either path
    for _ in range(2):  # cold, then warm through the index
        df = load(out)
        assert sorted(df["row_id"]) == ["r0#0", "r1#0"]
        said = "\n".join(df.attrs["notes"])
        assert "skipped 1 non-regular file" in said and "left out 1 run whose run.json" in said


@pytest.mark.parametrize("link", ["a-latest", "z-latest"])
def test_a_run_dir_met_plain_and_through_a_link_is_one_run_dir_in_either_order(tmp_path, link):
    """The walk knows a run dir met in its folder's listing by the inode the listing gives (no
    stat of its own), one met through a link by a stat: the same folder either way, whichever
    the walk meets first."""
    from perflab.store.tree import run_dirs

    out = tmp_path / "outputs"
    RunWriter(out / "runs" / "r0").add(row("r0", 0))
    (out / link).symlink_to(out / "runs" / "r0", target_is_directory=True)
    found = [p.relative_to(out).as_posix() for p in run_dirs(out)]
    assert found == [link if link < "runs" else "runs/r0"]
    assert list(load(out)["row_id"]) == ["r0#0"]


def test_two_run_dirs_of_hard_linked_files_are_two_run_dirs(tmp_path):
    """A snapshot made of hard links (``cp -al``, ``rsync --link-dest``) is a run dir of its own:
    the walk knows a folder by the folder, not by its files."""
    import os

    from perflab.store.tree import run_dirs

    out = tmp_path / "outputs"
    RunWriter(out / "runs" / "r0").add(row("r0", 0))
    (out / "snap" / "r0").mkdir(parents=True)
    for name in os.listdir(out / "runs" / "r0"):
        os.link(out / "runs" / "r0" / name, out / "snap" / "r0" / name)
    assert sorted(p.relative_to(out).as_posix() for p in run_dirs(out)) == ["runs/r0", "snap/r0"]


def test_an_index_with_empty_constant_and_wide_columns_loads_as_the_files_do(tmp_path, caplog):
    """The index reads a row group without its empty columns and a constant integer column from
    its statistics, and joins a category of more values than int8 codes hold (140 experiments,
    a row group each) with a new run's: the same frame as reading every file, and no fallback
    to pandas' join."""
    out = tmp_path / "outputs"
    for e in range(140):  # a key of odd runs, empty in the even ones' row groups, and the reverse
        w = RunWriter(out / "runs" / f"r{e}")
        for i in range(2):
            size = "" if (e + i) % 3 == 0 else 2**40 + e * 10 + i  # varies, with gaps, beyond int32
            w.add(row(f"r{e}", i, experiment=f"e{e:03d}", **{f"cfg.k{e % 2}": 7, "cfg.size": size, "job_num": e}))
    load(out)  # the index built
    with caplog.at_level(logging.DEBUG, logger="perflab"):
        warm = load(out)
        one = load(out, experiment="e005")
        RunWriter(out / "runs" / "new").add(row("new", 0, experiment="e005", **{"cfg.k1": 8}))
        after_new = load(out)
    assert "joined as pandas frames" not in caplog.text
    in_order = lambda df: df.sort_values("row_id", ignore_index=True)  # noqa: E731
    same = lambda a, b: pd.testing.assert_frame_equal(in_order(a), in_order(b), check_like=True)  # noqa: E731
    files = load(out / "runs")  # the files, run dir by run dir (in their own column order)
    same(after_new, files)
    same(warm, files[files["run_id"] != "new"])
    same(load(out), after_new)
    assert list(one["row_id"]) == ["r5#0", "r5#1"] and list(one.columns) == list(warm.columns)
    assert one["cfg.k1"].tolist() == [7, 7] and one["cfg.k0"].isna().all()
    assert str(warm["cfg.size"].dtype) == "Int64" and warm["cfg.size"].isna().sum() == 93


def test_a_key_of_two_types_across_segments_loads_as_the_files_do(tmp_path, caplog):
    """A config key that is one integer throughout the index (read from its statistics) and
    text in a new run: the rows are joined as pandas joins frames, the key's values kept."""
    out = tmp_path / "outputs"
    for i in range(3):
        RunWriter(out / "runs" / f"r{i}").add(row(f"r{i}", 0, **{"cfg.x": 4, "job_num": 1}))
    load(out)  # the index built: cfg.x and job_num one integer throughout
    RunWriter(out / "runs" / "new").add(row("new", 0, **{"cfg.x": "big", "job_num": 2}))
    with caplog.at_level(logging.DEBUG, logger="perflab"):
        through_index = load(out)
    assert "joined as pandas frames" in caplog.text
    # the same rows; the key's dtype is object this way, string from the files (as before this index)
    in_order = lambda df: df.astype({"cfg.x": "string"}).sort_values("row_id", ignore_index=True)  # noqa: E731
    files = load(out / "runs")
    pd.testing.assert_frame_equal(in_order(through_index), in_order(files), check_like=True)
    assert in_order(through_index)["cfg.x"].tolist() == ["big", "4", "4", "4"]  # new#0 first


@pytest.mark.parametrize("first", [0.5, "auto"])
def test_a_key_that_becomes_one_integer_in_a_later_segment_keeps_its_values(tmp_path, first):
    """The other order: a key read as a float or as text first, then one integer throughout a
    later segment (its constant, from the statistics, never read as a column): its values are
    kept, on every load, and not lost when the segments are merged into the index."""
    out = tmp_path / "outputs"
    for i in range(2):
        RunWriter(out / "runs" / f"a{i}").add(row(f"a{i}", 0, **{"cfg.x": first}))
    load(out)
    for i in range(2):
        RunWriter(out / "runs" / f"b{i}").add(row(f"b{i}", 0, **{"cfg.x": 4}))
    files = load(out / "runs").sort_values("row_id", ignore_index=True)
    for _ in range(3):  # the new segment written, then read through the index, then merged
        through_index = load(out).sort_values("row_id", ignore_index=True)
        assert through_index["cfg.x"].astype("string").tolist() == files["cfg.x"].astype("string").tolist()
        assert through_index["cfg.x"].notna().all()


def test_many_index_segments_are_merged_into_one(tmp_path):
    out = tmp_path / "outputs"
    for i in range(index.MAX_SEGMENTS + 2):  # each load after a new run dir adds a segment
        RunWriter(out / "runs" / f"r{i}").add(row(f"r{i}", 0))
        assert len(load(out)) == i + 1
    assert len(list((out / ".perflab" / "index").glob("*.parquet"))) <= 2
    assert sorted(load(out)["run_id"]) == sorted(f"r{i}" for i in range(index.MAX_SEGMENTS + 2))


def test_a_read_only_tree_still_loads(tmp_path, readonly):
    assert load(readonly).empty  # no error, even though no index can be written there


def test_load_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "nope")


# --- done and claims --------------------------------------------------------------------------


def record(tmp_path: Path, name: str, config: str, **fields) -> Path:
    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    if fields.get("complete"):  # a complete run holds the rows its run.json counts
        RunWriter(run, samples=False).add({"run_id": name, "experiment": "matmul", "measurement": "m", "status": "ok"})
        fields["rows"] = 1
    RunRecord(run_id=name, experiment="matmul", config_hash=config, **fields).save(run)
    return run


def test_only_a_complete_run_is_done(tmp_path):
    record(tmp_path, "killed", "h1")  # run.json says running: it was killed
    record(tmp_path, "skipped", "h1", outcome="skipped")
    record(tmp_path, "crashed", "h1", outcome="error")
    h1 = done_marks.point_key("h1")
    assert done_marks.find_done(tmp_path, h1) is None
    good = record(tmp_path, "good", "h1", outcome="ok", complete=True)
    done_marks.mark_done(tmp_path, RunRecord.read(good), good)
    assert done_marks.find_done(tmp_path, h1) == good
    import shutil

    shutil.rmtree(good)
    assert done_marks.find_done(tmp_path, h1) is None, "a marker whose run is gone is dropped"


def test_the_done_index_is_rebuilt_from_the_run_dirs(tmp_path):
    good = record(tmp_path, "good", "h2", outcome="ok", complete=True)
    assert done_marks.find_done(tmp_path, done_marks.point_key("h2")) == good  # no index yet: rebuilt on first use


def test_a_store_an_older_perflab_marked_is_read_not_measured_again(tmp_path):
    """0.2 kept done/<config hash>/<run id>: such a store is re-keyed from its run dirs, once."""
    good = record(tmp_path, "good", "h4", outcome="ok", complete=True)
    legacy = tmp_path / ".perflab" / "done" / "h4"
    legacy.mkdir(parents=True)
    (legacy / "good").write_text("runs/good\n")
    assert done_marks.find_done(tmp_path, done_marks.point_key("h4")) == good
    assert not legacy.exists() and (tmp_path / ".perflab" / "done" / done_marks.FORMAT).is_file()


def test_a_rebuild_leaves_another_writers_file_in_flight(tmp_path):
    """Two jobs of a parallel sweep start on a fresh store at once: one's rebuild must not remove
    the other's FORMAT file on its way in (its rename then failed: 'cannot claim this point')."""
    done = tmp_path / ".perflab" / "done"
    done.mkdir(parents=True)
    theirs = done / f".{done_marks.FORMAT}.1a2b3c4d.tmp"
    theirs.write_text("done marks keyed by config hash, subject and process\n")
    done_marks.rebuild_done(tmp_path)
    assert theirs.is_file()
    theirs.replace(done / done_marks.FORMAT)  # their rename still lands


def test_a_new_subject_or_another_process_is_another_point(tmp_path):
    """The same config measured at commit abc is not done at commit def, nor is its process 2."""
    old = record(tmp_path, "old", "h3", outcome="ok", complete=True, subject="abc1234")
    done_marks.mark_done(tmp_path, RunRecord.read(old), old)
    assert done_marks.find_done(tmp_path, done_marks.point_key("h3", "abc1234")) == old
    assert done_marks.find_done(tmp_path, done_marks.point_key("h3", "def5678")) is None
    assert done_marks.find_done(tmp_path, done_marks.point_key("h3", "abc1234", process=2)) is None


def test_a_claim_is_exclusive_until_released_and_a_dead_holders_is_taken_over(tmp_path):
    mine = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    assert isinstance(mine, point_claims.HeldClaim)
    theirs = point_claims.claim(tmp_path, "h", tmp_path / "b", stale_s=60)
    assert isinstance(theirs, point_claims.Holder) and theirs.pid == os.getpid()
    mine.release()
    again = point_claims.claim(tmp_path, "h", tmp_path / "b", stale_s=60)
    assert isinstance(again, point_claims.HeldClaim)
    again.release()
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = tmp_path / ".perflab" / "claims" / "h.json"
    path.write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid, "run_dir": "x", "since": 0}))
    assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "c", stale_s=60), point_claims.HeldClaim)
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "run_dir": "x", "since": 0}))
    os.utime(path, (time.time() - 120, time.time() - 120))  # silent for 2 min: its node died
    assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "d", stale_s=60), point_claims.HeldClaim)


def test_a_requeued_slurm_job_takes_over_the_claim_of_its_own_earlier_run(tmp_path, monkeypatch):
    """After a preemption or a node failure SLURM runs the same job again, maybe on another
    node: the claim its first run left (fresh heartbeat, a host we cannot check) is its own."""
    path = tmp_path / ".perflab" / "claims" / "h.json"
    path.parent.mkdir(parents=True)
    first_run = {"host": "lost-node", "pid": 1, "run_dir": "x", "since": 0, "slurm_job": "42"}
    path.write_text(json.dumps(first_run))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60), point_claims.Holder), (
        "its first run: held"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert isinstance(point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60), point_claims.Holder), (
        "another job's: held"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    got = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    assert isinstance(got, point_claims.HeldClaim)
    assert json.loads(path.read_text())["slurm_job"] == "42"
    got.release()


# --- bad paths, refused before measuring --------------------------------------------------------


@pytest.mark.parametrize(
    "setup, args, fragment",
    [
        (
            lambda w: (w / "file").write_text("x"),
            ["results.ledger=file/ledger.csv"],
            "results.ledger=file/ledger.csv: ",
        ),
        (lambda w: (w / "dir.csv").mkdir(), ["results.ledger=dir.csv"], "a directory, not a regular file"),
        (lambda w: (w / "junk.csv").write_bytes(b"\x00\xff"), ["results.ledger=junk.csv"], "not a CSV text file"),
        (
            lambda w: (w / "foreign.csv").write_text("a,b\n1,2\n"),
            ["results.ledger=foreign.csv"],
            "not a perflab ledger",
        ),
        (lambda w: (w / "store").write_text("x"), ["results.store=store"], "results.store=store: "),
        (
            lambda w: (w / "ck").write_text("x"),
            ["+experiment=quick/train", "trainer.checkpoint_dir=ck"],
            "trainer.checkpoint_dir=ck: ",
        ),
        (
            lambda w: (w / "peaks.json").write_text("{not json"),
            ["+experiment=quick/hardware", "results.peaks=peaks.json"],
            "results.peaks=peaks.json: unreadable",
        ),
    ],
)
def test_bad_output_paths_are_refused_before_anything_is_measured(cli, work, setup, args, fragment):
    setup(work)
    before = {p: p.read_bytes() for p in work.rglob("*") if p.is_file()}
    experiment = [] if any(a.startswith("+experiment") for a in args) else ["+experiment=quick/matmul"]
    ran = cli(*experiment, *args, *FAST, rc=2)
    assert len(ran.err.strip().splitlines()) == 1 and fragment in ran.err
    assert not list(work.rglob("results.csv")), "nothing measured for nothing"
    assert {p: p.read_bytes() for p in work.rglob("*") if p.is_file()} == before, "nothing touched"


def test_read_only_places_are_refused_before_measuring(cli, work, readonly):
    ran = cli("+experiment=quick/matmul", *FAST, f"results.store={readonly}/outputs", rc=2)
    assert f"results.store={readonly}/outputs: cannot write in {readonly} (Read-only file system)" in ran.err
    ran = cli("+experiment=quick/matmul", *FAST, f"results.ledger={readonly}/seed/ledger.csv", rc=2)
    assert "Read-only file system" in ran.err and not list(work.rglob("results.csv"))


def test_a_corrupt_peaks_file_only_read_costs_pct_of_peak_not_the_rows(cli, work):
    (work / "peaks.json").write_text("{broken")
    ran = cli("+experiment=quick/matmul", *FAST, "results.peaks=peaks.json")
    df = load(work / "outputs")
    assert (df["status"] == "ok").all() and "pct_of_peak" not in df
    assert "results.peaks=peaks.json: unreadable" in ran.out
    assert (work / "peaks.json").read_text() == "{broken"


@pytest.mark.parametrize(
    "content, problem",
    [
        ('{"host": "x"}', "host: not an object of devices"),
        ('{"host": {"CPU": [1, 2]}}', "host / CPU: not an object of peaks"),
        ('{"host": {"CPU": {"matmul_float32": -1}}}', "host / CPU / matmul_float32: -1 is not a peak"),
    ],
)
def test_a_peaks_file_of_the_wrong_layout_is_refused_to_its_writer_and_ignored_by_its_readers(
    tmp_path, caplog, content, problem
):
    from perflab.measure.peaks import Peaks

    path = tmp_path / "peaks.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(problem)):
        Peaks.open(path, will_write=True)
    assert Peaks.open(path, will_write=False).lookup("CPU", "matmul_float32") is None  # no pct_of_peak, no crash
    assert problem in caplog.text and path.read_text() == content


def test_releasing_a_claim_that_was_taken_over_leaves_the_new_holders_claim(tmp_path):
    """A holder thought gone (no heartbeat: a stalled node) comes back and finishes: the
    process that took its claim over still holds the point."""
    stalled = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    path = tmp_path / ".perflab" / "claims" / "h.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "host": "elsewhere"}))  # not checkable here
    os.utime(path, (time.time() - 120, time.time() - 120))  # silent for 2 min
    taker = point_claims.claim(tmp_path, "h", tmp_path / "b", stale_s=60)
    assert isinstance(stalled, point_claims.HeldClaim) and isinstance(taker, point_claims.HeldClaim)
    stalled.release()
    assert json.loads(path.read_text())["run_dir"] == str(tmp_path / "b")
    taker.release()
    assert not path.exists()


def test_a_requeued_slurm_job_keeps_one_run_in_its_run_dir(cli, work, monkeypatch):
    """SLURM runs a requeued job again in the run dir its earlier run wrote: an earlier run that
    finished stands (nothing measured twice); one that did not is set aside in .requeued/."""
    args = ("+experiment=quick/matmul", "bench.min_time_s=0", "hydra.run.dir=run")
    cli(*args)
    run_dir = work / "run"
    first = RunRecord.read(run_dir)
    first_rows = (run_dir / "results.csv").read_text()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    cli(*args)
    assert (run_dir / "results.csv").read_text() == first_rows and not (run_dir / ".requeued").exists()

    first.outcome, first.complete = "cancelled", False  # as if SLURM had preempted it part-way
    first.save(run_dir)
    cli(*args)
    earlier = run_dir / ".requeued" / first.run_id
    assert (earlier / "results.csv").read_text() == first_rows and RunRecord.read(earlier).outcome == "cancelled"
    again = RunRecord.read(run_dir)
    assert again.complete and again.run_id != first.run_id
    assert first.run_id not in (run_dir / "results.csv").read_text()


def test_a_run_is_never_written_into_a_run_dir_that_holds_rows_already(cli, work):
    """A re-run into a fixed hydra.run.dir would file the rows there under the new run: one
    line, exit 2, the folder as it was."""
    RunWriter(work / "run", samples=False).add({"run_id": "older", "measurement": "job", "status": "error"})
    before = (work / "run" / "results.csv").read_bytes()
    ran = cli("+experiment=quick/matmul", "bench.min_time_s=0", "hydra.run.dir=run", rc=2)
    assert "hydra.run.dir=run: it already holds a run" in ran.err
    assert sorted(p.name for p in (work / "run").iterdir()) == ["results.csv"]
    assert (work / "run" / "results.csv").read_bytes() == before


def test_discarding_an_empty_run_keeps_the_runs_a_requeued_job_set_aside(tmp_path):
    from perflab.job.ending import discard
    from perflab.store.rundir import EARLIER_RUNS

    earlier = tmp_path / EARLIER_RUNS / "first"
    earlier.mkdir(parents=True)
    (earlier / "results.csv").write_text("row_id\n")
    RunRecord(run_id="second", experiment="matmul", config_hash="h").save(tmp_path)
    discard(tmp_path, also_record=True)
    assert (earlier / "results.csv").is_file() and RunRecord.read(tmp_path) is None


def test_a_claims_fence_travels_to_a_worker_process_and_still_fences(tmp_path):
    """A DDP job's ranks get its RunWriter, fence and all: pickled, the fence checks the same claim."""
    import pickle

    held = point_claims.claim(tmp_path, "h", tmp_path / "a", stale_s=60)
    assert isinstance(held, point_claims.HeldClaim)
    fence = pickle.loads(pickle.dumps(held.fence))
    fence()  # still ours
    path = tmp_path / ".perflab" / "claims" / "h.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "token": "another holder's"}))
    with pytest.raises(point_claims.TakenOver):
        fence()
    held.release()
