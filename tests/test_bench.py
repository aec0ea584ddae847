"""Timing statistics, the measure loop and interleaved rounds, on a fake clock: deterministic."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from perflab.measure import bench
from perflab.measure.bench import Benchmark, Stats, Variant, choose_timer, measure, measure_rounds
from perflab.measure.devices import Device

from conftest import FAST

CPU = Device("cpu", "cpu", threads=1)
GPU0, GPU1 = Device("cuda:0", "cuda", 0), Device("cuda:1", "cuda", 1)


class FakeClock:
    """Each call of a timed function advances time by the next planned duration."""

    def __init__(self, durations=()):
        self.now, self.durations = 0.0, list(durations)
        self.calls = 0
        self.log: list[str] = []

    def __call__(self) -> float:
        return self.now

    def work(self, name: str = "") -> None:
        self.now += self.durations[self.calls] if self.durations else 1.0
        self.calls += 1
        self.log.append(name)

    def takes(self, name: str, seconds: float):
        def fn() -> None:
            self.now += seconds
            self.calls += 1
            self.log.append(name)

        return fn


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
    assert Stats([1.0, 1.01, 0.99, 1.0, 1.0], "wall_sync").noisy is False
    assert Stats([1.0, 1.5, 0.6, 1.0, 1.3], "wall_sync").noisy is True
    assert Stats([1.0, 1.5, 0.6, 1.0, 1.3], "wall_sync", noise_threshold=1.0).noisy is False


def test_a_spread_the_table_shows_as_unknown_is_never_judged_noisy():
    """One place for "too few samples for a spread": the table's "?" and ``noisy`` agree."""
    from perflab.analysis.table import spread
    from perflab.store.columns import FEW_FOR_SPREAD

    wide = [1.0, 1.5, 0.6, 1.0, 1.2, 0.7]
    for n in range(1, len(wide) + 1):
        s = Stats(wide[:n], "wall_sync")
        assert (spread(s.as_row()) == "?") == (s.noisy is None) == (n < FEW_FOR_SPREAD), n


@pytest.mark.parametrize("samples", [[2.0], [2.0, 2.5]])
def test_with_fewer_than_three_samples_the_spread_is_unknown_not_zero(samples):
    s = Stats(samples, "wall_sync")
    assert math.isnan(s.std) and math.isnan(s.iqr) and s.noisy is None
    assert "too few samples" in s.suspect
    row = s.as_row()
    assert math.isnan(row["iqr_s"]) and row["noisy"] is None


def test_a_sample_near_the_timers_resolution_is_suspect():
    assert "near the timer's resolution" in Stats([1e-6] * 5, "wall_sync").suspect
    assert Stats([1e-6] * 5, "wall_sync", calls_per_sample=1000).suspect == ""  # a 1 ms block is fine
    assert Stats([0.5] * 5, "wall_sync").suspect == ""


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


def test_rounds_interleave_variants_in_a_rotating_order():
    clock = FakeClock()
    variants = {n: Variant(clock.takes(n, t), [CPU]) for n, t in (("a", 1.0), ("b", 2.0), ("c", 3.0))}
    stats = measure_rounds(variants, warmup=1, repeats=3, clock=clock)
    assert clock.log[:3] == ["a", "b", "c"]  # warm-up, once each
    assert clock.log[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {n: s.samples for n, s in stats.items()} == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [3.0] * 3}


def test_rounds_give_each_variant_its_own_min_time():
    clock = FakeClock()
    variants = {"fast": Variant(clock.takes("fast", 0.1), [CPU]), "slow": Variant(clock.takes("slow", 1.0), [CPU])}
    stats = measure_rounds(variants, warmup=0, repeats=2, min_time_s=1.0, clock=clock)
    assert stats["fast"].n == 10 and stats["slow"].n == 2


def test_around_wraps_every_sample_outside_the_clock():
    import contextlib

    clock = FakeClock()
    seen = []

    @contextlib.contextmanager
    def around(name):
        seen.append(("in", name, clock.now))
        clock.now += 100.0  # time spent here must not reach the samples
        yield
        seen.append(("out", name, clock.now))

    s = measure(clock.takes("x", 1.0), [CPU], warmup=1, repeats=2, clock=clock, around=around)
    assert s.samples == [1.0, 1.0] and len(seen) == 4


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


def test_torch_utils_benchmark_sampler_reports_seconds_per_call(monkeypatch):
    """blocked_autorange is called once; its per-call times are the samples, whatever block
    size it chose (a units error here would be off by that block size)."""
    import torch.utils.benchmark as tub

    clock = FakeClock()
    real = tub.Timer

    def timer_on_fake_clock(*args, **kwargs):
        return real(*args, **{**kwargs, "timer": clock})

    monkeypatch.setattr(tub, "Timer", timer_on_fake_clock)
    calls = {"blocked": 0}
    original = real.blocked_autorange

    def counting(self, *a, **k):
        calls["blocked"] += 1
        return original(self, *a, **k)

    monkeypatch.setattr(real, "blocked_autorange", counting)
    s = measure(clock.takes("f", 1e-5), [CPU], timer="torch_utils_benchmark", min_time_s=0.2)
    assert calls["blocked"] == 1
    assert s.timer == "torch_utils_benchmark" and s.calls_per_sample == 100  # it grew the block to 1 ms
    assert s.samples == pytest.approx([1e-5] * s.n)


