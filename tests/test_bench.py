"""Timing statistics and the measure loop, on a fake clock: deterministic, no sleeps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perflab.bench import Benchmark, Stats, choose_timer, measure
from perflab.devices import Device

CPU = Device("cpu", "cpu", threads=1)
GPU0, GPU1 = Device("cuda:0", "cuda", 0), Device("cuda:1", "cuda", 1)


class FakeClock:
    """Each call of the timed function advances time by the next planned duration."""

    def __init__(self, durations):
        self.now, self.durations = 0.0, list(durations)
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.now += self.durations[self.calls]
        self.calls += 1


def test_stats_match_numpy():
    samples = [0.5, 0.1, 0.3, 0.2, 0.4, 1.0]
    s = Stats(samples, "wall_sync")
    a = np.array(samples)
    assert (s.n, s.min, s.max) == (6, 0.1, 1.0)
    assert s.median == pytest.approx(0.35)
    assert s.mean == pytest.approx(a.mean())
    assert s.std == pytest.approx(a.std(ddof=1))
    assert s.iqr == pytest.approx(np.percentile(a, 75) - np.percentile(a, 25))


def test_noise_flag_follows_iqr_over_median():
    assert not Stats([1.0, 1.01, 0.99, 1.0], "wall_sync").noisy
    assert Stats([1.0, 1.5, 0.6, 1.0], "wall_sync").noisy
    assert not Stats([1.0, 1.5, 0.6, 1.0], "wall_sync", noise_threshold=1.0).noisy


def test_single_sample_has_zero_spread():
    s = Stats([2.0], "wall_sync")
    assert (s.std, s.iqr, s.median) == (0.0, 0.0, 2.0)


def test_measure_excludes_warmup_and_reports_it():
    clock = FakeClock([9.0, 8.0] + [1.0, 2.0, 3.0])
    s = measure(clock.work, [CPU], warmup=2, repeats=3, clock=clock)
    assert s.warmup == [9.0, 8.0]
    assert s.samples == [1.0, 2.0, 3.0]
    assert s.median == 2.0 and s.timer == "wall_sync"
    row = s.as_row()
    assert row["warmup_n"] == 2 and row["warmup_first_s"] == 9.0 and row["n"] == 3


def test_measure_divides_by_calls_per_sample():
    clock = FakeClock([1.0] * 8)
    s = measure(clock.work, [CPU], warmup=0, repeats=2, number=4, clock=clock)
    assert s.samples == [1.0, 1.0] and clock.calls == 8 and s.calls_per_sample == 4


def test_measure_keeps_sampling_until_min_time():
    clock = FakeClock([0.25] * 100)
    s = measure(clock.work, [CPU], warmup=0, repeats=2, min_time_s=2.0, clock=clock)
    assert s.n == 8 and sum(s.samples) == pytest.approx(2.0)


def test_measure_without_sync_is_labelled():
    clock = FakeClock([1.0] * 3)
    s = measure(clock.work, [CPU], warmup=0, repeats=3, sync=False, clock=clock)
    assert s.timer == "wall_nosync"


@pytest.mark.parametrize(
    "asked, devices, sync, used",
    [
        ("auto", [CPU], True, "wall_sync"),
        ("auto", [GPU0], True, "cuda_event"),
        ("auto", [GPU0, GPU1], True, "wall_sync"),
        ("cuda_event", [CPU], True, "wall_sync"),
        ("cuda_event", [GPU0, CPU], True, "wall_sync"),
        ("torch_utils_benchmark", [CPU], True, "torch_utils_benchmark"),
        ("torch_utils_benchmark", [GPU0, GPU1], True, "wall_sync"),
        ("cuda_event", [GPU0], False, "wall_nosync"),
    ],
)
def test_timer_choice(asked, devices, sync, used):
    assert choose_timer(asked, devices, sync) == used


def test_torch_utils_benchmark_timer_runs_the_function():
    calls = []
    s = measure(lambda: calls.append(1), [CPU], warmup=1, repeats=3, number=5, timer="torch_utils_benchmark")
    assert s.timer == "torch_utils_benchmark" and s.n == 3
    assert len(calls) >= 1 + 3 * 5
    assert all(t > 0 for t in s.samples)


def test_benchmark_block_reads_the_clock_around_the_work():
    clock = FakeClock([3.5])
    with Benchmark("block", [CPU], clock=clock, report=False) as b:
        clock.work()
    assert b.elapsed == 3.5


def test_benchmark_elapsed_is_nan_until_the_block_ends():
    assert math.isnan(Benchmark("x").elapsed)
