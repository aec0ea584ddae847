"""The report's trend figure of a long history keeps its size: a series of thousands of subjects
draws the median of each run of them, the axis names a few (issue 42: a report of a year of
nightly runs is bounded, its steps still shown where they are)."""

from __future__ import annotations

import numpy as np
import pytest

from perflab.history import ChangePoint, Series

plots = pytest.importorskip("perflab.analysis.plots")
pytest.importorskip("matplotlib")


def _figure(subjects: int) -> str:
    series = []
    for k in range(3):
        names = [f"c{i:07x}" for i in range(subjects)]
        values = 1.0 + 0.15 * (np.arange(subjects) >= subjects // 2)
        series.append(
            Series(
                "matmul",
                f"m{k}",
                {"size": str(k)},
                {},
                "median_s",
                False,
                names,
                values,
                [""] * subjects,
                [""] * subjects,
            )
        )
    step = ChangePoint(series[0], subjects // 2, 1.0, 1.15, 0.001, "regression")
    return plots.svg(plots.trend(series, [step]))


def test_a_long_historys_trend_keeps_its_size_and_its_step(monkeypatch):
    monkeypatch.setattr(plots, "MAX_POINTS", 30)  # as a year's history against 300, in a tenth of the time
    monkeypatch.setattr(plots, "MAX_TICKS", 10)
    short, long = _figure(30), _figure(300)
    assert len(long) < 1.5 * len(short), (len(short), len(long))
    assert "regression +15 %" in long, "the step marked where it is"
