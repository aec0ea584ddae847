"""Where a measurement's time goes: a profiled pass, reduced to one table per measurement.

After the timed samples (``bench.profile=true``), ``profiled`` calls the measured function
under ``torch.profiler`` in a pass of its own (never inside the clock) and sums the events per
operator as the profiler's own ``key_averages`` does (``perflab.measure.kineto``: from its C++
results, without torch's Python object per event): one line per operator the profiler sees, with

- ``kind``: ``op`` (an aten or custom op, a compiled graph's call: its self time on the host),
  ``kernel`` (a GPU kernel: its time on the device; only where CUDA was profiled, never made up
  on a CPU) or ``range`` (a ``record_function`` range: perflab's phases, a user's own, a
  ``torch.compile``d region, ``Torch-Compiled Region: i/j``; its total time, children included,
  so it is no addend of the ops);
- ``calls`` and ``self_s`` per measured call, and ``share``: that time over the profiled pass's
  wall time per call (``profiled_s``). ``median_s`` beside it is the timed pass's, so that
  ``profiled_s / median_s`` says what the profiler cost.

The table goes to ``operators.csv`` in the run dir, one line per (row, operator), keyed by the
row's ``row_id`` (and ``run_id``, ``process``, ``measurement``): a results tree's index keeps it
beside the rows (``perflab.store.index``), ``perflab.results.load_operators`` reads it back,
``perflab.analysis.attribution`` judges two sides' tables operator by operator.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import pandas as pd

from perflab.store import columns as known
from perflab.store import layout

if TYPE_CHECKING:  # torch: only where something is profiled, never for a report's reading
    from perflab.measure.devices import Device
    from perflab.store.rows import Notes

FILE = layout.OPERATORS
ACTIVE_CALLS = 3  # the fewest profiled calls (its trace too), after a warm-up call under the profiler on a GPU
MOST_CALLS = 20
ROUNDS = 4  # profiles of a few calls each, in turns with the other side, where two jobs share the process
PROFILED_S = 0.05  # a short call is profiled for about this long: one preempted call of 3 moved an op +50 %
KINDS = ("op", "kernel", "range")
COMPILED_REGION = "Torch-Compiled Region"  # a torch.compile'd frame's call (i/j: frame, recompile): a range
KEYS = ("row_id", "run_id", "process", "experiment", "measurement", "median_s")  # from the row
COLUMNS = tuple(c for c in known.OPERATORS if c not in KEYS)  # a line per operator: the profiler's figures


@dataclass
class Profiled:
    """One profiled pass: its table (``COLUMNS``), the wall time of a profiled call, and what
    the whole pass took (its calls, a GPU's warm-up call, its trace written, reduced): its cost."""

    table: pd.DataFrame
    seconds: float  # per call, under the profiler
    pass_s: float = math.nan


def profiled(
    fn: Callable[[], object],
    devices: Sequence[Device],
    *,
    calls: int = ACTIVE_CALLS,
    trace: Path | None = None,
) -> Profiled:
    """``calls`` calls of ``fn`` under torch.profiler (CUDA activity too where a device is a
    GPU, after a warm-up call under it), each call's wall time taken around it with the devices
    synced; ``trace``: where the Chrome trace goes (``bench.profile``'s file), written when the
    active calls end and outside their clock. In a process of two jobs in turns (``perflab ab``'s
    sides) the calls are ``ROUNDS`` profiles of a few, handing over to the other side between
    them, as its samples do: one profile a side, one after the other, put whatever the machine
    did meanwhile on one side alone (a side's profiled call 0.74x the other's, timed 1.22x). Two
    profiles cannot run at once; the trace holds the first round's calls."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from perflab.measure import turns
    from perflab.measure.devices import synchronize

    cuda = any(d.type == "cuda" for d in devices)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    spent: list[float] = []
    tables: list[pd.DataFrame] = []  # each round's events summed per operator (kineto.FIELDS)
    rounds = min(calls, ROUNDS) if turns.shared() else 1
    cost = 0.0  # the pass's own seconds: not the other side's turns
    # A warm-up call under the profiler where CUPTI starts (torch's advice: its first step
    # skews); on the host it buys nothing: the call was just timed, warm, kineto starts before
    # the loop's clock, and the first profiled call after a warm-up one was no nearer the rest
    # (the why model, 12 rounds of 4 calls: +19 % with it, +12 % without).
    warm = 1 if cuda else 0

    def ready(p: Any) -> None:  # the cycle's events exist here only (a scheduled profile's own rule)
        if trace and not tables:
            p.export_chrome_trace(str(trace))
        tables.append(averaged(p, cuda))

    for r in range(rounds):
        active = calls // rounds + (r < calls % rounds)
        began = time.perf_counter()
        with warnings.catch_warnings():  # "clears events at the end of each cycle": one cycle; "no warmup"
            warnings.simplefilter("ignore", UserWarning)
            # one cycle (repeat=1): the schedule's default repeats, so its last step began another
            # cycle that the exit ended: a profile read again (a second table), or a warm-up's
            # profiler started and stopped
            steps = schedule(wait=0, warmup=warm, active=active, repeat=1)
            with profile(activities=activities, schedule=steps, on_trace_ready=ready) as prof:
                for i in range(warm + active):
                    synchronize(devices)
                    t0 = time.perf_counter()
                    fn()
                    synchronize(devices)
                    if i >= warm:
                        spent.append(time.perf_counter() - t0)
                    prof.step()
        cost += time.perf_counter() - began
        turns.turn()  # the other side's round: outside the profile and its clock
    began = time.perf_counter()
    seconds = sum(spent) / len(spent)  # the mean, as key_averages' totals over the calls are
    table = reduce(tables, calls, seconds, cuda)
    return Profiled(table, seconds, cost + time.perf_counter() - began)


def set_up() -> None:
    """Start and stop the profiler once, on this thread, before any clock: kineto takes the
    thread of its first profile for its own, and a first profile on another (a job's, in
    turns) prints "External init callback must run in same thread as registerClient"; and
    torch's profiler imports ``torch._inductor`` at its first start (~1.2 s here)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        pass


def calls_for(seconds: float) -> int:
    """How many calls of ``seconds`` each to profile: enough for ``PROFILED_S``, from
    ``ACTIVE_CALLS`` to ``MOST_CALLS`` (10 of a 5 ms call; training's pass keeps ``ACTIVE_CALLS`` steps)."""
    if not seconds > 0:  # unknown
        return ACTIVE_CALLS
    return max(ACTIVE_CALLS, min(MOST_CALLS, math.ceil(PROFILED_S / seconds)))


def averaged(p: Any, cuda: bool = False) -> pd.DataFrame:
    """A finished profile's events summed per operator (``kineto.FIELDS``): read from the
    profiler's C++ results (``kineto``: a few microseconds an event), else, where this torch's
    private API is not as ``kineto`` expects, or ``cuda`` was profiled, from ``key_averages``
    (~80 us an event: torch builds a Python object per event and their tree)."""
    from perflab.measure import kineto

    if not cuda:  # a GPU's profile: torch's own reading until test_kineto's cuda case has passed on one
        try:
            return kineto.averages(p.profiler.kineto_results)
        except (AttributeError, TypeError, ValueError):  # this torch's _KinetoEvent is not as kineto reads it
            pass
    lines = []
    for e in p.key_averages():
        device = e.device_type.name.lower()
        self_us = e.self_device_time_total if device == "cuda" else e.self_cpu_time_total
        lines.append((e.key, device, e.is_user_annotation, e.count, self_us, e.cpu_time_total))
    return pd.DataFrame(lines, columns=list(kineto.FIELDS))


def reduce(tables: Sequence[pd.DataFrame], calls: int, seconds: float, cuda: bool) -> pd.DataFrame:
    """Profiles' events summed per operator (``averaged``) as ``COLUMNS`` per measured call
    (times in seconds; the profiler counts microseconds). A GPU kernel is a ``kernel`` on
    ``cuda`` only where CUDA was profiled; a range's time is its span, its children in it."""
    import numpy as np

    from perflab.measure import kineto

    ev = pd.concat([pd.DataFrame(columns=list(kineto.FIELDS)), *tables], ignore_index=True)
    kernel = (ev["device"] == "cuda").to_numpy(bool)
    span = (ev["annotation"].astype(bool) | ev["key"].str.startswith(COMPILED_REGION)).to_numpy(bool) & ~kernel
    own = (ev["device"] == "cpu").to_numpy(bool)  # an op on another device: no host self time (key_averages')
    self_us = np.select([kernel, span, own], [ev["self_us"], ev["total_us"], ev["self_us"]], 0.0)
    table = pd.DataFrame(
        {
            "operator": ev["key"].astype(str),
            "kind": np.select([kernel, span], ["kernel", "range"], "op"),
            "device": np.where(kernel, "cuda", "cpu"),
            "calls": ev["count"].to_numpy(float) / calls,
            "self_s": self_us.astype(float) / 1e6 / calls,
        }
    )
    keep = np.where(kernel, cuda, ~table["operator"].str.startswith("ProfilerStep").to_numpy(bool))
    table = table[keep].groupby(["operator", "kind", "device"], as_index=False, sort=False).sum()
    table["share"] = table["self_s"] / seconds if seconds > 0 else float("nan")
    table["profiled_s"] = seconds
    return table


def write(run_dir: Path, row: Mapping[str, Any], table: pd.DataFrame) -> Path:
    """Append one measurement's table to the run dir's ``operators.csv``, keyed by its row."""
    from perflab.store import files

    keyed = table.assign(**{k: row.get(k) for k in KEYS})[[*KEYS, *COLUMNS]]
    path = run_dir / FILE
    files.append_text(path, keyed.to_csv(index=False, header=False), header=",".join(keyed.columns) + "\n")
    return path


def read(paths: Sequence[Path], notes: Notes | None = None) -> pd.DataFrame:
    """Every ``operators.csv`` of these run dirs, each parsed (no index asked), one frame as
    :func:`typed` makes it; a torn or malformed line is skipped and said (in ``notes``; default:
    a warning)."""
    from perflab.store import index
    from perflab.store.rows import Notes

    own = notes if notes is not None else Notes()
    df = index.read_operators(list(dict.fromkeys(Path(d) for d in paths)), own)
    if notes is None:
        own.say()
    return typed([df])


def typed(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Operator lines, read from run dirs or from a results tree's index, as one frame of
    ``KEYS``, ``COLUMNS`` and ``run_dir`` (each line's run dir, resolved): text as pandas'
    ``string``, figures as floats; each (row, operator, kind, device) once, the first kept;
    sorted by ``row_id``, each row's operators in the order written. Whichever way the lines
    were read, the same frame."""
    from perflab.store import index

    names = [*KEYS, *COLUMNS, "run_dir"]
    full = [f.reindex(columns=names) for f in frames if len(f)]
    df = pd.concat(full, ignore_index=True) if full else pd.DataFrame(columns=names)
    df = df.astype({c: "float64" if known.OPERATORS.get(c) == "float" else "string" for c in names})
    df = df.drop_duplicates(list(index.OPERATORS_TABLE.key))
    return df.sort_values("row_id", kind="stable", ignore_index=True)
