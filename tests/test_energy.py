"""Energy beside time where the machine exposes it (RAPL, NVML); the reason where it does not."""

from __future__ import annotations

import pandas as pd
import pytest

from perflab.measure.devices import Device
from perflab.measure.instruments.energy import Energy

CPU = Device("cpu", "cpu")


def fake_rapl(root, joules, wrap=100.0):
    package = root / "intel-rapl:0"
    (package / "intel-rapl:0:0").mkdir(parents=True)  # a sub-domain (a core): inside the package's count
    (package / "energy_uj").write_text(str(int(joules * 1e6)))
    (package / "max_energy_range_uj").write_text(str(int(wrap * 1e6)))
    return package / "energy_uj"


def test_rapl_joules_per_call_and_per_item_over_the_samples_with_a_wrapped_counter(tmp_path):
    counter = fake_rapl(tmp_path, 90.0)
    energy = Energy([CPU], root=tmp_path)
    assert energy.why == ""
    with energy.sample("part"):
        counter.write_text(str(int(99.0 * 1e6)))  # 9 J
    with energy.sample("part"):
        counter.write_text(str(int(2.0 * 1e6)))  # wrapped at 100 J: 3 J
    assert energy.columns("part", calls=4, items_per_call=2) == pytest.approx(
        {"joules_per_call": 3.0, "joules_per_item": 1.5}
    )


def test_without_counters_a_row_says_why_and_holds_no_number(tmp_path):
    energy = Energy([CPU], root=tmp_path / "none")
    with energy.sample("part"):
        pass
    assert energy.columns("part", calls=3) == {
        "energy_note": f"no RAPL counters here ({tmp_path / 'none'}/intel-rapl:N: a virtual machine, or not Intel/AMD)"
    }


def test_a_measured_row_carries_its_energy_or_its_reason(work):
    import perflab

    df = perflab.run("quick/matmul", ["bench.repeats=2", "bench.min_time_s=0", "results.table=false"])
    row = df[df["status"] == "ok"].iloc[0]
    assert row["joules_per_call"] > 0 if "joules_per_call" in df else row["energy_note"].startswith(("no RAPL", "RAPL"))


@pytest.mark.parametrize("timer", ["wall_sync", "torch_utils_benchmark"])
def test_a_row_timed_where_no_counter_was_read_says_why(work, tmp_path, monkeypatch, timer):
    import perflab
    from perflab.measure.instruments import energy

    fake_rapl(tmp_path, 5.0)  # counters that can be read: the machine is not why
    monkeypatch.setattr(energy, "POWERCAP", tmp_path)
    df = perflab.run(
        "quick/matmul", [f"bench.timer={timer}", "bench.repeats=2", "bench.min_time_s=0", "results.table=false"]
    )
    row = df[df["status"] == "ok"].iloc[0]
    if timer == "wall_sync":
        assert row["joules_per_call"] == 0.0, "read around every sample (the fake counter stands still)"
    else:
        assert row["energy_note"] == energy.NOT_SAMPLED and pd.isna(row.get("joules_per_call"))
