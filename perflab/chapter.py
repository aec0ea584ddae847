"""``perflab chapter``: chapter 13 of *Dive into Deep Learning* on this machine in one command,
sized to a time budget, each of the book's claims judged, in one report.

    python -m perflab.chapter [--budget MINUTES] [-o report.html] [--store DIR] [--fresh]

Calibrate, plan each experiment's share of the budget (:mod:`perflab.book` sizes its points),
run the points as one sweep dir through perflab's one job path, then ``sweep.csv``, the report
and the verdicts; docs/chapter.md says each step, and how a stopped chapter continues.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import secrets
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from perflab import book
from perflab.analysis.claims import section_key
from perflab.config import registry
from perflab.errors import ConfigError, OneLineParser
from perflab.job import logs
from perflab.job.ending import record_time
from perflab.job.stop import terminate_as_interrupt
from perflab.measure.sizing import Calibration, Point, calibrate, showing
from perflab.store import files
from perflab.store.tree import meta

log = logging.getLogger("perflab")

PLAN = "chapter.json"
REPORT_S = 25.0  # kept at the end for the report (loading, claims, figures: ~10 s on 2 busy cores)
MARGIN = 0.8  # the plan fills this share of the time left: the machine's noise gets the rest
FIRST_JOB_S = 3.0  # the first job's own start (Hydra's first compose, imports), beside its estimate
PRIOR_S = 60.0  # how much on-time work the ETA's lateness starts from, at least the largest job's (Progress)
Pace = dict[str, float]  # Point.key -> the job's time over its hook's estimate on this machine before
PACE = (0.25, 4.0)  # a job's pace here (its time over its hook's estimate) is kept within these bounds
GROW_FROM, GROW_MAX = 1.5, 1.5  # ahead of time, what is left grows when it would fill under 2/3 of it, by 1.5x at most
SMALLEST_S = 1.0  # the seconds that size every experiment at its smallest (each hook's lower bounds)


@dataclass
class Chapter:
    """A chapter's plan and progress: what ``chapter.json`` holds."""

    budget_min: float
    host: str
    started: str
    machine: Calibration
    points: list[Point]
    seconds: dict[str, float]  # each experiment's share of the budget, in seconds (re-sizing lowers it)
    redo: bool = True  # measure anew (a new chapter), or reuse what was done (one that continues)
    outcomes: dict[str, str] = field(default_factory=dict)  # point number -> outcome
    finished: str = ""
    pace: dict[str, float] = field(default_factory=dict)  # Point.key -> its time over its hook's estimate here

    def save(self, folder: Path) -> None:
        data = {
            "budget_min": self.budget_min,
            "host": self.host,
            "started": self.started,
            "finished": self.finished,
            "redo": self.redo,
            "machine": asdict(self.machine),
            "seconds": self.seconds,
            "points": [asdict(p) for p in self.points],
            "outcomes": self.outcomes,
            "pace": self.pace,
        }
        files.write_atomic(folder / PLAN, json.dumps(data, indent=2) + "\n")

    @classmethod
    def read(cls, folder: Path) -> "Chapter":
        """The plan kept in ``folder``, checked against this class's fields and types (OmegaConf's
        structured config) and against the experiments here; :class:`Unreadable` otherwise."""
        path = folder / PLAN
        try:
            data = files.read_json(path)
            if not isinstance(data, dict):
                raise ValueError(f"JSON {type(data).__name__}, not an object")
            chapter = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), data))
        except (OSError, ValueError, OmegaConfBaseException) as err:
            key = getattr(err, "full_key", "")
            raise Unreadable(path, (f"{key}: " if key else "") + (str(err).strip().splitlines() or [""])[0]) from err
        assert isinstance(chapter, cls)
        why = chapter.mismatch()
        if why:
            raise Unreadable(path, why)
        return chapter

    def mismatch(self) -> str:
        """Why these points cannot be run as this plan says ("" when they can): a point of an
        experiment that does not take part here, or has no share; an outcome of no point."""
        taking = in_chapter()
        for i, p in enumerate(self.points):
            if p.module not in taking or p.module not in self.seconds:
                return f"points[{i}]: module {p.module!r} is no experiment of the chapter here"
        numbers = {str(i) for i in range(len(self.points))}
        stray = sorted(set(self.outcomes) - numbers)
        if stray:
            n = len(self.points)
            return f"outcomes: an outcome of point {stray[0]}, but the plan has {n} point{'s' if n != 1 else ''}"
        return ""


