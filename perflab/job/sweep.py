"""The end of a sweep: every point's outcome from its run.json, all rows in ``sweep.csv``
(a point done in an earlier sweep brings that run's rows), a table of the points, one summary
line, and the sweep's exit code.

Exit code: 0 if any point ran (or had run before) or all were skipped; else 1 if any point
crashed, was stopped or killed, 2 if every failure was a bad value.
"""

from __future__ import annotations

import logging
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from perflab.analysis.table import figure, flags, points_table
from perflab.config.session import CURRENT
from perflab.results import metric_of
from perflab.store import files
from perflab.store.outcome import Outcome
from perflab.store.rows import csv_text
from perflab.store.rundir import RunRecord, overrides_of, rows_of

log = logging.getLogger("perflab")
SWEEP_CSV = "sweep.csv"


@dataclass
class Summary:
    tally: Counter
    points: list[dict[str, str]]
    csv: Path | None
    not_tried: list[str] = field(default_factory=list)  # "job 3 (experiment.size=48)": the sweep stopped first
    no_csv: str = ""  # why there is no sweep.csv

    @property
    def exit_code(self) -> int:
        t = self.tally
        if t["ok"] or t["done"] or not any(t[o] for o in Outcome if o != Outcome.SKIPPED):
            return 0
        return 2 if set(+t) <= {"refused", "skipped"} else 1

    def line(self, sweep_dir: Path) -> str:
        counts = ", ".join(f"{self.tally[o]} {o}" for o in Outcome if self.tally[o])
        untried = f", {len(self.not_tried)} not tried" if self.not_tried else ""
        where = self.csv or f"{sweep_dir} (no {SWEEP_CSV}: {self.no_csv})"
        return f"sweep: {sum(self.tally.values())} jobs: {counts or 'none'}{untried} -> {where}"


def _job_order(path: Path) -> tuple[int, str]:
    """Jobs by number (2 before 10); any other folder after them."""
    return (int(path.name), "") if path.name.isdigit() else (1 << 30, path.name)


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")), key=_job_order)


def summarize(sweep_dir: Path, failures: dict[str, RunRecord] | None = None) -> Summary:
    """Tally the points, write ``sweep.csv`` with every point's rows, build the points table.

    ``failures``: records a launcher wrote for points that could not speak for themselves
    (a job killed by SLURM), by job dir name.
    """
    tally: Counter = Counter()
    rows: list[dict[str, Any]] = []
    points = []
    jobs = _jobs(sweep_dir, failures)
    session = CURRENT.get()
    every = session.points if session is not None else []
    overrides = {job.name: _overrides(job) or _point(every, job.name) for job in jobs}
    varying = _varying(overrides)
    for job in jobs:
        record = RunRecord.read(job) or (failures or {}).get(job.name)
        outcome = record.outcome if record else "running"
        tally[outcome] += 1
        source = Path(record.same_as) if record and record.outcome == "done" and record.same_as else job
        part = rows_of(source).to_dict("records")
        rows += part
        metric = metric_of(part)
        shown = _headline_row(record, part, metric) if record else None
        points.append(
            {
                "job": job.name,
                **{k: overrides[job.name].get(k, "") for k in varying},
                "outcome": outcome,
                "result": figure(shown, metric) if shown else ("(below)" if record and record.error else ""),
                "flags": flags(shown) if shown else "",
            }
        )
    if not any(p["flags"] for p in points):
        points = [{k: v for k, v in p.items() if k != "flags"} for p in points]
    csv, no_csv = None, "no point wrote a row"
    if rows:
        try:
            files.write_atomic(sweep_dir / SWEEP_CSV, csv_text(rows))
            csv = sweep_dir / SWEEP_CSV
        except OSError as err:  # a full disk: the points' own results.csv still hold their rows
            no_csv = files.os_line(err)
            log.error(
                "perflab: sweep.csv not written (%s); each point's rows are in its results.csv", files.os_line(err)
            )
    tried = {job.name for job in jobs}
    swept = _varying({str(n): _point(every, str(n)) for n in range(len(every))})
    not_tried = [
        f"job {n} ({' '.join(f'{k}={v}' for k, v in _point(every, str(n)).items() if k in swept)})"
        for n in range(len(every))
        if str(n) not in tried
    ]
    return Summary(tally, points, csv, not_tried, no_csv)


def _jobs(sweep_dir: Path, failures: dict[str, RunRecord] | None) -> list[Path]:
    """The job dirs, and the jobs whose folder is gone but whose record a launcher or a full
    disk left in ``failures``."""
    gone = [sweep_dir / name for name in failures or {} if not (sweep_dir / name).is_dir()]
    return sorted([*job_dirs(sweep_dir), *gone], key=_job_order)


def _point(every: list[list[str]], name: str) -> dict[str, str]:
    """Point ``name``'s overrides from the sweep's list (for a job that left no folder)."""
    n = int(name) if name.isdigit() else -1
    return dict(o.lstrip("+~").split("=", 1) for o in every[n] if "=" in o) if 0 <= n < len(every) else {}


def _overrides(job: Path) -> dict[str, str]:
    return dict(o.lstrip("+~").split("=", 1) for o in overrides_of(job) if "=" in o)


