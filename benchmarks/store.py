"""The result store at scale: a synthetic history of 1M rows in 10k run dirs (100 rows each,
~90 columns, like real matmul/training rows), then the figures that matter:

  done check    "is this sweep point done?" (done_marks.find_done), per point        goal <= 50 ms
  load, cold    load() of the whole history the first time (builds the index)
  load, warm    load() of the whole history again (through the index)
  load, one     load(experiment=...) of one experiment (Parquet row-group filter)
  load, +1 run  load() after one more run dir appeared (reads only that one)

    python benchmarks/store.py [--runs 10000] [--rows 100] [--out benchmarks/results/store.csv]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from perflab.results import load
from perflab.store import done_marks
from perflab.store.rows import csv_text
from perflab.store.rundir import RunRecord

EXPERIMENTS = ("matmul", "train", "compile", "comm", "hardware")


def synthesize(root: Path, runs: int, rows_per_run: int) -> list[str]:
    """Run dirs as perflab writes them (rows, run.json, done marker); returns the config hashes."""
    rng = random.Random(0)
    hashes = []
    for r in range(runs):
        run_id = f"20261122-{r:06d}-{r:012x}"
        experiment = EXPERIMENTS[r % len(EXPERIMENTS)]
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
            row.update({f"extra_{k}": rng.random() for k in range(40)})
            row.update({f"cfg.{experiment}.k{k}": k for k in range(25)})
            rows.append(row)
        (run_dir / "results.csv").write_text(csv_text(rows))
        record = RunRecord(run_id=run_id, experiment=experiment, config_hash=config, outcome="ok", complete=True)
        record.save(run_dir)
        done_marks.mark_done(root, record, run_dir)
        hashes.append(config)
    return hashes


def timed(fn, repeats: int = 1) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "store.csv")
    args = parser.parse_args()
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "outputs"
        t0 = time.perf_counter()
        hashes = synthesize(root, args.runs, args.rows)
        print(f"synthesized {args.runs} run dirs x {args.rows} rows in {time.perf_counter() - t0:.0f} s")
        probe = random.Random(1).sample(hashes, 200) + [f"{i:016x}-absent" for i in range(50)]
        per_point = [timed(lambda h=h: done_marks.find_done(root, h))[0] for h in probe]
        figures.append(("done check per sweep point (median of 250)", statistics.median(per_point)))
        figures.append(("done check per sweep point (worst of 250)", max(per_point)))
        cold, df = timed(lambda: load(root))
        figures.append((f"load() of all {len(df)} rows, cold (builds the index)", cold))
        warm, df = timed(lambda: load(root), repeats=3)
        figures.append((f"load() of all {len(df)} rows, warm", warm))
        one, part = timed(lambda: load(root, experiment="matmul"), repeats=3)
        figures.append((f"load(experiment='matmul'): {len(part)} rows", one))
        extra = root / "runs" / "new"
        extra.mkdir(parents=True)
        (extra / "results.csv").write_text(
            csv_text([{"row_id": "new#1", "run_id": "new", "experiment": "matmul", "status": "ok", "median_s": 1.0}])
        )
        more, df = timed(lambda: load(root))
        figures.append((f"load() after one new run dir: {len(df)} rows", more))
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        f.write("timestamp,host,runs,rows_per_run,figure,seconds\n")
        for name, seconds in figures:
            print(f"{name}: {seconds * 1e3:.1f} ms" if seconds < 1 else f"{name}: {seconds:.2f} s")
            f.write(f'{when},{platform.node()},{args.runs},{args.rows},"{name}",{seconds}\n')
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