class Unreadable(Exception):
    """A chapter's plan that cannot be continued: not JSON, not a plan, or not one of the
    experiments here. The chapter says so and a new one starts; the file is left as it is."""

    def __init__(self, path: Path, why: str) -> None:
        self.path, self.why = path, why
        super().__init__(f"{path}: {why}")


# --- the plan ---------------------------------------------------------------------------------


def in_chapter() -> dict[str, book.Part]:
    """The experiments that take part (sizes and a share of the budget, :mod:`perflab.book`), by name."""
    found = {name: e.book for name, e in registry.discover().items()}
    return {name: p for name, p in found.items() if p.in_chapter}


def plan(machine: Calibration, seconds: float, pace: Pace | None = None) -> tuple[list[Point], dict[str, float]]:
    """Every taking-part experiment's points for ``seconds`` in all, split by their shares, at
    the ``pace`` the same jobs had on this machine before (:func:`sized`). The
    experiments that measure the machine's peaks go first (the others' rows are judged against
    them), then the largest groups of points compared with one another: a pair that has started
    cannot be resized, so the small jobs come last, where running late can still shrink them.
    (The report orders the sections by the book, whatever order they ran in.)"""
    taking = in_chapter()
    total = sum(p.share for p in taking.values())
    given = {name: seconds * p.share / total for name, p in taking.items()}
    points = [p for name in taking for p in sized(name, machine, given[name], pace or {})]
    first = {name for name in taking if registry.get(name).hooks.WRITES_PEAKS}
    size: dict[str, float] = {}
    for p in points:
        size[p.group or p.module] = size.get(p.group or p.module, 0.0) + p.estimate_s
    points.sort(key=lambda p: (p.module not in first, -size[p.group or p.module], section_key(p.section)))
    return points, given


def with_module(point: Point, module: str) -> Point:
    point.module = module
    return point


def sized(module: str, machine: Calibration, seconds: float, pace: dict[str, float]) -> list[Point]:
    """The experiment's points for ``seconds``, each estimated as its hook says times the pace
    the same job had on this machine before (``pace[point.key]``: its time over the hook's
    estimate then; 1 for a job not run here yet). Where that pace says the hook's model is off,
    the hook is asked again for the seconds that, at that pace, fill ``seconds``."""
    hook = registry.get(module).book.chapter
    assert hook is not None, f"{module} takes no part in the chapter"
    points = [with_module(p, module) for p in hook(machine, seconds)]
    model = sum(p.estimate_s for p in points)
    expected = sum(p.estimate_s * pace.get(p.key, 1.0) for p in points)
    if model > 0 and expected > 0 and abs(expected / model - 1) > 0.05:
        points = [with_module(p, module) for p in hook(machine, seconds * model / expected)]
    for p in points:
        p.model_s = p.estimate_s
        p.estimate_s = p.model_s * pace.get(p.key, 1.0)
    return points


def learned(point: Point, spent_s: float, before: float | None = None) -> float:
    """The pace of a job that ran: its time over its hook's estimate (within :data:`PACE`), the
    geometric mean with its pace ``before`` where it had one (one busy run moves it half-way)."""
    now = min(PACE[1], max(PACE[0], spent_s / point.model_s))
    return now if before is None else math.sqrt(before * now)


def resize(chapter: Chapter, started: set[int], left_s: float, late: float) -> float:
    """Size the points not yet started to the time left, at the pace so far (``late``: the
    actual over the estimated time of the jobs run): down when they would not fit in
    ``left_s``, up (at most 1.5x a step) when they would fill less than two thirds of it. A point
    whose group has a started point keeps its size (its comparison needs the same sizes).
    Returns the factor the rest was sized by (1.0: left as it was)."""
    frozen = {chapter.points[i].group for i in started if chapter.points[i].group}
    pending = [i for i in range(len(chapter.points)) if i not in started]
    movable = [i for i in pending if chapter.points[i].group not in frozen or not chapter.points[i].group]
    fixed = sum(chapter.points[i].estimate_s for i in pending if i not in movable) * late
    need = sum(chapter.points[i].estimate_s for i in movable) * late
    if need <= 0:
        return 1.0
    factor = (left_s * MARGIN - fixed) / need
    if 1.0 <= factor < GROW_FROM:
        return 1.0
    factor = min(GROW_MAX, max(0.05, factor))
    changed = False
    for module in dict.fromkeys(chapter.points[i].module for i in movable):
        seconds = chapter.seconds.get(module, 0.0) * factor
        fresh = {(p.preset, p.label): p for p in sized(module, chapter.machine, seconds, chapter.pace)}
        for i in movable:  # each point by what it is (the plan's order is not the hook's)
            new = fresh.get((chapter.points[i].preset, chapter.points[i].label))
            if chapter.points[i].module == module and new is not None:
                changed |= new.overrides != chapter.points[i].overrides
                chapter.points[i] = new
        chapter.seconds[module] = seconds
    return factor if changed else 1.0