def _varying(overrides: dict[str, dict[str, str]]) -> list[str]:
    keys = list(dict.fromkeys(k for o in overrides.values() for k in o))
    return [k for k in keys if len({o.get(k) for o in overrides.values()}) > 1]


def _headline_row(record: RunRecord, rows: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """The row that speaks for a point: its last ok row with a value of the metric (a failed
    point's error is printed in full under the table)."""
    if record.outcome not in ("ok", "done"):
        return None
    return next((r for r in reversed(rows) if r.get("status") == "ok" and figure(r, metric)), None)


def discard_if_empty(sweep_dir: Path | None) -> None:
    """Remove a sweep folder no point ran in (it holds Hydra's multirun.yaml and nothing else;
    a user's file in a folder they named stays, and its folder)."""
    if sweep_dir is not None and sweep_dir.is_dir() and not job_dirs(sweep_dir):
        files.remove_made(sweep_dir, ["multirun.yaml"])


def finish(sweep_dir: Path, failures: dict[str, RunRecord] | None = None) -> Summary:
    """Summarize, print the points and the summary line, and tell the session the exit code."""
    summary = summarize(sweep_dir, failures)
    if summary.points:
        print(points_table(summary.points))
        for job in _jobs(sweep_dir, failures):
            record = RunRecord.read(job) or (failures or {}).get(job.name)
            if record and record.error and record.outcome not in ("ok", "done"):
                print(textwrap.fill(f"job {job.name}: {record.error}", width=100, subsequent_indent="    "))
    if summary.not_tried:  # the sweep stopped before these (a full disk, a folder Hydra could not make)
        print(f"not tried: {', '.join(summary.not_tried)}")
    print(summary.line(sweep_dir))
    session = CURRENT.get()
    if session is not None:
        session.sweep_exit = summary.exit_code
    return summary


class SweepSummary(Callback):
    """Hydra callback (conf/config.yaml: hydra.callbacks) run once at the end of a ``-m`` sweep,
    in the process that launched it, whichever launcher ran the jobs; and at the start of a run
    or a sweep, before Hydra writes its folder: a folder that holds runs already is refused."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_folder(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            sweep_dir = Path(config.hydra.sweep.dir)
        except OmegaConfBaseException:  # a folder that does not resolve: Hydra's sweeper says so next
            return
        check_folder(config, "hydra.sweep.dir")
        session = CURRENT.get()
        if session is not None:  # so that a sweep refused before any point ran leaves no folder
            session.sweep_dir = sweep_dir
        check_points(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.is_dir():
            session = CURRENT.get()
            finish(sweep_dir, session.unsaved if session is not None else None)


def points(config: DictConfig) -> list[list[str]]:
    """Every point of the sweep as its overrides, as Hydra's basic sweeper splits them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False) or []]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    return [list(p) for batch in BasicSweeper.split_arguments(parser.parse_overrides(task), None) for p in batch]


def check_folder(config: DictConfig, key: str) -> None:
    """The run or sweep folder Hydra is about to write is new or empty (tree.check_run_dir), or
    the command is refused in one line before Hydra writes a file there."""
    from perflab.errors import ConfigError
    from perflab.store import point_claims, tree

    if point_claims.requeued():  # SLURM runs this job again in its own folder: its earlier run is set aside
        return
    try:
        folder, store = OmegaConf.select(config, key), config.results.store
    except OmegaConfBaseException:  # a folder that does not resolve: Hydra says so next
        return
    if folder is None or store is None:
        return
    try:
        tree.check_run_dir(key, Path(str(folder)), Path(str(store)))
    except ConfigError as err:
        raise Refused(err.line()) from None


def check_points(config: DictConfig) -> None:
    """One rule for a bad value in a sweep: whatever the schema refutes (a type, a range, a key,
    an interpolation, a name that is no device on any machine: ``tpu:0``) in any point refuses
    the whole sweep before any point runs, in one line (exit 2). What only a point's devices can
    refute (a GPU this machine lacks, TF32 on a CPU) is that point's own row, and the sweep goes on."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import open_dict

    from perflab.errors import ConfigError, one_line
    from perflab.job.execute import check_overrides, check_values

    every = points(config)
    session = CURRENT.get()
    if session is not None:  # the summary names the points a stopped sweep never tried
        session.points = every
    loader = GlobalHydra.instance().config_loader()
    for n, point in enumerate(every):
        try:
            check_overrides(point)
            cfg = loader.load_sweep_config(master_config=config, sweep_overrides=point)
            with open_dict(cfg):
                del cfg["hydra"]  # as the job gets it (the sweep's own keys resolve only in the job)
            check_values(cfg)
        except ConfigError as err:
            where = f"in point #{n} of the sweep's {len(every)}, so no point was run"
            problem = "; ".join(x for x in (err.problem, where) if x)
            raise Refused(type(err)(err.key, err.value, err.allowed, problem).line()) from None
        except (HydraException, OmegaConfBaseException) as err:  # a value of the wrong type
            raise Refused(f"{one_line(err)} (in point #{n} of the sweep's {len(every)}, so no point was run)") from None


class Refused(BaseException):
    """A sweep refused before any point ran, with its one line. A BaseException: Hydra turns
    an Exception raised in a callback into a warning and carries on with the sweep."""
