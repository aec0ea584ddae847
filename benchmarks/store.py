"""The result store at scale: each reader of a synthetic history (100 rows a run dir, ~90
columns, like real matmul/training rows) timed at several sizes, and how its time grows with
the rows: the exponent of a log-log least-squares fit (1: linear; 2: quadratic).

  done check    "is this sweep point done?" (done_marks.find_done), per point        goal <= 50 ms
  load, cold    load() of the whole history the first time (builds the index)        goal <= 20 s at 1M
  load, first   load() right after the cold one: through the index just built (no goal; said)
  load, warm    load() of the whole history again (through the index)                goal <= 1 s at 1M
  load, one     load(experiment=...) of one experiment (Parquet row-group filter)    goal <= 0.3 s at 1M
  load, +1 run  load() after one more run dir appeared (reads only that one)         goal <= 0.5 s at 1M
  results       ``perflab results``: the listing of the newest 50 runs               goal <= 2 s at 1M
  compare       ``perflab compare`` BASE NEW of the tree against itself (every point  goal <= 5 s at 100k
                matched and judged: the most work two trees of its size can give)
  history       ``perflab history`` of a tree of rows // 100 subjects (one run dir   goal <= 3 s at 1,000
                of 10 rows each, one experiment: 10 series of that many subjects)
  report        ``perflab report``: the HTML report of the tree                      goal <= 30 s at 100k

Each reader can be timed alone (``--figures compare,history``), and each of load's four figures
too (``--figures load_warm``: load_cold, load_warm, load_one, load_new); the history tree is
written in a folder of its own beside the main one.

One tree grows from size to size (only the new run dirs are written); the index is removed
before each cold load. Each figure is written with the machine, the commit and the load
average beside it, and its exponent over all the sizes measured.

    python benchmarks/store.py [--sizes 100k,200k,400k,1M] [--rows 100] [--figures compare,history,...]
                               [--out benchmarks/results/store.csv]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from perflab.results import listing, load
from perflab.store import done_marks
from perflab.store.rows import SAMPLE_COLUMNS, csv_text, order_columns
from perflab.store.rundir import RECORD, RunRecord
from perflab.store.tree import meta

EXPERIMENTS = ("matmul", "train", "compile", "comm", "hardware")


def synthesize(
    root: Path,
    runs: int,
    rows_per_run: int,
    start: int = 0,
    extra: int = 40,
    keys: int = 25,
    done: bool = True,
    experiments: tuple[str, ...] = EXPERIMENTS,
    subjects: bool = False,
) -> list[str]:
    """Run dirs ``start`` .. ``start + runs - 1`` as perflab writes them (rows, run.json, and a
    done marker unless not ``done``), ``extra`` more float columns and ``keys`` config keys a
    row, the run dirs taking turns over ``experiments``; with ``subjects`` each run measures a
    subject of its own (as a nightly run of each commit). Returns the config hashes. Files are
    written plainly (no fsync: not what is measured)."""
    rng = random.Random(start)
    hashes = []
    for r in range(start, start + runs):
        run_id = f"20261122-{r:06d}-{r:012x}"
        experiment = experiments[r % len(experiments)]
        config = f"{r:016x}"
        run_dir = root / "sweeps" / f"sweep{r // 100:03d}" / str(r % 100)
        run_dir.mkdir(parents=True)
        rows = []
        for i in range(rows_per_run):
            row = {
                "row_id": f"{run_id}#{i + 1}",
                "run_id": run_id,
                "sweep_id": f"sweep{r // 100:03d}",
                "job_num": r % 100,
                "experiment": experiment,
                "measurement": f"part {i}",
                "status": "ok",
                "n": 5,
                "median_s": rng.random(),
                "mean_s": rng.random(),
                "std_s": rng.random() / 10,
                "min_s": rng.random(),
                "max_s": rng.random(),
                "iqr_s": rng.random() / 10,
                "noisy": False,
                "timer": "wall_sync",
                "items_per_s": rng.random() * 1e4,
                "tflops": rng.random(),
                "config_hash": config,
                "device_name": "CPU (2 threads)",
                "hostname": "node1",
                "torch": "2.14.1",
                "timestamp": "2026-11-22T10:00:00+00:00",
                "note": "synthetic",
                "rss_peak_mb": 512.0,
                "others_cpu_pct": 1.0,
            }
            if subjects:
                row["subject"] = f"subject-{r:06d}"  # no commit: ordered by when each was measured
            row.update({f"extra_{k}": rng.random() for k in range(extra)})
            row.update({f"cfg.{experiment}.k{k}": k for k in range(keys)})
            rows.append(row)
        columns = order_columns(rows[0])  # csv_text's lines, written faster: no cell here needs quoting
        lines = [",".join(columns)] + [",".join(str(row[c]) for c in columns) for row in rows]
        (run_dir / "results.csv").write_text("\n".join(lines) + "\n")
        record = RunRecord(
            run_id=run_id, experiment=experiment, config_hash=config, outcome="ok", complete=True, rows=rows_per_run
        )
        (run_dir / RECORD).write_text(json.dumps(asdict(record), indent=1) + "\n")
        if done:
            done_marks.mark_done(root, record, run_dir)
        hashes.append(config)
    return hashes


def timed(
    fn: Callable[[], object], repeats: int = 1, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, object]:
    """The median time of ``repeats`` calls (wall time; ``clock=time.process_time``: CPU time),
    and what the last returned."""
    times, out = [], None
    for _ in range(repeats):
        t0 = clock()
        out = fn()
        times.append(clock() - t0)
    return statistics.median(times), out


def cold_load(root: Path, repeats: int = 1, clock: Callable[[], float] = time.perf_counter):
    """load() with no index (removed before each call): reads every run dir from CSV."""

    def once():
        shutil.rmtree(meta(root) / "index", ignore_errors=True)
        return load(root)

    return timed(once, repeats, clock)


def exponent(sizes: list[int], seconds: list[float]) -> float:
    """How time grows with size: the slope of log(seconds) on log(size), least squares (NaN
    from one size)."""
    if len(set(sizes)) < 2:
        return float("nan")
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


FIGURES = ("done", "load", "results", "compare", "history", "report")
LOAD_FIGURES = ("load_cold", "load_warm", "load_one", "load_new")  # "load"'s four, each timed alone


def measure(root: Path, hashes: list[str], which: Sequence[str] = FIGURES) -> dict[str, float]:
    """Every reader's time on the tree as it is now (``hashes``: its points' config hashes);
    ``which``: the readers timed (``FIGURES``)."""
    figures: dict[str, float] = {}
    if "done" in which:
        probe = random.Random(1).sample(hashes, min(200, len(hashes))) + [f"{i:016x}-absent" for i in range(50)]
        per_point = [timed(lambda h=h: done_marks.find_done(root, h))[0] for h in probe]
        figures["done check per sweep point (median)"] = statistics.median(per_point)
    if "load" in which or "load_cold" in which:
        figures["load(), cold (builds the index)"], _ = cold_load(root)
    elif any(f.startswith("load") for f in which):
        load(root)  # the index as the other load figures find it: built
    if "load" in which or "load_warm" in which:
        figures["load(), first after the build (writes the warm cache)"], _ = timed(lambda: load(root))
        os.sync()  # the cache's 1.8 GB (at 1M rows) on disk before the next figures, not written back beside them
        figures["load(), warm"], _ = timed(lambda: load(root), repeats=3)
    elif any(f in which for f in ("load_one", "load_new")):
        load(root)  # and its warm cache written
    if "load" in which or "load_one" in which:
        figures["load(experiment='matmul')"], _ = timed(lambda: load(root, experiment="matmul"), repeats=3)
    if "load" in which or "load_new" in which:
        extra = root / "runs" / "new"
        extra.mkdir(parents=True)
        (extra / "results.csv").write_text(
            csv_text([{"row_id": "new#1", "run_id": "new", "experiment": "matmul", "status": "ok", "median_s": 1.0}])
        )
        figures["load() after one new run dir"], _ = timed(lambda: load(root))
        shutil.rmtree(extra)
    if "results" in which:
        figures["perflab results (the newest 50 runs)"], _ = timed(lambda: listing(root), repeats=3)
    if "compare" in which:
        figures["perflab compare BASE NEW (the tree against itself)"], _ = timed(lambda: command("compare", root, root))
    if "history" in which:
        subjects = len(hashes)
        tree = root.parent / f"history{subjects}"
        if not tree.exists():
            synthesize(tree, subjects, 10, experiments=("matmul",), subjects=True, done=False)
            load(tree)  # its index built: the figure is history's own work
        figures["perflab history (rows // 100 subjects, 10 series)"], _ = timed(lambda: command("history", tree))
    if "report" in which:
        out = root.parent / "report.html"
        figures["perflab report (the whole tree)"], _ = timed(lambda: command("report", root, "--output", out))
    return figures


def command(name: str, *args: object) -> int:
    """``perflab NAME ARGS`` run in this process (its printing to nowhere): the command's own time,
    not Python's start-up."""
    main = importlib.import_module({"report": "perflab.report"}.get(name, f"perflab.{name}")).main
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        code = main([str(a) for a in args])
    if code == 2:  # a usage error is no figure of the reader
        raise SystemExit(f"perflab {name} {' '.join(map(str, args))}: exit 2")
    return code