# --- calibrating ------------------------------------------------------------------------------


def calibration() -> tuple[Calibration, float]:
    """The machine as it is now and the seconds of every job at its smallest sizes: sizing's own
    measurements, then the experiments' probes (a training step each), timed while the smallest
    plan is made. ``machine.seconds`` is all of it, wall time from start to end."""
    start = time.monotonic()
    with Calibrating() as shown, showing(shown.step):
        machine = calibrate()
        smallest = sum(p.estimate_s for p in plan(machine, SMALLEST_S)[0])
    machine.seconds = time.monotonic() - start
    return machine, smallest


CALIBRATION = "calibration.json"  # in the store's .perflab/: the last calibration, per machine identity
LOCK_S = 10.0  # the longest wait for another chapter's write of it (a few ms): then it is not kept, said


def machine_key() -> str:
    """What a calibration holds for: the machine's identity (CPU, cores, governor, GPU, torch and
    the libraries under it), torch's threads and perflab's version (its sizing may change)."""
    import torch

    from perflab.measure.environment import IDENTITY, environment, identity_key

    env = environment()
    identity = {k: str(env.get(k, "")) for k in IDENTITY if k != "num_threads"}
    identity.update(threads=str(torch.get_num_threads()), perflab=str(env.get("perflab_version", "")))
    return identity_key(identity)


