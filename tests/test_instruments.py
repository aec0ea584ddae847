"""An instrument is a class in one folder (perflab.measure.instruments), registered once: a new
one needs nothing else to reach every measured row; each declares its columns, whose facts the
one table (perflab.store.columns) holds."""

from __future__ import annotations

import contextlib
import importlib
import math
from typing import Any, Iterator

import pytest

from perflab.measure import instruments
from perflab.measure.devices import Device
from perflab.measure.instruments import INSTRUMENTS, Instrument, Instruments
from perflab.store import columns

from conftest import FAST

CPU = Device("cpu", "cpu", None, 1)


class Samples(Instrument):
    """A toy instrument: how many samples each part's runs held (its run and per-sample hooks)."""

    COLUMNS = ("toy_samples",)

    def __init__(self, devices: Any = ()) -> None:
        self.running = ""
        self.counted: dict[str, int] = {}

    @contextlib.contextmanager
    def run(self, name: str) -> Iterator[None]:
        self.running = name
        yield
        self.running = ""

    def sampled(self) -> None:
        self.counted[self.running] = self.counted.get(self.running, 0) + 1

    def row(self, name: str, calls: int, items_per_call: float | None = None) -> dict[str, Any]:
        return {"toy_samples": self.counted.get(name, 0)}


def test_a_registered_instrument_reaches_every_measured_row(work, monkeypatch):
    import perflab

    monkeypatch.setattr(instruments, "INSTRUMENTS", [*INSTRUMENTS, Samples])
    df = perflab.run("quick/matmul", [*FAST, "results.table=false"])
    ok = df[df["status"] == "ok"]
    assert len(ok) and "toy_samples" in ok
    assert (ok["toy_samples"] == ok["n"]).all(), "its hooks ran around each part's samples, its column in the row"
    assert "rss_peak_mb" in ok and "others_cpu_pct" in ok, "beside the built-in instruments' columns"


def test_each_instrument_declares_the_columns_it_writes_and_the_table_holds_them():
    for cls in INSTRUMENTS:
        assert cls.COLUMNS, cls
        assert set(cls.COLUMNS) <= set(columns.COLUMNS), f"{cls.__name__}: facts in perflab.store.columns"
    opened = Instruments([CPU])
    with opened.around(), opened.run("part"):
        for hook in opened.after_sample:
            hook()
    written = {**opened.row("part", calls=3, items_per_call=2.0), **opened.shared()}
    assert {"rss_peak_mb", "others_cpu_pct"} <= set(written)
    declared = {c for cls in INSTRUMENTS for c in cls.COLUMNS}
    assert set(written) <= declared, set(written) - declared


def test_the_gpu_state_declares_what_it_reads():
    from perflab.measure.instruments.gpu import GpuState

    gpu = GpuState([])
    gpu.reads = [(1400.0, 5000.0, 60.0, 250.0, 0x4)]
    assert set(gpu.row("x", 1)) == set(GpuState.COLUMNS)
    assert not math.isnan(gpu.row("x", 1)["gpu_sm_clock_mhz"])


def test_what_ab_judges_sample_by_sample_comes_from_the_table():
    from perflab.analysis.frames import PER_SAMPLE_TIMES

    assert {"median_s", "mean_s", "min_s", "p50_s", "p90_s", "p99_s"} == PER_SAMPLE_TIMES
    assert {c.name for c in columns.COLUMNS.values() if c.per_sample} == PER_SAMPLE_TIMES


@pytest.mark.parametrize(
    "old, name, new",
    [
        ("perflab.measure.watch", "Memory", "perflab.measure.instruments.memory"),
        ("perflab.measure.watch", "busy_reason", "perflab.measure.instruments.machine"),
        ("perflab.measure.watch", "GpuState", "perflab.measure.instruments.gpu"),
        ("perflab.measure.energy", "Energy", "perflab.measure.instruments.energy"),
    ],
)
def test_a_moved_name_keeps_working_a_release(old, name, new):
    moved = rf"{old}\.{name} moved: use 'from {new} import {name}' \(the old import goes in perflab 0\.6\.0\)"
    with pytest.warns(DeprecationWarning, match=moved):
        found = getattr(importlib.import_module(old), name)
    assert found is getattr(importlib.import_module(new), name)


def test_a_name_the_old_module_never_had_is_no_attribute_of_it():
    import perflab.measure.watch as watch

    with pytest.raises(AttributeError, match="'perflab.measure.watch' has no attribute 'nosuch'"):
        watch.nosuch  # noqa: B018
