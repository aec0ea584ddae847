"""Honest timing: synchronize every device involved, exclude warm-up, repeat, report spread.

``Benchmark`` is the book's ``with Benchmark("label"):`` block, made honest for many devices.
``measure`` is the workhorse: warm-up calls (timed and reported, never mixed into the stats),
then samples until both ``repeats`` and ``min_time_s`` are met (``blocked_autorange``'s rule).
``measure_rounds`` does the same for variants meant to be compared, in A B A B ... rounds,
so that a drift of the machine (heat, another process) falls on every variant alike.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping, Sequence

import numpy as np
import torch

from perflab.measure import turns
from perflab.measure.devices import Device, synchronize
from perflab.measure.instructions import Counted
from perflab.store.columns import FEW_FOR_SPREAD, PERCENTILES

log = logging.getLogger(__name__)

Clock = Callable[[], float]
MAX_SAMPLES = 100_000  # a ceiling on the loop when min_time_s meets a very fast fn
MIN_SAMPLE_S = 20e-6  # a sample shorter than this mostly times the clock and the syncs: suspect
FEW = 3  # fewer samples than this: no std or IQR at all, and the row is suspect (judged: columns.FEW_FOR_SPREAD)


class Benchmark:
    """Time a block of work: sync all ``devices`` on entry and exit, then read the clock.

    >>> with Benchmark("gpu0", devices) as b:
    ...     run(x)
    >>> b.elapsed
    """

    def __init__(
        self,
        label: str = "Done",
        devices: Sequence[Device] = (),
        *,
        clock: Clock = time.perf_counter,
        report: bool = True,
    ) -> None:
        self.label, self.devices, self.clock, self.report = label, list(devices), clock, report
        self.elapsed = math.nan

    def __enter__(self) -> "Benchmark":
        synchronize(self.devices)
        self._start = self.clock()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.devices)
        self.elapsed = self.clock() - self._start
        if self.report:
            log.info("%s: %.4f sec", self.label, self.elapsed)


@dataclass
class Stats:
    """Summary of one measurement's samples (seconds per call) plus how they were taken."""

    samples: list[float]
    timer: str
    warmup: list[float] = field(default_factory=list)
    num_threads: int = 0
    calls_per_sample: int = 1
    noise_threshold: float = 0.10
    cpu: list[float] = field(default_factory=list)  # CPU seconds per call of each sample (host work only)

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("Stats needs at least one sample")
        a = np.asarray(self.samples, dtype=float)
        self.n = len(a)
        self.median = float(np.median(a))
        self.mean = float(a.mean())
        self.min = float(a.min())
        self.max = float(a.max())
        # With too few samples the spread is unknown: NaN (an empty cell), never a reassuring 0.
        self.std = float(a.std(ddof=1)) if self.n >= FEW else math.nan
        q1, q3 = np.percentile(a, [25, 75])
        self.iqr = float(q3 - q1) if self.n >= FEW else math.nan
        self.percentiles = {k: float(v) for k, v in zip(PERCENTILES, np.percentile(a, list(PERCENTILES.values())))}

    @property
    def tail(self) -> str:
        """Which percentiles lie beyond every sample but one or none ("" when n is enough for
        p99): such a percentile is an interpolation between the largest samples, no tail."""
        thin = [k.removesuffix("_s") for k, q in PERCENTILES.items() if q > 50 and self.n * (100 - q) < 100]
        if not thin:
            return ""
        needs = ", ".join(f"a {k} {round(100 / (100 - PERCENTILES[f'{k}_s']))}" for k in thin)
        return (
            f"{' and '.join(thin)} of {self.n} sample{'s' if self.n != 1 else ''}: interpolated between "
            f"the largest, no tail (samples needed: {needs})"
        )

    @property
    def noisy(self) -> bool | None:
        """IQR / median above ``noise_threshold``; None (unknown) with fewer than
        ``FEW_FOR_SPREAD`` samples, where the tables show the spread as "?"."""
        if self.n < FEW_FOR_SPREAD:  # (the IQR is known from FEW samples on)
            return None
        return self.median > 0 and self.iqr / self.median > self.noise_threshold

    @property
    def suspect(self) -> str:
        """Why this measurement is not to be trusted as it stands ("" if nothing is known)."""
        reasons = []
        if self.median * self.calls_per_sample < MIN_SAMPLE_S:
            reasons.append(
                f"a sample takes {self.median * self.calls_per_sample * 1e6:.3g} us: "
                "near the timer's resolution and sync cost (raise the work per call)"
            )
        if self.n < FEW:
            reasons.append(f"too few samples ({self.n}) to know the spread")
        return "; ".join(reasons)

    def as_row(self) -> dict:
        return {
            "n": self.n,
            "median_s": self.median,
            "mean_s": self.mean,
            "std_s": self.std,
            "min_s": self.min,
            "max_s": self.max,
            "iqr_s": self.iqr,
            **self.percentiles,
            "tail_note": self.tail,
            "noisy": self.noisy,
            "warmup_n": len(self.warmup),
            "warmup_first_s": self.warmup[0] if self.warmup else math.nan,
            "timer": self.timer,
            "calls_per_sample": self.calls_per_sample,
            "num_threads": self.num_threads,
            "cpu_median_s": float(np.median(self.cpu)) if self.cpu else math.nan,
        }