def kept_calibration(store: Path) -> tuple[Calibration, float, str] | None:
    """The calibration kept for this machine in ``store`` (machine, smallest seconds, when it was
    measured), or None: none kept, another machine's, or unreadable (measured anew)."""
    path = meta(store) / CALIBRATION
    try:
        kept = files.read_json(path).get(machine_key())
        return Calibration(**kept["machine"]), float(kept["smallest_s"]), str(kept["when"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def keep_calibration(store: Path, machine: Calibration, smallest: float) -> None:
    """Keep this machine's calibration for the next chapter (a store that cannot be written keeps
    none: the next chapter calibrates again). The pace its jobs had stays (:func:`keep_pace`)."""
    _keep(store, lambda entry: {**entry, "machine": asdict(machine), "smallest_s": smallest, "when": record_time()})


def kept_pace(store: Path) -> dict[str, float]:
    """Each job's pace on this machine in the chapters before (``Point.key`` -> its time over its
    hook's estimate), kept with the calibration; empty where none is kept or it is unreadable."""
    try:
        pace = files.read_json(meta(store) / CALIBRATION)[machine_key()]["pace"]
        return {str(k): min(PACE[1], max(PACE[0], float(v))) for k, v in pace.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def keep_pace(store: Path, pace: dict[str, float]) -> None:
    """Keep the pace of the jobs run so far beside this machine's calibration (the next chapter
    here estimates them by it)."""

    def change(entry: dict[str, Any]) -> dict[str, Any]:
        before = entry.get("pace")
        return {**entry, "pace": {**(before if isinstance(before, dict) else {}), **pace}}

    _keep(store, change)


def _keep(store: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """This machine's entry of the calibration file, changed (written whole, atomically). Read,
    changed and written under a lock: two chapters on one store (or a chapter and a calibration)
    keep each other's paces; after each job, so a chapter stopped midway keeps what it learned."""
    from filelock import FileLock, Timeout

    path, key = meta(store) / CALIBRATION, machine_key()  # the key outside the lock: it may import torch
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock", timeout=LOCK_S):
            try:
                kept = files.read_json(path)
                kept = kept if isinstance(kept, dict) else {}
            except (OSError, ValueError):
                kept = {}
            entry = kept.get(key)
            kept[key] = change(entry if isinstance(entry, dict) else {})
            files.write_atomic(path, json.dumps(kept, indent=2) + "\n")
    except (OSError, Timeout) as err:
        log.warning("perflab chapter: this machine's calibration and paces not kept in %s: %s", path, err)


def too_short(text: str, budget_min: float, spent_s: float, smallest_s: float) -> ConfigError | None:
    """The error for a budget that the jobs do not fit even at their smallest sizes, naming the
    smallest that does here (what was spent so far, the first job's start, the jobs, the report;
    rounded up to half a minute); None when they fit."""
    needed = spent_s + FIRST_JOB_S + smallest_s + REPORT_S
    if needed <= 60 * budget_min:
        return None
    return ConfigError(
        "--budget",
        text,
        f"at least {math.ceil(needed / 30) / 2:g} minutes on this machine as it is now",
        f"too short: starting and calibrating took {clock(spent_s)}, the jobs at their smallest sizes "
        f"need {clock(smallest_s)} and the report ~{clock(REPORT_S)}",
    )


class Calibrating:
    """Calibration's progress once it has taken more than a couple of seconds: what it measures
    and the seconds so far, as a status line on a terminal, elsewhere a line per measurement."""

    QUIET_S = 2.0  # a calibration this short shows nothing

    def __init__(self) -> None:
        self.start, self.what, self.shown = time.monotonic(), "", ""
        self.tty = sys.stderr.isatty()
        self.bar: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __enter__(self) -> "Calibrating":
        threading.Thread(target=self._tick, daemon=True, name="perflab-chapter-calibrating").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            if self.bar is not None:
                self.bar.close()

    def step(self, what: str) -> None:
        self.what = what
        self._draw()

    def _draw(self) -> None:
        spent = time.monotonic() - self.start
        with self._lock:
            if spent < self.QUIET_S or self._stop.is_set():
                return
            line = f"    calibrating ({spent:.0f} s so far): {self.what}"
            if self.tty:
                if self.bar is None:
                    from tqdm import tqdm

                    self.bar = tqdm(bar_format="{desc}", file=sys.stderr, leave=False)
                self.bar.set_description_str(line)
            elif self.what != self.shown:
                print(line, flush=True)
                self.shown = self.what

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self._draw()


# --- running ----------------------------------------------------------------------------------


class Progress:
    """One bar for the whole chapter with an ETA (on a terminal; plain lines elsewhere):
    advanced by each job's estimate, inside a job by its elapsed time, never past its estimate."""

    def __init__(self, total_s: float, largest_s: float = 0.0) -> None:
        self.tty = sys.stderr.isatty()
        self.total, self.done, self.late = max(total_s, 1.0), 0.0, 1.0
        self.prior = max(PRIOR_S, largest_s)  # see finish
        self.actual = self.estimated = 0.0
        self.current, self.current_est, self.current_start = "", 0.0, time.monotonic()
        self.bar: Any = None
        self._stop = threading.Event()
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=1000, bar_format="{desc} {percentage:3.0f}%|{bar}|", file=sys.stderr, leave=False)
            threading.Thread(target=self._tick, daemon=True, name="perflab-chapter-progress").start()

    def start(self, name: str, estimate_s: float) -> None:
        self.current, self.current_est, self.current_start = name, estimate_s, time.monotonic()
        self._draw()

    def finish(self, estimate_s: float, actual_s: float, reused: bool) -> None:
        self.done += estimate_s
        self.current_est = 0.0
        if not reused and estimate_s > 0:
            self.actual, self.estimated = self.actual + actual_s, self.estimated + estimate_s
            # actual over estimated so far, with a prior of on-time work as large as the largest
            # job: one job's surprise (a cold compile cache) does not swing the ETA of the rest;
            # one that takes up to twice its estimate moves it by less than half
            self.late = min(3.0, max(0.5, (self.actual + self.prior) / (self.estimated + self.prior)))
        self._draw()

    def eta_s(self) -> float:
        inside = min(time.monotonic() - self.current_start, self.current_est)
        return max(0.0, (self.total - self.done - inside) * self.late)

    def write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def _draw(self) -> None:
        if self.bar is None:
            return
        inside = min(time.monotonic() - self.current_start, self.current_est * 0.95)
        self.bar.n = int(1000 * min(1.0, (self.done + inside) / self.total))
        self.bar.set_description_str(f"ETA {clock(self.eta_s())} | {self.current[:40]}", refresh=False)
        self.bar.refresh()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self._draw()

    def close(self) -> None:
        self._stop.set()
        if self.bar is not None:
            self.bar.close()


def clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def note(text: str) -> str:
    """``text`` as a Hydra override value (a quoted string: no quote, backslash or ``$`` inside)."""
    clean = text.replace("\\", "/").replace("'", "’").replace("$", "")
    return f"'{clean}'"


def work_line(module: str, rows: list[dict[str, Any]]) -> str:
    """How much work the job timed, beside the book's: its work hook, else its first setup line
    beside the reference (the line the job's own table ends with)."""
    if module not in registry.names() or not rows:
        return ""
    e = registry.get(module)
    return e.work(rows) or next(iter(e.beside_reference(rows)), "")


def run_points(chapter: Chapter, folder: Path, store: Path, deadline: float, progress: Progress) -> dict[int, str]:
    """Every point, in order, through perflab.api.run; re-sizes what is left when late."""
    from perflab.api import run
    from perflab.errors import Refused

    outcomes: dict[int, str] = {}
    ratios: list[float] = []  # each job measured: its time over its estimate
    started = {int(i) for i, o in chapter.outcomes.items() if o in ("ok", "done")}  # done before: keep their sizes
    for i in range(len(chapter.points)):
        left = deadline - time.time() - REPORT_S
        factor = resize(chapter, started, left, progress.late)
        if factor != 1.0:
            progress.total = progress.done + sum(p.estimate_s for j, p in enumerate(chapter.points) if j not in started)
            how = "running late: sized down" if factor < 1 else "ahead of time: sized up"
            progress.write(f"  {how} what has not started (x{factor:.2g}) to the {clock(max(0, left))} left")
            chapter.save(folder)
        point = chapter.points[i]
        started.add(i)
        name = f"{point.section} {point.preset}" + (f" ({point.label})" if point.label else "")
        progress.start(name, point.estimate_s)
        overrides = [*point.overrides, f"results.store={store}", f"results.note={note(point.why)}"]
        if chapter.redo:
            overrides.append("results.redo=true")
        t0 = time.monotonic()
        try:
            df = run(point.preset, overrides, sweep_dir=folder, job_num=i)
            outcome, rows = str(df.attrs.get("outcome", "ok")), df.to_dict("records")
        except Refused as err:
            outcome, rows = "refused", []
            progress.write(f"  {name}: refused: {err}")
        spent = time.monotonic() - t0
        progress.finish(point.estimate_s, spent, reused=outcome == "done")
        if outcome == "ok" and point.model_s > 0:  # measured in full: the next chapter here estimates it at its pace
            chapter.pace[point.key] = learned(point, spent, chapter.pace.get(point.key))
            keep_pace(store, {point.key: chapter.pace[point.key]})
        ratio = f", x{spent / point.estimate_s:.2f}" if outcome == "ok" and point.estimate_s > 0 else ""
        if ratio:
            ratios.append(spent / point.estimate_s)
        outcomes[i] = chapter.outcomes[str(i)] = outcome
        chapter.save(folder)
        shown = "reused (done before)" if outcome == "done" else outcome
        progress.write(
            f"{name:<38} {shown:<8} {clock(spent):>5} (est. {clock(point.estimate_s)}{ratio})"
            f"  ETA {clock(progress.eta_s())}"
        )
        line = work_line(point.module, rows)
        if line:
            progress.write(f"    {line}")
    if ratios:
        progress.write(
            f"  the {len(ratios)} jobs measured took {min(ratios):.2f}x to {max(ratios):.2f}x their estimates; "
            "the next chapter here estimates each at its pace"
        )
    return outcomes


# --- finding a chapter to continue ------------------------------------------------------------


def unfinished(store: Path, budget_min: float) -> tuple[Path, Chapter] | None:
    """The newest chapter of this host and budget under ``store``, if it did not end. Raises
    :class:`Unreadable` when a newer plan cannot be read (it may have been that chapter's)."""
    sweeps = store / "sweeps"
    if not sweeps.is_dir():
        return None
    for folder in sorted((p for p in sweeps.iterdir() if "_chapter-" in p.name), reverse=True):
        found = Chapter.read(folder)  # Unreadable: it may have been this host's and budget's
        if found.host == socket.gethostname() and found.budget_min == budget_min:
            return None if found.finished else (folder, found)  # the newest one decides
    return None


def new_folder(store: Path) -> Path:
    folder = store / "sweeps" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}_chapter-{secrets.token_hex(4)}"
    folder.mkdir(parents=True)
    return folder


# --- the command ------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="perflab chapter",
        description="Chapter 13 of Dive into Deep Learning on this machine, sized to a time budget, "
        "each of the book's claims judged, in one report.",
    )
    parser.add_argument("--budget", type=str, default="10", metavar="MINUTES", help="time for all of it (default 10)")
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("report.html"), help="the report (default report.html)"
    )
    parser.add_argument("--store", type=Path, default=Path("outputs"), help="the results tree (default outputs)")
    parser.add_argument("--fresh", action="store_true", help="measure anew even where a stopped chapter could continue")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the machine anew (by default the last calibration of this machine in the store is kept)",
    )
    return parser.parse_args(argv)


