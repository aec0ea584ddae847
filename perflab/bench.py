"""Honest timing: synchronize every device involved, exclude warm-up, repeat, report spread.

``Benchmark`` is the book's ``with Benchmark("label"):`` block, made honest for many devices.
``measure`` is the workhorse every experiment uses: warm-up calls (timed and reported, never
mixed into the stats), then samples until both ``repeats`` and ``min_time_s`` are met.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from perflab.devices import Device, synchronize

log = logging.getLogger(__name__)

Clock = Callable[[], float]
MAX_SAMPLES = 100_000  # a ceiling on the loop when min_time_s meets a very fast fn


class Benchmark:
    """Time a block of work: sync all ``devices`` on entry and exit, then read the clock.

    >>> with Benchmark("gpu0", devices) as b:
    ...     run(x)
    >>> b.elapsed
    """

    def __init__(self, label: str = "Done", devices: Sequence[Device] = (), *,
                 clock: Clock = time.perf_counter, report: bool = True) -> None:
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

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("Stats needs at least one sample")
        a = np.asarray(self.samples, dtype=float)
        self.n = len(a)
        self.median = float(np.median(a))
        self.mean = float(a.mean())
        self.std = float(a.std(ddof=1)) if self.n > 1 else 0.0
        self.min = float(a.min())
        self.max = float(a.max())
        q1, q3 = np.percentile(a, [25, 75])
        self.iqr = float(q3 - q1)

    @property
    def noisy(self) -> bool:
        """True when the spread (IQR) exceeds ``noise_threshold`` of the median."""
        return self.median > 0 and self.iqr / self.median > self.noise_threshold

    def as_row(self) -> dict:
        return {
            "n": self.n, "median_s": self.median, "mean_s": self.mean, "std_s": self.std,
            "min_s": self.min, "max_s": self.max, "iqr_s": self.iqr, "noisy": self.noisy,
            "warmup_n": len(self.warmup), "warmup_first_s": self.warmup[0] if self.warmup else math.nan,
            "timer": self.timer, "calls_per_sample": self.calls_per_sample, "num_threads": self.num_threads,
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


def measure(
    fn: Callable[[], object],
    devices: Sequence[Device] = (),
    *,
    warmup: int = 1,
    repeats: int = 5,
    min_time_s: float = 0.0,
    number: int = 1,
    timer: str = "auto",
    sync: bool = True,
    noise_threshold: float = 0.10,
    clock: Clock = time.perf_counter,
) -> Stats:
    """Time ``fn``: ``warmup`` calls, then samples of ``number`` calls each until at least
    ``repeats`` samples and ``min_time_s`` seconds of samples. Each sample is seconds per call.

    ``sync=False`` stops the clock when the host returns (what the host spends issuing work);
    every device is still synchronized *before* each sample so earlier work never leaks in.
    """
    devices = list(devices)
    kind = choose_timer(timer, devices, sync)
    warm = []
    for _ in range(warmup):
        synchronize(devices)
        t0 = clock()
        fn()
        synchronize(devices)
        warm.append(clock() - t0)
    take = _SAMPLERS[kind]
    samples: list[float] = []
    sampled = 0.0  # seconds spent in samples so far
    while len(samples) < repeats or (sampled < min_time_s and len(samples) < MAX_SAMPLES):
        seconds = take(fn, devices, number, clock)
        samples.append(seconds / number)
        sampled += seconds
    return Stats(samples, kind, warm, torch.get_num_threads(), number, noise_threshold)


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
        return start.elapsed_time(end) / 1e3


def _torch_utils(fn: Callable[[], object], devices: Sequence[Device], number: int, clock: Clock) -> float:
    from torch.utils import benchmark as tub

    synchronize(devices)
    timer = tub.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.timeit(number).mean * number


_SAMPLERS = {
    "wall_sync": lambda fn, d, n, c: _wall(fn, d, n, c, sync=True),
    "wall_nosync": lambda fn, d, n, c: _wall(fn, d, n, c, sync=False),
    "cuda_event": _cuda_event,
    "torch_utils_benchmark": _torch_utils,
}
