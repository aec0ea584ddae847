"""How busy the rest of the machine was while a measurement ran, and the one rule that calls a
row's machine too busy for a clean figure (``busy_reason``).

Other processes' share of all CPUs during the measurement (from the kernel's CPU time counters)
and the load average before and after; and, known for a measurement however short, how long our
own threads waited in the run queue for a CPU (the kernel's per-thread schedstat, in
nanoseconds) and the CPU pressure (PSI) of the window. Unknown values are NaN (empty cells),
never 0.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any, Mapping, Sequence

import psutil

from perflab.measure.instruments.base import Instrument
from perflab.store.rows import number

TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01  # the CPU-time counters' step
MIN_WINDOW_TICKS = 25  # a shorter window's CPU shares are mostly rounding


class Machine(Instrument):
    """``with Machine() as m: ...`` then ``m.columns()``: how busy the rest of the machine was.

    Three views, read before and after (no sampler that a short window could slip through):
    other processes' share of all CPUs from the CPU-time counters (whole ticks: NaN below 25 of
    them), the share of our threads' runnable time spent waiting in the run queue for a CPU
    (``waited_pct``, from nanosecond counters: any window), and the kernel's CPU pressure (PSI
    ``some``: the share of the window in which a runnable task waited for a CPU). As an
    instrument, its window is the whole measurement; a row with no measurement of its own gets
    the window since the last row (``Context.record``)."""

    COLUMNS = ("others_cpu_pct", "waited_pct", "cpu_pressure_pct", "load_before", "load_after", "cpus")
    SHARED = True

    def around(self) -> "Machine":
        return self

    def row(self, name: str, calls: int, items_per_call: float | None = None) -> dict[str, Any]:
        return self.columns()

    def __enter__(self) -> "Machine":
        self.load_before = _load()
        self._waits, self._pressure = run_queue(), cpu_pressure_us()
        self._cpu, self._own, self._t0 = psutil.cpu_times(), own_cpu_s(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.monotonic() - self._t0
        self.busy_s = _busy_s(psutil.cpu_times()) - _busy_s(self._cpu)
        self.own_s = own_cpu_s() - self._own
        waits, pressure = run_queue(), cpu_pressure_us()
        self.load_after = _load()
        ran = sum(w[0] - self._waits.get(t, (0, 0))[0] for t, w in waits.items())
        waited = sum(w[1] - self._waits.get(t, (0, 0))[1] for t, w in waits.items())
        self.waited_share = waited / (ran + waited) if ran + waited > 0 else math.nan
        self.pressure = (
            (pressure - self._pressure) / 1e6 / self.wall_s
            if pressure is not None and self._pressure is not None and self.wall_s > 0
            else math.nan
        )

    def others_share(self, own_s: float | None = None) -> float:
        """Other processes' share of all CPUs, 0..1; ``own_s`` replaces ours (e.g. summed over
        DDP ranks). NaN for a window too short to tell: the kernel counts CPU time in ticks."""
        if self.wall_s < MIN_WINDOW_TICKS * TICK_S:
            return math.nan
        own = self.own_s if own_s is None else own_s
        return min(1.0, max(0.0, self.busy_s - own) / (self.wall_s * (psutil.cpu_count() or 1)))

    def columns(self, own_s: float | None = None) -> dict[str, Any]:
        values = (
            100 * self.others_share(own_s),
            100 * self.waited_share,
            100 * min(1.0, self.pressure),
            self.load_before,
            self.load_after,
            psutil.cpu_count(),
        )
        return dict(zip(self.COLUMNS, values))


def since_import() -> Machine | None:
    """The machine since this process imported perflab's watchers, read now (None in a process
    started from one that did, by fork): a worker's whole life so far, where a row has no window
    of its own in it. At least 25 ticks long: a process whose first look comes sooner waits out
    the rest of that quarter second, once, rather than leave others' share blank (the kernel
    counts CPU time in 10 ms ticks)."""
    pid, window = _SINCE_IMPORT
    if pid != os.getpid():
        return None
    young = MIN_WINDOW_TICKS * TICK_S - (time.monotonic() - window._t0)
    if young > 0:
        time.sleep(young)
    window.__exit__(None, None, None)
    return window


def others_since_import() -> float:
    """Other processes' share of all CPUs since this process imported perflab's watchers, 0..1
    (NaN in a process forked from one that did): the last resort for a row whose own window, and
    its job's so far, are too short for the kernel's ticks (a warm process's job that measures
    within a quarter second of starting)."""
    window = since_import()
    return window.others_share() if window else math.nan


MACHINE_COLUMNS = Machine.COLUMNS


def busy_reason(columns: Mapping[str, Any], limit: float) -> str:
    """The one rule that says a row's machine was too busy for a clean figure, from the row's own
    columns ("" if it was not, or nobody can tell): its threads waited for a CPU more than
    ``limit`` of their runnable time (``waited_pct``: a short measurement's only sure sign), or
    other processes left fewer free CPUs than its threads need, less ``limit`` of them
    (``others_cpu_pct`` of ``cpus``, against ``num_threads``; where the row has no thread count,
    others above ``limit`` of the CPUs). One thread beside one busy process on two CPUs has a CPU
    of its own: no sign of trouble, and such a gate decides. The advice fits the row: fewer
    threads only where it ran more than one."""
    reasons = []
    others, waited = number(columns.get("others_cpu_pct")), number(columns.get("waited_pct")) or 0.0
    threads, cpus = number(columns.get("num_threads")), number(columns.get("cpus"))
    if others is not None:
        if threads and cpus:
            free = cpus * (1 - others / 100)
            if free < threads * (1 - limit):
                n = f"{threads:g} thread{'s' if threads != 1 else ''}"
                reasons.append(
                    f"other processes used {others:.0f}% of the {cpus:g} CPUs meanwhile, leaving {free:.1f} for its {n}"
                )
        elif others > 100 * limit:
            reasons.append(f"other processes used {others:.0f}% of the CPUs meanwhile")
    if waited > 100 * limit:
        reasons.append(f"its threads spent {waited:.0f}% of their runnable time waiting for a CPU")
    if not reasons:
        return ""
    advice = FEWER_THREADS if (threads or 0) > 1 else QUIETER
    return "the machine was busy: " + "; ".join(reasons) + f": {advice}"


def worst(windows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The machine columns of several windows as one row says them (a run's summary of its
    epochs): the highest share and load of any, the first load before and the last after."""
    out: dict[str, Any] = {}
    for name in MACHINE_COLUMNS:
        known = [v for v in (number(w.get(name)) for w in windows) if v is not None]
        if name == "load_before":
            out[name] = known[0] if known else math.nan
        elif name == "load_after":
            out[name] = known[-1] if known else math.nan
        else:
            out[name] = max(known) if known else math.nan
    return out


# The fix for threads that wait for a CPU, said where it is seen (docs/running.md measures it),
# and for a busy machine where fewer threads cannot help (one already).
FEWER_THREADS = (
    "run with fewer threads, as many as the cores that are free: OMP_NUM_THREADS=1 perflab ... "
    "(docs/running.md#what-omp_num_threads-does)"
)
QUIETER = (
    "measure where nothing else runs, or judge a change with perflab ab, which alternates the two "
    "sides so that both share the machine's state (docs/compare.md)"
)


def run_queue() -> dict[int, tuple[int, int]]:
    """Per thread of this process and its live descendants: (ns run on a CPU, ns waited in the
    run queue for one), from ``/proc/<pid>/task/<tid>/schedstat``; {} where the kernel has none."""
    out: dict[int, tuple[int, int]] = {}
    me = psutil.Process()
    try:
        pids = [me.pid, *(c.pid for c in me.children(recursive=True))]
    except psutil.Error:
        pids = [me.pid]
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ran, waited, _ = f.read().split()
            except (OSError, ValueError):
                continue
            out[int(tid)] = (int(ran), int(waited))
    return out


def cpu_pressure_us() -> int | None:
    """The kernel's cumulative CPU pressure (PSI ``some total``, microseconds), or None."""
    try:
        with open("/proc/pressure/cpu") as f:
            first = f.readline()
    except OSError:
        return None
    found = re.search(r"total=(\d+)", first)
    return int(found.group(1)) if found else None


def own_cpu_s() -> float:
    """CPU seconds of this process and its live descendants (DataLoader workers, DDP ranks)."""
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _busy_s(t: Any) -> float:
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


_SINCE_IMPORT = (os.getpid(), Machine().__enter__())  # this process's perflab: a window long enough to count