def budget_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError("--budget", text, "a number of minutes > 0")
    return value


def started_at() -> float:
    """When this process started (the budget counts from there: imports included)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


def say(line: str = "") -> None:
    print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chapter; returns the exit code: 0 every point ran and the report is written, 1
    some point failed (the report is written all the same), 2 a usage error, 130 stopped."""
    args = parse(argv)
    from perflab import report
    from perflab.store import tree

    try:
        budget = budget_minutes(args.budget)
        report.check_output(args.output)
        tree.check(args.store)
    except (ConfigError, report.ReportError) as err:
        print(f"perflab chapter: error: {err.line() if isinstance(err, ConfigError) else err}", file=sys.stderr)
        return 2
    deadline = started_at() + 60 * budget
    restore = terminate_as_interrupt()
    try:
        with _jobs_to_files() as log_to:
            return _chapter(args, budget, deadline, log_to)
    except ConfigError as err:  # found once calibrated: a budget too short for this machine
        print(f"perflab chapter: error: {err.line()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "\nperflab chapter: stopped; the points measured are kept. The same command continues "
            "where it stopped (--fresh starts anew).",
            file=sys.stderr,
        )
        return 130
    finally:
        restore()


def _chapter(args: argparse.Namespace, budget: float, deadline: float, log_to: Callable[[Path], None]) -> int:
    store = args.store
    say(f"perflab chapter: Dive into Deep Learning, chapter 13 (13.1-13.7), within {budget:g} min")
    try:
        prior = None if args.fresh else unfinished(store, budget)
    except Unreadable as err:
        say(f"  cannot continue the newest chapter: its plan {err.path} is unreadable ({err.why}); a new one starts")
        prior = None
    smallest = 0.0
    if prior is not None:
        old_folder, chapter = prior
        done = sum(o in ("ok", "done") for o in chapter.outcomes.values())
        say(
            f"  continuing the chapter started {chapter.started} ({old_folder}): "
            f"{done} of {len(chapter.points)} points done"
        )
        chapter.redo = False
        say(f"  on {chapter.machine.words()}")
    else:
        kept = None if args.calibrate else kept_calibration(store)
        if kept is None:
            say("  calibrating: a matmul, a memory copy, a tiny op and a training step of each model (seconds) ...")
            machine, smallest = calibration()
            keep_calibration(store, machine, smallest)
        else:
            machine, smallest, when = kept
            say(f"  this machine's calibration of {when} is kept (--calibrate measures it again)")
        say(f"  on {machine.words()}")
        pace = kept_pace(store)
        if pace:  # the jobs at their smallest, at the pace they had here before
            smallest = sum(p.estimate_s for p in plan(machine, SMALLEST_S, pace)[0])
            say(f"  each job estimated at the pace it had in this machine's chapters before ({len(pace)} jobs)")
        refused = too_short(args.budget, budget, time.time() - (deadline - 60 * budget), smallest)
        if refused is not None:
            raise refused
        left = deadline - time.time() - REPORT_S - FIRST_JOB_S
        points, seconds = plan(machine, left * MARGIN, pace)
        chapter = Chapter(budget, socket.gethostname(), record_time(), machine, points, seconds, pace=pace)
    machine = chapter.machine
    if not machine.gpu:
        say(
            "  no GPU here: the CPU stands in. Where the book uses 2 GPUs, 2 CPU workers (each half the "
            "cores) stand in for them; claims that need a GPU say NOT APPLICABLE and why"
        )
    folder = new_folder(store)
    log_to(folder)
    chapter.save(folder)
    if prior is not None:  # the stopped one is continued here, not again by the next command
        with contextlib.suppress(Unreadable):  # read a moment ago; gone or changed meanwhile: left as it is
            stopped = Chapter.read(prior[0])
            stopped.finished = f"continued in {folder.name}"
            stopped.save(prior[0])
    total = sum(p.estimate_s for p in chapter.points)
    left = deadline - time.time()
    say(f"  {len(chapter.points)} jobs, estimated {clock(total)} of the {clock(left)} left; rows: {folder}")
    if smallest > (left - REPORT_S) * MARGIN or total > left - REPORT_S:
        say(
            "  the budget is tight: at their smallest sizes the jobs leave little room for the machine's noise; "
            "some verdicts will be UNDERPOWERED"
        )
    progress = Progress(total, max((p.estimate_s for p in chapter.points), default=0.0))
    logs.LIVE[0] = False  # one bar for the chapter: the jobs draw none of their own
    try:
        outcomes = run_points(chapter, folder, store, deadline, progress)
    finally:
        logs.LIVE[0] = True
        progress.close()
    return _finish(chapter, folder, args.output, outcomes, deadline, budget)