def size(text: str) -> int:
    """``100k``, ``1M`` or ``5000``: a number of rows."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def machine() -> dict[str, str]:
    """What the figures are taken on: host, CPUs and the commit (the code imported now)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = ""
    return {"host": platform.node(), "cpus": str(os.cpu_count()), "commit": commit or "unknown"}


# --- trees shaped like users' ------------------------------------------------------------------
#
# A nightly history: each subject (a commit) measures every experiment's points, in run dirs of
# one to ten rows, every row with its raw samples (results.samples=true, the default); the first
# experiment's figures step 15 % slower half-way (history must find it). Each reader is timed as
# a whole process (Python's start and imports included, as a user waits for it) with its peak
# memory (wait4's rusage), the old code beside the new on a copy of the same tree, interleaved.
# ``compare_points``: two trees of a suite's 1,000 points instead (#42's "compare A B of two
# 1,000-point trees"), indexed first by the code timed (an untimed compare: the first reader of
# a tree's samples indexes them, ~1.2 s here), then compared warm.

USER_EXPERIMENTS = (("matmul", 1), ("conv", 5), ("attention", 10))  # name, rows a run dir
USER_POINTS = 10  # an experiment's points: its sweep
STEP_PCT = 15.0


def user_tree(root: Path, run_dirs: int, samples: int = 100, start: int = 0, step_at: int | None = None) -> int:
    """About ``run_dirs`` run dirs (whole subjects, each 13 run dirs: USER_EXPERIMENTS' points in
    run dirs of 1, 5 and 10 rows) of subjects ``start``.. as a nightly history; ``samples`` raw
    samples a row (and 2 warm-up); the step from subject ``step_at`` on (default: half-way
    through those written now). Returns the subjects written. Written plainly (no fsync)."""
    per_subject = sum(USER_POINTS // rows for _, rows in USER_EXPERIMENTS)
    subjects = max(1, run_dirs // per_subject)
    rng = np.random.default_rng(start)
    half = start + subjects // 2 if step_at is None else step_at
    for s in range(start, start + subjects):
        when = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() + 86400 * s
        for e, (experiment, per) in enumerate(USER_EXPERIMENTS):
            for first in range(0, USER_POINTS, per):
                slower = 1 + STEP_PCT / 100 * (e == 0 and s >= half)
                points = [(point, 1e-4 * (1 + point) * slower) for point in range(first, first + per)]
                tag = f"{s:06x}{e:02x}{first:04x}"
                user_run_dir(root, when, experiment, e, first // per, tag, f"c{s:07x}", points, samples, rng)
    return subjects


def user_run_dir(
    root: Path,
    when: float,
    experiment: str,
    e: int,
    job: int,
    tag: str,
    subject: str,
    points: Sequence[tuple[int, float]],
    samples: int,
    rng: np.random.Generator,
    process: int | None = None,
) -> None:
    """One run dir of a user's tree: a row per (point, its median seconds), each with ``samples``
    raw samples (and 2 warm-up), as a run of ``experiment`` (its ``e``-th) writes them."""
    stamp = datetime.fromtimestamp(when, timezone.utc).isoformat()
    run_id = f"{datetime.fromtimestamp(when, timezone.utc):%Y%m%d-%H%M%S}-{tag}"
    run_dir = root / "sweeps" / f"{stamp[:10]}_{experiment}" / (str(job) if process is None else f"{job}-{process}")
    run_dir.mkdir(parents=True)
    rows, lines = [], []
    for k, (point, base) in enumerate(points):
        size = 64 << (point % 5)
        times = base * rng.lognormal(0, 0.02, samples)
        q = np.percentile(times, [25, 50, 75, 90, 99])
        row_id = f"{run_id}#{k + 1}"
        rows.append(
            {
                "row_id": row_id,
                "run_id": run_id,
                "sweep_id": f"{stamp[:10]}_{experiment}",
                "job_num": job,
                "experiment": experiment,
                "measurement": f"{experiment} {point // 5}",
                "repeat": 0,
                **({} if process is None else {"process": process}),
                "status": "ok",
                "devices": "cpu",
                "device_name": "CPU (2 threads)",
                "n": samples,
                "median_s": q[1],
                "mean_s": times.mean(),
                "std_s": times.std(),
                "min_s": times.min(),
                "max_s": times.max(),
                "iqr_s": q[2] - q[0],
                "p50_s": q[1],
                "p90_s": q[3],
                "p99_s": q[4],
                "noisy": False,
                "warmup_n": 2,
                "warmup_first_s": base * 3,
                "timer": "wall_sync",
                "calls_per_sample": 1,
                "num_threads": 2,
                "items_per_s": 1 / q[1],
                "tflops": 2 * size**3 / q[1] / 1e12,
                "config_hash": f"{e:02x}{point:04x}",
                "torch": "2.14.1",
                "python": "3.11.7",
                "cpu": "x86_64",
                "hostname": "node1",
                "cpu_model": "Synthetic CPU @ 2.0GHz",
                "kernel": "6.8.0",
                "perflab_version": "0.4.0",
                "subject": subject,
                "subject_time": stamp,
                "timestamp": stamp,
                "cfg.experiment.name": experiment,
                "cfg.experiment.size": size,
                "cfg.experiment.dtype": "float32",
                "cfg.bench.repeats": samples,
                "cfg.bench.warmup": 2,
            }
        )
        head = f"{row_id},{run_id},{experiment},{experiment} {point // 5},"
        lines += [f"{head}warmup,{i},{base * 3!r}" for i in range(2)]
        lines += [f"{head}sample,{i},{t!r}" for i, t in enumerate(times.tolist())]
    columns = order_columns(rows[0])
    text = [",".join(columns)] + [",".join(str(row[c]) for c in columns) for row in rows]
    (run_dir / "results.csv").write_text("\n".join(text) + "\n")
    (run_dir / "samples.csv").write_text(",".join(SAMPLE_COLUMNS) + "\n" + "\n".join(lines) + "\n")
    record = RunRecord(
        run_id=run_id, experiment=experiment, config_hash=run_id, outcome="ok", complete=True, rows=len(rows)
    )
    (run_dir / RECORD).write_text(json.dumps(asdict(record), indent=1) + "\n")


def whole_process(command: Sequence[str], code: Path | None, cwd: Path, limit: float) -> tuple[float, float, int]:
    """(wall seconds, peak resident MB, exit code) of ``command`` run as a process of its own
    (``code``: the perflab checkout it imports, None: this one); past ``limit`` seconds it is
    killed and its time is the limit (exit -9)."""
    env = dict(os.environ, **({"PYTHONPATH": str(code)} if code else {}))
    t0 = time.perf_counter()
    p = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    timer = threading.Timer(limit, p.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(p.pid, 0)
    finally:
        timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024, p.returncode


USER_FIGURES = ("build", "load_one", "results", "compare", "compare_two", "history", "report", "compare_points")
POINTS, PROCESSES = 1000, 3  # compare_points: two trees of 1,000 points, 3 processes a point, a tenth 15 % slower


def points_trees(root: Path, samples: int = 100) -> dict[str, Path]:
    """Two trees of ``POINTS`` points each (``PROCESSES`` processes a point: run dirs of 10 points
    and one process, as ``bench.processes`` writes them), every tenth point ``STEP_PCT`` slower in
    ``new``: ``perflab compare BASE NEW`` of a suite's nightly run against the last."""
    rng = np.random.default_rng(7)
    when = datetime(2026, 6, 1, tzinfo=timezone.utc).timestamp()
    trees = {side: root / side / "outputs" for side in ("base", "new")}
    for side, tree in trees.items():
        for job in range(POINTS // 10):
            for k in range(1, PROCESSES + 1):
                points = [
                    (p, 1e-4 * (1 + p % 50) * (1 + STEP_PCT / 100 * (side == "new" and p % 10 == 0)))
                    for p in range(10 * job, 10 * job + 10)
                ]
                tag = f"{side}{job:04x}{k:02x}"
                user_run_dir(tree, when + k, "matmul", 0, job, tag, side, points, samples, rng, process=k)
    return trees


def user_commands(tree: Path, out: Path) -> dict[str, list[str]]:
    """Each reader as the command a user types (``build``: the first load, which indexes the tree)."""
    py = sys.executable
    load_one = "import sys; from perflab.results import load; load(sys.argv[1], experiment='matmul')"
    return {
        "build": [py, "-c", "import sys; from perflab.results import load; load(sys.argv[1])", str(tree)],
        "load_one": [py, "-c", load_one, str(tree)],
        "results": [py, "-m", "perflab.results", str(tree)],
        "compare": [py, "-m", "perflab.compare", str(tree)],
        "compare_two": [py, "-m", "perflab.compare", str(tree), str(tree)],
        "history": [py, "-m", "perflab.history", str(tree)],
        "report": [py, "-m", "perflab.report", str(tree), "-o", str(out)],
    }


def size_of(folder: Path, names: Sequence[str] | None = None) -> int:
    """Bytes of the files under ``folder`` (only those named ``names``, where given)."""
    total = 0
    for here, _, found in os.walk(folder):
        total += sum(os.path.getsize(os.path.join(here, f)) for f in found if names is None or f in names)
    return total


def user_main(args: argparse.Namespace) -> None:
    """The user-shaped trees' figures, old (``--old``: a checkout of the code before) beside new."""
    which = [f.strip() for f in args.figures.split(",") if f.strip()] if args.figures != ",".join(FIGURES) else []
    which = which or list(USER_FIGURES)
    sizes = sorted(size(s) for s in args.user_trees.split(","))
    codes = {"new": None, **({"old": args.old} if args.old else {})}
    where = machine()
    taken: list[dict[str, object]] = []
    step_at = max(1, sizes[0] // 13) // 2  # half-way through the first tree: the one step of them all
    with contextlib.ExitStack() as stack:
        tmp = str(args.keep) if args.keep else stack.enter_context(tempfile.TemporaryDirectory())
        made, grown = 0, None  # subjects of the last size's tree, and that tree
        for want in sizes:
            # a tree a size, grown from the last one's files (hard links: only new run dirs are
            # written); with --keep a later run finds it and writes nothing
            here = Path(tmp) / str(want)
            trees = {name: here / name / "outputs" for name in codes}
            first = trees["new"]
            kept = here / "made.json"
            t0 = time.perf_counter()
            if kept.exists():
                was = json.loads(kept.read_text())
                if was["samples"] != args.samples or was["step_at"] != step_at:
                    sys.exit(f"--keep {tmp}: {want} run dirs built as {was}: use another folder")
                made = was["subjects"]
            else:
                shutil.rmtree(here, ignore_errors=True)
                if grown is not None:
                    first.parent.mkdir(parents=True)
                    subprocess.run(["cp", "-al", str(grown), str(first)], check=True)
                    shutil.rmtree(meta(first), ignore_errors=True)
                made += user_tree(first, want - made * 13, args.samples, start=made, step_at=step_at)
                kept.write_text(json.dumps({"samples": args.samples, "step_at": step_at, "subjects": made}) + "\n")
            grown = first
            for tree in trees.values():  # the same files, hard-linked: an index each
                if tree != first:
                    shutil.rmtree(tree.parent, ignore_errors=True)
                    subprocess.run(["cp", "-al", str(first.parent), str(tree.parent)], check=True)
                    shutil.rmtree(meta(tree), ignore_errors=True)
            dirs = sum(1 for _ in first.glob("sweeps/*/*"))
            csv_bytes = size_of(first, ("results.csv", "samples.csv"))
            took = time.perf_counter() - t0
            print(f"{dirs} run dirs, {made} subjects, CSVs {csv_bytes / 1e6:.0f} MB (written in {took:.0f} s)")
            for figure in ["build", *[f for f in which if f not in ("build", "compare_points")]]:
                order = list(codes) if len(codes) == 1 else ["old", "new", "new", "old"][: 2 * args.repeats]
                for name in order:
                    out = Path(tmp) / f"report-{name}.html"
                    command = user_commands(trees[name], out)[figure]
                    if figure == "build":  # the first load: indexes the tree
                        shutil.rmtree(meta(trees[name]), ignore_errors=True)
                    loadavg = os.getloadavg()[0]
                    seconds, peak, code = whole_process(command, codes[name], Path(tmp), args.limit)
                    row = {
                        "figure": figure,
                        "code": name,
                        "run_dirs": dirs,
                        "subjects": made,
                        "seconds": round(seconds, 3),
                        "peak_mb": round(peak),
                        "exit": code,
                        "loadavg": f"{loadavg:.2f}",
                        "index_mb": round(size_of(meta(trees[name]) / "index") / 1e6, 2),
                        "csv_mb": round(csv_bytes / 1e6, 2),
                        "html_mb": round(out.stat().st_size / 1e6, 2) if figure == "report" and out.exists() else "",
                        **where,
                    }
                    taken.append(row)
                    print(f"  {figure:12s} {name}: {seconds:7.2f} s, {peak:6.0f} MB, exit {code}, load {loadavg:.2f}")
        if "compare_points" in which:  # two trees of their own, whatever the sizes
            pair = points_trees(Path(tmp) / "points", args.samples)
            command = [sys.executable, "-m", "perflab.compare", str(pair["base"]), str(pair["new"])]
            for name in list(codes) if len(codes) == 1 else ["old", "new", "new", "old"][: 2 * args.repeats]:
                for tree in pair.values():
                    shutil.rmtree(meta(tree), ignore_errors=True)
                whole_process(command, codes[name], Path(tmp), 900)  # indexed (rows, samples) by the code timed
                loadavg = os.getloadavg()[0]  # then compare, warm
                seconds, peak, code = whole_process(command, codes[name], Path(tmp), args.limit)
                dirs = sum(1 for _ in pair["base"].glob("sweeps/*/*"))
                taken.append(
                    {"figure": "compare_points", "code": name, "run_dirs": dirs, "subjects": POINTS}
                    | {"seconds": round(seconds, 3), "peak_mb": round(peak), "exit": code, "loadavg": f"{loadavg:.2f}"}
                    | where
                )
                print(f"  compare_points {name}: {seconds:7.2f} s, {peak:6.0f} MB, exit {code}, load {loadavg:.2f}")
    for row in taken:
        mine = [t for t in taken if t["figure"] == row["figure"] and t["code"] == row["code"]]
        dirs = sorted({int(t["run_dirs"]) for t in mine})
        medians = [statistics.median(float(t["seconds"]) for t in mine if t["run_dirs"] == d) for d in dirs]
        row["exponent"] = f"{exponent(dirs, medians):.3f}"
    from _results import append  # here: tests load this module by path, without benchmarks/ on sys.path

    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    append(args.out, [{"timestamp": when, **t} for t in taken])  # earlier runs' rows stay
    print(f"-> {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="100k,200k,400k,1M", help="rows, comma-separated (default 100k,200k,400k,1M)"
    )
    parser.add_argument("--rows", type=int, default=100, help="rows a run dir (default 100)")
    parser.add_argument(
        "--figures",
        default=",".join(FIGURES),
        help=f"the readers timed, comma-separated (all: {','.join(FIGURES)}; load's alone: {','.join(LOAD_FIGURES)})",
    )
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/store.csv (store_user.csv)")
    parser.add_argument("--user-trees", help="run dirs of user-shaped trees (e.g. 2k,20k): their figures instead")
    parser.add_argument("--samples", type=int, default=100, help="user trees: raw samples a row (default 100)")
    parser.add_argument("--old", type=Path, help="user trees: a checkout of the code before, timed beside")
    parser.add_argument("--repeats", type=int, default=1, help="user trees: old/new pairs a figure (default 1)")
    parser.add_argument("--limit", type=float, default=900, help="user trees: seconds before a command is killed")
    parser.add_argument(
        "--keep", type=Path, help="user trees: build them in this folder and keep them (a later run adds what it lacks)"
    )
    args = parser.parse_args()
    results = Path(__file__).parent / "results"
    if args.user_trees:
        args.out = args.out or results / "store_user.csv"
        return user_main(args)
    args.out = args.out or results / "store.csv"
    sizes = sorted(size(s) for s in args.sizes.split(","))
    which = [f.strip() for f in args.figures.split(",") if f.strip()]
    unknown = [f for f in which if f not in FIGURES + LOAD_FIGURES]
    if unknown:
        parser.error(f"--figures {','.join(unknown)}: allowed: {', '.join(FIGURES + LOAD_FIGURES)}")
    first, where = True, machine()
    taken: list[dict[str, str | int | float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "outputs"
        hashes: list[str] = []
        for rows in sizes:
            runs = rows // args.rows
            t0 = time.perf_counter()
            hashes += synthesize(root, runs - len(hashes), args.rows, start=len(hashes))
            print(f"{rows} rows in {runs} run dirs (written in {time.perf_counter() - t0:.0f} s)")
            loadavg = " ".join(f"{x:.2f}" for x in os.getloadavg())  # when this size's figures were taken
            if first:  # imports (pandas, pyarrow, scipy) are no reader's cost at any size
                load(root), listing(root)
                for module in ("perflab.compare", "perflab.history", "perflab.report", "scipy.stats"):
                    importlib.import_module(module)
                first = False
            for name, seconds in measure(root, hashes, which).items():
                print(f"  {name}: {seconds * 1e3:.1f} ms" if seconds < 1 else f"  {name}: {seconds:.2f} s")
                taken.append(
                    {"figure": name, "rows": rows, "run_dirs": runs, "seconds": seconds, "loadavg": loadavg, **where}
                )
    slopes = {}
    for name in dict.fromkeys(str(t["figure"]) for t in taken):
        mine = [t for t in taken if t["figure"] == name]
        slopes[name] = exponent([int(t["rows"]) for t in mine], [float(t["seconds"]) for t in mine])
        print(f"growth exponent, {name}: {slopes[name]:.2f}")
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # the figures of this run replace the file's of the same reader and size; the others stay
    # (``--figures compare`` leaves the load figures as they were measured)
    measured_now = {(str(t["figure"]), str(t["rows"])) for t in taken}
    kept: list[dict[str, str]] = []
    if args.out.is_file():
        with args.out.open(newline="") as f:
            kept = [r for r in csv.DictReader(f) if (r["figure"], r["rows"]) not in measured_now]
    with args.out.open("w", newline="") as f:
        fields = ["timestamp", "host", "cpus", "commit", "loadavg", "figure", "rows", "run_dirs", "seconds", "exponent"]
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
        for t in taken:
            writer.writerow({"timestamp": when, **t, "exponent": f"{slopes[str(t['figure'])]:.3f}"})
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
