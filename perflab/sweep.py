"""Sweeps that behave: each job leaves a one-word outcome; when the sweep ends, a Hydra
callback joins every job's rows into ``sweep.csv`` and says how many of each outcome."""

from __future__ import annotations

import csv
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from perflab.results import RESULTS, write_csv

log = logging.getLogger("perflab")

OUTCOME = "outcome.txt"
SWEEP_CSV = "sweep.csv"
# ok: ran; done: already in the ledger (not run again); skipped: devices missing;
# refused: a bad value for this point; error / oom: it crashed.
OUTCOMES = ("ok", "done", "skipped", "refused", "error", "oom")
last_tally: Counter | None = None  # the latest sweep's outcomes, for the exit code


def write_outcome(job_dir: Path, outcome: str) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / OUTCOME).write_text(outcome + "\n")


def exit_code(tally: Counter) -> int:
    """0 if any point ran (or had run before) or all were skipped; else 1 for crashes, 2 for bad values."""
    if tally["ok"] or tally["done"] or not (tally["error"] or tally["oom"] or tally["refused"]):
        return 0
    return 1 if tally["error"] or tally["oom"] else 2


def completed_run(ledger: Path | None, config_hash: str) -> str | None:
    """The run_id of a finished run of this exact config in the ledger (all rows ok/skipped)."""
    if ledger is None or not ledger.is_file():
        return None
    runs: dict[str, bool] = {}
    with ledger.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("config_hash") == config_hash:
                ok = row.get("status") in ("ok", "skipped")
                runs[row["run_id"]] = runs.get(row["run_id"], True) and ok
    return next((run for run, ok in runs.items() if ok), None)


def summarize(sweep_dir: Path) -> Counter:
    """Write ``sweep.csv`` (every job's rows) and return the count of each outcome."""
    tally: Counter = Counter()
    rows: list[dict[str, Any]] = []
    for job in sorted((p for p in sweep_dir.iterdir() if p.is_dir()), key=_job_order):
        if (job / OUTCOME).is_file():
            tally[(job / OUTCOME).read_text().strip()] += 1
        if (job / RESULTS).is_file():
            with (job / RESULTS).open(newline="") as f:
                rows += list(csv.DictReader(f))
    if rows:
        write_csv(sweep_dir / SWEEP_CSV, rows)
    return tally


def _job_order(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (1 << 30, path.name)


class SweepSummary(Callback):
    """Hydra callback (conf/config.yaml: hydra.callbacks) run once at the end of a ``-m`` sweep."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global last_tally
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        last_tally = summarize(sweep_dir)
        counts = ", ".join(f"{last_tally[o]} {o}" for o in OUTCOMES if last_tally[o])
        where = sweep_dir / SWEEP_CSV if (sweep_dir / SWEEP_CSV).exists() else sweep_dir
        print(f"sweep: {sum(last_tally.values())} jobs: {counts or 'none'} -> {where}")