def _finish(
    chapter: Chapter, folder: Path, output: Path, outcomes: dict[int, str], deadline: float, budget: float
) -> int:
    from perflab import report
    from perflab.analysis import claims
    from perflab.compare import samples_by_row
    from perflab.job import sweep
    from perflab.results import load

    say("  writing the report ...")
    sweep.summarize(folder)
    rows = load(folder)
    samples = samples_by_row([folder], row_ids=rows["row_id"]) if "row_id" in rows else {}
    try:
        report.write(report.Report(rows, [str(folder)], samples).render(), output)
    except report.ReportError as err:  # the output went away meanwhile: the rows stay, say so
        print(f"perflab chapter: error: {err}; the rows are in {folder} (perflab report {folder})", file=sys.stderr)
        return 1
    verdicts = claims.judge(rows, samples)
    chapter.finished = record_time()
    chapter.save(folder)
    say("")
    say(verdict_table(verdicts))
    tally = ", ".join(f"{n} {v}" for v, n in claims.counts(verdicts).items())
    failed = {i: o for i, o in outcomes.items() if o not in ("ok", "done", "skipped")}
    spent = time.time() - (deadline - 60 * budget)
    say("")
    say(f"claims: {len(verdicts)}: {tally or 'none'}")
    for i, outcome in failed.items():
        say(f"point {i} ({chapter.points[i].section} {chapter.points[i].preset}): {outcome}: see {folder / str(i)}")
    say(f"done in {clock(spent)} of the {clock(60 * budget)} budget; rows: {folder}; report: {output}")
    return 1 if failed else 0