def test_stats_of_times_measured_elsewhere():
    s = bench.stats_of([2.0, 4.0, 3.0], [9.0])
    assert (s.median, s.warmup, s.timer) == (3.0, [9.0], "wall_sync")


def test_benchmark_block_reads_the_clock_around_the_work():
    clock = FakeClock([3.5])
    with Benchmark("block", [CPU], clock=clock, report=False) as b:
        clock.work()
    assert b.elapsed == 3.5


def test_benchmark_elapsed_is_nan_until_the_block_ends():
    assert math.isnan(Benchmark("x").elapsed)


def test_every_timed_row_has_latency_percentiles_and_says_when_too_few_samples_make_them():
    a = np.arange(1, 201, dtype=float) / 1000
    s = Stats(list(a), "wall_sync")
    row = s.as_row()
    assert [row[k] for k in ("p50_s", "p90_s", "p99_s")] == pytest.approx(np.percentile(a, [50, 90, 99]))
    assert row["tail_note"] == "", "200 samples: a p99 has two beyond it"
    few = Stats([1.0] * 19 + [2.0], "wall_sync").as_row()
    assert few["p99_s"] == pytest.approx(np.percentile([1.0] * 19 + [2.0], 99)) and few["p90_s"] == 1.0
    assert few["tail_note"].startswith("p99 of 20 samples: interpolated between the largest")
    assert "p90 and p99 of 5 samples" in Stats([1.0] * 5, "wall_sync").as_row()["tail_note"]


def test_a_percentile_is_judged_on_the_raw_samples_like_the_median():
    import pandas as pd

    from perflab.analysis.frames import sample_values
    from perflab.store.columns import COLUMNS, JUDGED

    row = pd.Series({"row_id": "r1", "median_s": 2.0, "p99_s": 3.0})
    seconds = np.array([1.0, 2.0, 3.0])
    for metric in ("p50_s", "p90_s", "p99_s"):
        assert metric in JUDGED and COLUMNS[metric].unit == "s" and COLUMNS[metric].better == "lower"
        assert list(sample_values({"r1": seconds}, row, metric)) == [1.0, 2.0, 3.0]


def between_samples(run):
    """What Python runs between one timed sample (``bench._wall``) and the next, while ``run()``
    measures: each function's file and name, and each builtin's module and name."""
    import sys

    wall = bench._wall.__code__
    done: list[tuple[str, str, str]] = []
    gap: list[tuple[str, str, str]] | None = None  # open from a sample's end to the next one's start
    depth = 0

    def profile(frame, event, arg):
        nonlocal gap, depth
        if frame.f_code is wall and event in ("call", "return"):
            depth += 1 if event == "call" else -1
            if event == "call" and gap is not None:
                done.extend(gap)
            gap = [] if event == "return" else None
        elif depth == 0 and gap is not None and event in ("call", "c_call"):
            if event == "call":
                gap.append(("py", frame.f_code.co_filename, frame.f_code.co_qualname))
            else:
                gap.append(("c", str(getattr(arg, "__module__", "")), arg.__qualname__))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return done


def test_between_two_samples_of_a_part_nothing_reads_a_file(work):
    """Issue 30: reading the peak RSS (/proc/self/status, psutil) and energy counters between
    every two samples evicted the caches the next sample needed (+70 us on a 0.8 ms call). They
    are read around a part's run of samples; between two samples runs only the loop's own
    bookkeeping (a new per-sample reader: show it invisible in benchmarks/bench_overhead.py)."""
    import perflab

    rows = []
    args = ["experiment.batches=[1]", "experiment.seq_len=8", "results.table=false", *FAST]
    gap = between_samples(lambda: rows.append(perflab.run("quick/infer", args)))
    assert (rows[0]["status"] == "ok").all()
    assert len(gap) > 0, "the samples were seen"
    files = {Path(f).name for kind, f, _ in gap if kind == "py"}
    assert files <= {"bench.py", "context.py", "contextlib.py", "gpu.py", "devices.py", "turns.py"}, files
    assert {n for _, f, n in gap if f.endswith("turns.py")} <= {"turn", "compute"}, "a job alone: one check each"
    instruments = {n for _, f, n in gap if "instruments" in Path(f).parts}
    assert instruments <= {"GpuState.sampled"}, "per sample, only an instrument's sampled hook"
    readers = [(m, n) for kind, m, n in gap if kind == "c" and (m in ("posix", "io", "_io") or n == "open")]
    assert not readers, readers