def choose_timer(timer: str, devices: Sequence[Device], sync: bool) -> str:
    """``auto``: CUDA events for one GPU, wall clock with a sync of every device otherwise."""
    cuda = [d for d in devices if d.type == "cuda"]
    if not sync:
        return "wall_nosync"  # the point is *not* to wait for the device, whatever timer was asked
    if timer == "auto":
        return "cuda_event" if len(devices) == 1 and len(cuda) == 1 else "wall_sync"
    if timer == "cuda_event" and not (len(devices) == 1 and cuda):
        return "wall_sync"  # events cannot span devices or time the CPU; say what was used
    if timer == "torch_utils_benchmark" and len(devices) > 1:
        return "wall_sync"  # its timer syncs only the current CUDA device
    return timer


@dataclass(frozen=True)
class Variant:
    """One thing to time: a call, the devices it runs on, and whether to wait for them."""

    fn: Callable[[], object]
    devices: Sequence[Device] = ()
    sync: bool = True


Around = Callable[[str], ContextManager[object]]


def measure(
    fn: Callable[[], object],
    devices: Sequence[Device] = (),
    *,
    warmup: int = 2,
    repeats: int = 5,
    min_time_s: float = 0.0,
    number: int = 1,
    timer: str = "auto",
    sync: bool = True,
    noise_threshold: float = 0.10,
    clock: Clock = time.perf_counter,
    around: Around | None = None,
) -> Stats:
    """Time ``fn``: ``warmup`` calls, then samples of ``number`` calls each until at least
    ``repeats`` samples and ``min_time_s`` seconds of samples. Each sample is seconds per call.

    ``sync=False`` stops the clock when the host returns (what the host spends issuing work);
    every device is still synchronized *before* each sample so earlier work never leaks in.
    ``around(name)`` wraps each sample outside the clock (e.g. to watch peak memory).
    """
    return measure_rounds(
        {"": Variant(fn, devices, sync)},
        warmup=warmup,
        repeats=repeats,
        min_time_s=min_time_s,
        number=number,
        timer=timer,
        noise_threshold=noise_threshold,
        clock=clock,
        around=around,
    )[""]


def measure_rounds(
    variants: Mapping[str, Variant],
    *,
    warmup: int = 2,
    repeats: int = 5,
    min_time_s: float = 0.0,
    number: int = 1,
    timer: str = "auto",
    noise_threshold: float = 0.10,
    clock: Clock = time.perf_counter,
    around: Around | None = None,
    around_loop: Around | None = None,
    around_run: Around | None = None,
) -> dict[str, Stats]:
    """Time several variants of comparable work, interleaved: round r takes one sample of
    each, in an order rotated every round (A B C, B C A, C A B ...), until every variant has
    ``repeats`` samples and ``min_time_s`` seconds. Warm-up calls come first, per variant.
    ``around(name)`` wraps each sample; ``around_run(name)`` each unbroken run of one variant's
    samples (all of them when one variant is measured, each one when variants alternate): what
    holds over many samples, a peak or a sum, read there and not between every two samples,
    where reading files would evict the caches the next sample needs (issue 30: +70 us on a
    0.8 ms call). ``around_loop(name)`` wraps a loop perflab does not sample itself
    (torch_utils_benchmark's, its warm-up calls in it): only what holds over all its calls, a
    peak, not a per-call sum.
    """
    names = list(variants)
    kinds = {n: choose_timer(timer, variants[n].devices, variants[n].sync) for n in names}
    if "torch_utils_benchmark" in kinds.values():
        if len(names) > 1:
            raise ValueError("timer=torch_utils_benchmark times one variant at a time; use measure()")
        v = variants[names[0]]
        with around_loop(names[0]) if around_loop else contextlib.nullcontext():
            return {names[0]: _torch_utils(v.fn, v.devices, min_time_s, noise_threshold)}
    # CPU work of jobs that share this process (perflab ab) runs on their one compute thread
    host = {n: all(d.type == "cpu" for d in variants[n].devices) for n in names}

    def on(name: str, sample: Callable[..., float], *args: Any) -> float:
        call = functools.partial(sample, *args)
        return turns.compute(call) if host[name] else call()

    warm: dict[str, list[float]] = {n: [] for n in names}
    for name in names:
        v = variants[name]
        for _ in range(warmup):
            warm[name].append(on(name, _warm, v.fn, v.devices, clock))
    samples: dict[str, list[float]] = {n: [] for n in names}
    # the CPU time of this process's threads per sample, beside the wall time, where it is the
    # work's: host work (a GPU's time is not in it) whose threads do not spin while they wait
    # (OpenMP's active wait burns CPU between ops: 100x a small model's own): what a busy
    # machine's neighbour cannot add to
    cpu: dict[str, list[float]] = {n: [] for n in names}
    quiet_waits = torch.get_num_threads() == 1 or os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive"
    on_host = {n: quiet_waits and host[n] for n in names}
    spent = dict.fromkeys(names, 0.0)

    def wants(name: str) -> bool:
        more_time = spent[name] < min_time_s and len(samples[name]) < MAX_SAMPLES
        return len(samples[name]) < repeats or more_time

    turn, running = 0, None
    with contextlib.ExitStack() as run:
        while any(wants(n) for n in names):
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                if not wants(name):
                    continue
                if around_run and name != running:
                    run.close()  # the previous variant's run ends
                    run.enter_context(around_run(name))
                    running = name
                v = variants[name]
                with around(name) if around else contextlib.nullcontext():
                    c0 = time.process_time()
                    seconds = on(name, _SAMPLERS[kinds[name]], v.fn, v.devices, number, clock)
                    c1 = time.process_time()
                if on_host[name]:
                    cpu[name].append((c1 - c0) / number)
                samples[name].append(seconds / number)
                spent[name] += seconds
                turns.turn()  # where two jobs share this process (perflab ab), the other's sample now
            turn += 1
    threads = torch.get_num_threads()
    return {n: Stats(samples[n], kinds[n], warm[n], threads, number, noise_threshold, cpu[n]) for n in names}


