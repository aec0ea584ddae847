"""perflab's readers grow linearly with the history: growth exponents (log-log least squares, as
benchmarks/store.py fits them) from a size to four times it, rows and run dirs alike. Exponents,
not wall-clock limits, and of CPU time: a busy machine slows both sizes alike.

A linear reader shows about 1 (its fixed costs pull it lower). Issue 31's quadratic (each run
dir filtering the whole frame for its rows) shows only where the frame is big enough for its rows
to outweigh each filter's fixed cost: 1.7 at 400k -> 1.6M rows, but about 1 at 5k -> 20k. So
the run-dir bookkeeping is timed on big frames of rows made in memory (no files: fast), and the
whole cold load on a small tree of real files. Where a clock's figure would be milliseconds
(history's subject order), the work itself is counted instead."""

from __future__ import annotations

import gc
import importlib.util
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perflab.results import load
from perflab.store import index
from perflab.store.rows import Notes
from perflab.store.rundir import RunRecord

LINEAR = 1.4  # the most a linear reader shows here, noise included (they show 0.5-1.1)

_spec = importlib.util.spec_from_file_location("benchmark_store", Path(__file__).parents[1] / "benchmarks" / "store.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_run_dirs_rows_are_counted_in_one_pass(monkeypatch):
    """read_runs (every reader of run dirs goes through it) on 1k then 4k run dirs of 400 rows,
    labelled as load() labels run dirs outside a results tree: by absolute path. One run dir
    lacks rows its run.json counts: said, for it alone."""
    per, top = 400, "/home/someone/projects/lab/outputs/sweeps/2026-11-24_12-00-00_0123abcd"

    def rows_in_memory(paths, labels, column, notes):  # what read_many would parse from the files
        runs = [p.parent.name for p in paths]
        runs[7] = "another-run"  # run dir 7 holds another run's rows: its own are missing
        return pd.DataFrame(
            {
                "run_id": pd.array(np.repeat(np.array(runs, dtype=object), per), dtype="string"),
                "median_s": np.random.default_rng(0).random(len(paths) * per),
                column: np.repeat(np.array(labels, dtype=object), per),
            }
        )

    monkeypatch.setattr(index, "read_many", rows_in_memory)
    monkeypatch.setattr(
        index, "record_of", lambda d, notes=None: RunRecord(run_id=d.name, experiment="m", config_hash="h", rows=per)
    )
    sizes, seconds = [400_000, 1_600_000], []
    for rows in sizes:
        dirs = [Path(f"{top}/{i:06d}") for i in range(rows // per)]
        timed = []
        for _ in range(2):  # the best of two, each without the cyclic GC (as timeit): a suite's heap is no size's
            notes = Notes()
            gc.collect()
            gc.disable()
            try:
                t0 = time.process_time()
                df = index.read_runs(dirs, [str(d) for d in dirs], "_source", notes)
                timed.append(time.process_time() - t0)
            finally:
                gc.enable()
            assert len(df) == rows
            assert notes.kinds == {index.ROWS_MISSING: {str(dirs[7] / "results.csv"): per}}
        seconds.append(min(timed))
    growth = bench.exponent(sizes, seconds)
    assert growth < LINEAR, f"read_runs grows as rows^{growth:.2f} ({sizes} rows: {seconds} s of CPU)"


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_cold_load_grows_linearly_with_rows_and_run_dirs(tmp_path):
    """A real tree of 500 then 2000 run dirs of 10 rows: the whole cold load (walk, run.json,
    CSV, the index written) is linear; a per-run-dir loop over all run dirs would show here. So
    are the warm load and one experiment's, through the index (its row groups read, the frame
    built column by column)."""
    root, per_dir, sizes = tmp_path / "outputs", 10, [5_000, 20_000]
    narrow = {"extra": 10, "keys": 2, "done": False}
    bench.synthesize(root, 10, per_dir, **narrow)
    load(root)  # imports, and first-call costs, are no size's
    seconds: dict[str, list[float]] = {"cold": [], "warm": [], "one experiment": []}
    written = 10
    for rows in sizes:
        bench.synthesize(root, rows // per_dir - written, per_dir, start=written, **narrow)
        written = rows // per_dir
        timed = [bench.cold_load(root, clock=time.process_time) for _ in range(2)]
        seconds["cold"].append(min(t for t, _ in timed))  # the less disturbed of two
        assert len(timed[-1][1]) == rows  # what was timed read them all
        warm = bench.timed(lambda: load(root), repeats=3, clock=time.process_time)
        seconds["warm"].append(warm[0])
        assert len(warm[1]) == rows
        one = bench.timed(lambda: load(root, experiment="matmul"), repeats=3, clock=time.process_time)
        seconds["one experiment"].append(one[0])
        assert len(one[1]) == rows // len(bench.EXPERIMENTS)
    for reader, taken in seconds.items():
        growth = bench.exponent(sizes, taken)
        assert growth < LINEAR, f"{reader} load grows as rows^{growth:.2f} ({sizes} rows: {taken} s of CPU)"


class Commits(list):
    """The commits git lists, counting how many times a reader visits one."""

    visits = 0

    def __iter__(self):
        for sha in super().__iter__():
            self.visits += 1
            yield sha

    def split(self) -> "Commits":  # as git rev-list's output is read: its text split in lines
        return self


def test_history_orders_subjects_in_one_pass_over_the_commits(monkeypatch):
    """history's subjects put in commit order: 2k then 8k subjects (short shas) among as many
    commits. Here the exponent is of the work itself, the commits visited (a clock's figure is
    a few milliseconds, which the CPU's caches bend): a search of every commit per subject grows
    as their product (2.0), one pass as the commits (1.0)."""
    from perflab import history

    sizes, visits = [2_000, 8_000], []
    for n in sizes:
        shas = [f"{i:040x}"[::-1] for i in range(n)]  # distinct from their first 7 characters
        subjects = [sha[:7] for sha in reversed(shas)]
        commits = Commits(shas)
        listed = subprocess.CompletedProcess([], 0, stdout=commits)  # what git rev-list says
        monkeypatch.setattr(history.subprocess, "run", lambda *a, listed=listed, **k: listed)
        assert [subjects[i] for i in history.subject_order(subjects, [""] * n)] == [sha[:7] for sha in shas]
        visits.append(commits.visits)
    growth = bench.exponent(sizes, visits)
    assert growth < LINEAR, f"ordering subjects visits commits as subjects^{growth:.2f} ({sizes}: {visits} visits)"


def test_a_points_processes_are_found_in_one_pass():
    """replicates.measured (compare, ab and history judge every point through it) on a point of
    5k then 20k processes of one row each: a search of every row per process grows as their
    product (2.0), one pass as the rows."""
    from perflab.analysis.replicates import measured

    sizes, seconds = [5_000, 20_000], []
    for n in sizes:
        rows = pd.DataFrame(
            {
                "row_id": pd.array([f"run{i}#1" for i in range(n)], dtype="string"),
                "run_id": pd.array([f"run{i}" for i in range(n)], dtype="string"),
                "median_s": np.random.default_rng(n).random(n) + 0.5,
            }
        )
        samples = {f"run{i}#1": np.array([0.5, 0.6, 0.7]) for i in range(0, n, 2)}  # half the rows kept samples
        timed = []
        for _ in range(2):
            t0 = time.process_time()
            point = measured(rows, "median_s", samples)
            timed.append(time.process_time() - t0)
        assert point.n_processes == n and len(point.processes) == n
        seconds.append(min(timed))
    growth = bench.exponent(sizes, seconds)
    assert growth < LINEAR, f"measured grows as processes^{growth:.2f} ({sizes}: {seconds} s of CPU)"


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_loads_through_the_index_grow_linearly_and_read_one_experiment_alone(tmp_path):
    """The same kind of tree, its index built: a warm load, one experiment's, and a load after one
    more run dir (its rows appended to the index's, not the index rebuilt) are linear. The index
    keeps each experiment's stretch of rows in a row group of its own: one experiment is read alone."""
    import pyarrow.parquet as pq

    root, per_dir, sizes = tmp_path / "outputs", 10, [5_000, 20_000]
    narrow = {"extra": 10, "keys": 2, "done": False}
    bench.synthesize(root, 10, per_dir, **narrow)
    load(root)
    seconds: dict[str, list[float]] = {"warm": [], "one": [], "new": []}
    written = 10
    for rows in sizes:
        bench.synthesize(root, rows // per_dir - written, per_dir, start=written, **narrow)
        written = rows // per_dir
        bench.cold_load(root)
        (segment,) = (root / ".perflab" / "index").glob("*.parquet")
        assert pq.ParquetFile(segment).metadata.num_row_groups == len(bench.EXPERIMENTS)
        warm = [bench.timed(lambda: load(root), clock=time.process_time) for _ in range(2)]
        one = [bench.timed(lambda: load(root, experiment="matmul"), clock=time.process_time) for _ in range(2)]
        assert len(warm[-1][1]) == rows and len(one[-1][1]) == rows // len(bench.EXPERIMENTS)
        new = []
        for i in range(2):
            bench.synthesize(root / "runs" / f"new{i}", 1, 1, start=10**6 + rows + i, **narrow)
            new.append(bench.timed(lambda: load(root), clock=time.process_time))
            assert len(new[-1][1]) == rows + i + 1
            kept = sorted((root / ".perflab" / "index").glob("*.parquet"))
            assert segment in kept and len(kept) == i + 2, "the new run's rows a segment of their own, beside"
        shutil.rmtree(root / "runs")
        seconds["warm"].append(min(t for t, _ in warm))
        seconds["one"].append(min(t for t, _ in one))
        seconds["new"].append(min(t for t, _ in new))
    for name, taken in seconds.items():
        growth = bench.exponent(sizes, taken)
        assert growth < LINEAR, f"load ({name}) grows as rows^{growth:.2f} ({sizes} rows: {taken} s of CPU)"


@pytest.mark.slow  # the report built 4 times on trees of up to 8000 rows; the loads' growth is tested fast above
def test_report_grows_linearly_with_rows_and_runs(tmp_path):
    """The HTML report of a tree of 20 then 80 run dirs of 100 rows (every experiment's section,
    the claims, the trend over runs): linear. A section's rows converted again for each run, or
    each run's rows filtered from the whole frame, would show here as their product."""
    from perflab.report import build

    root, per_dir, sizes = tmp_path / "outputs", 100, [2_000, 8_000]
    narrow = {"extra": 10, "keys": 5, "done": False}
    bench.synthesize(root, 5, per_dir, **narrow)
    build(root)  # imports (an experiment's hook may import torch), and first-call costs, are no size's
    seconds, written = [], 5
    for rows in sizes:
        bench.synthesize(root, rows // per_dir - written, per_dir, start=written, **narrow)
        written = rows // per_dir
        load(root)  # the index built: the report's own work is timed
        timed = []
        for _ in range(2):
            t0 = time.process_time()
            page = build(root)
            timed.append(time.process_time() - t0)
        assert f"{rows} rows from {written} runs" in page
        seconds.append(min(timed))  # the less disturbed of two
    growth = bench.exponent(sizes, seconds)
    assert growth < LINEAR, f"the report grows as rows^{growth:.2f} ({sizes} rows: {seconds} s of CPU)"


def test_readers_of_a_tree_shaped_like_users_grow_linearly_and_its_index_stays_smaller(tmp_path):
    """benchmarks/store.py's user-shaped tree (run dirs of 1, 5 and 10 rows, each with its raw
    samples; a nightly history) of 5 then 20 subjects, its index built: one experiment's rows, the
    samples of its rows, compare of the tree and history are linear in CPU time (the same readers
    the benchmark times as whole processes), and `.perflab/` stays smaller than the CSVs."""
    from perflab.analysis.replicates import samples_by_row
    from perflab.compare import compare
    from perflab.history import load_series

    root, made, sizes = tmp_path / "outputs", 0, [65, 260]
    readers = {
        "one experiment": lambda: load(root, experiment="matmul"),
        "its samples": lambda: samples_by_row([root], row_ids=load(root, experiment="matmul")["row_id"]),
        "compare": lambda: compare(root),
        "history": lambda: load_series([str(root)]),
    }
    seconds: dict[str, list[float]] = {name: [] for name in readers}
    for run_dirs in sizes:
        made += bench.user_tree(root, run_dirs - made * 13, samples=20, start=made, step_at=2)
        load(root)  # the index built (and imports made): the readers' own work is timed
        for name, reader in readers.items():
            if run_dirs == sizes[0]:
                reader()  # imports and first calls are no size's
            seconds[name].append(min(bench.timed(reader, clock=time.process_time)[0] for _ in range(2)))
        csvs = bench.size_of(root, ("results.csv", "samples.csv"))
        assert bench.size_of(root / ".perflab") < csvs, "the index is no larger than the CSVs it indexes"
    assert len(samples_by_row([root])) == made * 30, "every row's samples, from the index"
    for name, taken in seconds.items():
        growth = bench.exponent(sizes, taken)
        assert growth < LINEAR, f"{name} grows as run dirs^{growth:.2f} ({sizes} run dirs: {taken} s of CPU)"


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_the_readers_of_a_tree_import_no_torch(tmp_path):
    """report, compare and history of a user-shaped tree (matmul rows among them, whose headline
    the report writes) import no torch: seconds of a whole command on 2 cores. Checked by what
    is imported, not by time."""
    import sys

    root = tmp_path / "outputs"
    bench.user_tree(root, 26, samples=20, step_at=1)
    script = (
        "import sys\nfrom perflab import compare, history, report\n"
        "codes = [report.main([sys.argv[1], '-o', sys.argv[2]]), compare.main(sys.argv[1:2]), "
        "history.main(sys.argv[1:2])]\n"
        "print(codes, 'torch' in sys.modules)"
    )
    args = [str(root), str(tmp_path / "report.html")]
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.splitlines()[-1] == "[0, 0, 3] False", done.stderr[-2000:]  # history: 2 subjects, too few