def verdict_table(verdicts: list[Any]) -> str:
    """The claims on the terminal: section, verdict, statement, measured (and why, unless VALID)."""
    import textwrap

    lines = []
    for c in verdicts:
        lines.append(f"{c.section:<5} {c.verdict:<14} {c.statement}")
        detail = f"measured: {c.measured or '-'}" + (f"; {c.why}" if c.why else "")
        lines += textwrap.wrap(detail, width=110, initial_indent=" " * 20, subsequent_indent=" " * 20)
    return "\n".join(lines)


@contextlib.contextmanager
def _jobs_to_files() -> Iterator[Callable[[Path], None]]:
    """Each job's own lines go to its run dir's log and to ``<sweep dir>/chapter.log``, not the
    terminal: there the chapter shows one line per job and its progress bar. Yields what points
    the chapter's log at its folder once it has one; the handlers go when the chapter ends."""
    root = logging.getLogger()
    level = root.level
    added: list[logging.Handler] = [logging.NullHandler()]
    root.addHandler(added[0])  # a root handler: perflab.api adds no terminal handler of its own

    def to(folder: Path) -> None:
        handler = logging.FileHandler(folder / "chapter.log")
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
        root.addHandler(handler)
        added.append(handler)
        root.setLevel(logging.INFO)

    try:
        yield to
    finally:
        for handler in added:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