def _warm(fn: Callable[[], object], devices: Sequence[Device], clock: Clock) -> float:
    """A warm-up call's seconds: said, never a sample (nor seen as one: ``_wall`` times those)."""
    synchronize(devices)
    t0 = clock()
    fn()
    synchronize(devices)
    return clock() - t0


def _wall(fn: Callable[[], object], devices: Sequence[Device], number: int, clock: Clock, sync: bool) -> float:
    synchronize(devices)
    t0 = clock()
    for _ in range(number):
        fn()
    if sync:
        synchronize(devices)
    return clock() - t0


def _cuda_event(fn: Callable[[], object], devices: Sequence[Device], number: int, clock: Clock) -> float:
    (device,) = devices
    with torch.cuda.device(device.index):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def _torch_utils(
    fn: Callable[[], object], devices: Sequence[Device], min_time_s: float, noise_threshold: float
) -> Stats:
    """torch.utils.benchmark's own ``blocked_autorange``, called once: it picks the calls per
    sample (its warm-up) and returns per-call times; ``min_time_s`` is its ``min_run_time``."""
    from torch.utils import benchmark as tub

    synchronize(devices)
    timer = tub.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=max(min_time_s, 0.2))
    return Stats(list(m.times), "torch_utils_benchmark", [], torch.get_num_threads(), m.number_per_run, noise_threshold)


_SAMPLERS: dict[str, Callable[[Callable[[], object], Sequence[Device], int, Clock], float]] = {
    "wall_sync": lambda fn, d, n, c: _wall(fn, d, n, c, sync=True),
    "wall_nosync": lambda fn, d, n, c: _wall(fn, d, n, c, sync=False),
    "cuda_event": _cuda_event,
}


def stats_of(
    samples: Sequence[float], warmup: Sequence[float] = (), *, timer: str = "wall_sync", noise_threshold: float = 0.10
) -> Stats:
    """Stats of times measured elsewhere (a training epoch, a collective's slowest rank)."""
    return Stats(list(samples), timer, list(warmup), torch.get_num_threads(), 1, noise_threshold)


@dataclass
class Part:
    """One thing to time and what its row says: per call ``items`` / ``flops`` / ``bytes``
    become items/s, TFLOP/s and GB/s; ``dtype`` (``float32``, ``bf16-mixed`` ...) says which
    peak bounds the FLOPs, for ``pct_of_peak`` (vs ``+experiment=hardware``'s measured peak)
    and ``mfu`` (vs the datasheet); ``derive(stats)`` adds columns computed from the measured
    time; ``extra`` any other columns; ``count`` the call as ``stmt`` and ``setup`` source text,
    whose instructions ``bench.instructions=true`` counts (perflab.measure.instructions)."""

    fn: Callable[[], object]
    devices: Sequence[Device] | None = None
    sync: bool = True
    items: float | None = None
    flops: float | None = None
    bytes: float | None = None
    dtype: str | None = None
    derive: Callable[[Stats], dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    count: Counted | None = None  # the call as source text: bench.instructions counts it
