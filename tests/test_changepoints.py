"""history's change points (perflab.analysis.changepoints) are ruptures' PELT with the L1 cost:
the same segments on series with and without changes, each segment's cost its own."""

from __future__ import annotations

import numpy as np
import pytest
import ruptures

from perflab.analysis.changepoints import L1Costs, pelt_l1


def test_l1_cost_is_the_sum_of_absolute_deviations_from_the_median():
    x = np.random.default_rng(0).normal(size=41)
    costs = L1Costs(x)
    pairs = [(0, 41), (3, 10), (7, 9), (10, 13), (0, 2), (5, 5)]
    got = costs(np.array([a for a, _ in pairs]), np.array([b for _, b in pairs]))
    want = [float(np.abs(x[a:b] - np.median(x[a:b])).sum()) if b > a else 0.0 for a, b in pairs]
    assert got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(
    "min_size", [pytest.param(2, marks=pytest.mark.slow), 3, pytest.param(5, marks=pytest.mark.slow)]
)
def test_segments_are_ruptures_pelt_l1(min_size):
    """Steps of several sizes in noise, and noise alone, at the penalties history uses."""
    rng = np.random.default_rng(min_size)
    for trial in range(40):
        n = int(rng.integers(2 * min_size, 160))
        level = np.repeat(rng.choice([0.0, 0.05, 0.2], size=n // 20 + 1), 20)[:n] if trial % 2 else np.zeros(n)
        signal = np.log1p(level + 0.5) + 0.01 * rng.standard_normal(n)
        penalty = 2 * np.log(n) * float(rng.choice([0.005, 0.01, 0.05]))
        want = ruptures.Pelt(model="l1", min_size=min_size, jump=1).fit(signal.reshape(-1, 1)).predict(pen=penalty)
        assert pelt_l1(signal, penalty, min_size) == want, (trial, n, penalty)


def test_a_constant_series_is_one_segment():
    assert pelt_l1(np.zeros(30), 0.1, 3) == [30]
    assert pelt_l1(np.r_[np.zeros(15), np.ones(15)], 0.1, 3) == [15, 30]


def _pelt_every_start(signal, penalty, min_size):
    """The recursion as it was (0.4.0): every admissible start's exact cost to every end, the
    reference the bounded search must match end for end (the same floats, the same ties)."""
    n, min_size = len(signal), max(min_size, 2)
    costs = L1Costs(signal)
    best, start_of, admissible = np.full(n + 1, np.nan), np.zeros(n + 1, np.int64), []
    best[0] = 0.0
    for end in range(min_size, n + 1):
        new = end - min_size
        if new == 0 or new >= min_size:
            admissible.append(new)
        starts = np.array(admissible)
        totals = best[starts] + (costs(starts, np.full(len(starts), end)) + penalty)
        i = int(np.argmin(totals))
        best[end], start_of[end] = totals[i], starts[i]
        admissible = starts[totals <= best[end] + penalty].tolist()
    found, at = [], n
    while at > 0:
        found.append(at)
        at = int(start_of[at])
    return found[::-1]


@pytest.mark.parametrize("n", [40, 300, 1000])
def test_bounded_search_is_the_exhaustive_one(monkeypatch, n):
    """Long series with and without steps, values with ties (a coarse timer) and a constant one:
    the same change points as every start's exact cost gives, certified or by the recursion alone."""
    rng = np.random.default_rng(n)
    series = [
        np.log(1e-4 * rng.lognormal(0, 0.02, n)),  # no change: nothing is ever pruned
        np.log(1e-4 * rng.lognormal(0, 0.02, n)) + np.log(1.15) * (np.arange(n) >= n // 2),
        np.round(rng.normal(0, 1, n) + 3 * (np.arange(n) % (n // 3 + 1) == 0).cumsum(), 1),  # steps, ties
        np.zeros(n),
    ]
    for k, signal in enumerate(series):
        noise = float(np.median(np.abs(np.diff(signal))))
        for penalty in (2 * np.log(n) * max(noise, 0.005), 0.5 * max(noise, 0.005)):
            want = _pelt_every_start(signal, penalty, 3)
            assert pelt_l1(signal, penalty, 3) == want, (k, penalty)
            assert _recursion_alone(monkeypatch, signal, penalty, 3) == want, (k, penalty)


def test_blocks_decided_together_and_end_by_end_alike(monkeypatch):
    """A block's ends are decided together unless a change might be in it, then one by one:
    series with steps take both ways, and the one-by-one way alone finds the same segments
    (the recursion's own ways: the certificate, which would decide these series, is off)."""
    from perflab.analysis import changepoints

    monkeypatch.setattr(changepoints, "_certified", lambda *args: None)

    rng = np.random.default_rng(7)
    n = 400
    steps = np.log(1e-4 * rng.lognormal(0, 0.02, n)) + np.log(1.15) * (np.arange(n) >= n // 3)
    steps += np.log(1.3) * (np.arange(n) >= 2 * n // 3)
    penalty = 2 * np.log(n) * max(float(np.median(np.abs(np.diff(steps)))), 0.005)
    want = _pelt_every_start(steps, penalty, 3)
    assert len(want) == 3

    calls = {"together": 0, "by_end": 0}
    together, by_end = changepoints._whole_block, changepoints._end_by_end

    def counted_together(*args):
        found = together(*args)
        calls["together"] += found is not None
        return found

    def counted_by_end(*args):
        calls["by_end"] += 1
        return by_end(*args)

    monkeypatch.setattr(changepoints, "_whole_block", counted_together)
    monkeypatch.setattr(changepoints, "_end_by_end", counted_by_end)
    assert pelt_l1(steps, penalty, 3) == want
    assert calls["together"] > 0 and calls["by_end"] > 0, calls

    monkeypatch.setattr(changepoints, "_whole_block", lambda *args: None)  # every block end by end
    ties = np.round(rng.normal(0, 1, n) + 3 * (np.arange(n) % 90 == 0).cumsum(), 1)
    for signal in (steps, np.log(1e-4 * rng.lognormal(0, 0.02, n)), ties):
        noise = max(float(np.median(np.abs(np.diff(signal)))), 0.005)
        for penalty in (2 * np.log(n) * noise, 0.5 * noise):
            assert pelt_l1(signal, penalty, 3) == _pelt_every_start(signal, penalty, 3), penalty


def _recursion_alone(monkeypatch, signal, penalty, min_size):
    """pelt_l1 as it was before the certificate: the bounded recursion on every series."""
    from perflab.analysis import changepoints

    with monkeypatch.context() as patch:
        patch.setattr(changepoints, "_certified", lambda *args: None)
        return pelt_l1(signal, penalty, min_size)


def _history_like(rng, n, change_at=None):
    """A series as history sees one: the log of per-subject medians, a 15 % step where asked."""
    signal = np.log(1e-4 * rng.lognormal(0, 0.01, n))
    if change_at is not None:
        signal += np.log(1.15) * (np.arange(n) >= change_at)
    noise = float(np.median(np.abs(np.diff(signal))))
    return signal, 2 * np.log(n) * max(noise, 0.005)


@pytest.mark.parametrize("change_at", [None, 76, 300])
def test_long_series_are_decided_without_the_recursion(monkeypatch, change_at):
    """History's long series, with no change or one: the certificate alone finds their segments
    (the quadratic recursion is never built), the ones the recursion and the exhaustive search find."""
    from perflab.analysis import changepoints

    signal, penalty = _history_like(np.random.default_rng(42), 900, change_at)
    want = _pelt_every_start(signal, penalty, 3)
    assert want == ([900] if change_at is None else [change_at, 900])
    assert _recursion_alone(monkeypatch, signal, penalty, 3) == want

    def no_recursion(*args):
        raise AssertionError("the recursion ran")

    monkeypatch.setattr(changepoints, "L1Costs", no_recursion)
    assert changepoints._certified(signal, penalty, 3) == want
    assert pelt_l1(signal, penalty, 3) == want


def test_a_history_of_years_is_decided_without_the_recursion(monkeypatch):
    """8,000 subjects and a step (a 100k-run-dir tree's series): the certificate's grid stays a
    few hundred medians (it kept every value of a loose interval: more than memory allows, and
    the recursion took 1-2 s a series), and it finds what the recursion alone finds."""
    from perflab.analysis import changepoints

    signal, penalty = _history_like(np.random.default_rng(7), 8000, 800)
    want = _recursion_alone(monkeypatch, signal, penalty, 3)
    assert want == [800, 8000]
    assert changepoints._certified(signal, penalty, 3) == want


def test_a_near_tie_is_left_to_the_recursion():
    """Two segmentations of equal cost (the middle value as far from either side): rounding
    and order decide between them, so the certificate declines and the recursion decides."""
    from perflab.analysis import changepoints

    signal = np.r_[np.zeros(10), 0.5, np.ones(10)]
    assert changepoints._certified(signal, 0.1, 3) is None
    assert pelt_l1(signal, 0.1, 3) == _pelt_every_start(signal, 0.1, 3)
    assert changepoints._certified(np.zeros(30), 0.1, 3) == [30]  # constant: one segment, by the whole penalty


def test_extreme_penalties_end():
    """A penalty far beyond the values' range (the certificate's integers cannot hold it) and
    none at all: the certificate declines, and the recursion still answers."""
    from perflab.analysis import changepoints

    rng = np.random.default_rng(3)
    signal = np.r_[rng.normal(0, 1, 50), rng.normal(5, 1, 50)]
    assert changepoints._certified(signal, 1e300, 3) is None
    assert pelt_l1(signal, 1e300, 3) == [100]
    assert pelt_l1(signal, 0.0, 3) == _pelt_every_start(signal, 0.0, 3)


def _random_series(rng, n):
    """Noise of several scales with one of: nothing, a step, ties, outliers, many steps, an early step."""
    kind = int(rng.integers(0, 6))
    signal = rng.normal(0, 1, n) * float(rng.choice([0.01, 0.1]))
    if kind == 1:
        signal += float(rng.choice([0.03, 0.2, 1.0])) * (np.arange(n) >= rng.integers(1, n))
    elif kind == 2:
        signal = np.round(signal * 30) / 30
    elif kind == 3:
        signal[rng.integers(0, n, max(1, n // 30))] += float(rng.choice([0.5, -2.0]))
    elif kind == 4:
        signal += np.repeat(rng.normal(0, 0.3, n // 10 + 1), 10)[:n]
    elif kind == 5:
        signal += 0.1 * (np.arange(n) >= int(rng.integers(1, 8)))
    return signal + float(rng.choice([0.0, -9.2]))


def test_certified_or_not_the_segments_are_the_recursions(monkeypatch):
    """Many random series, short and long, at history's penalty and smaller ones: pelt_l1 finds
    the segments the recursion alone finds, and the exhaustive search where it is affordable;
    the certificate decides a good share of them (else this compares nothing new)."""
    from perflab.analysis import changepoints

    rng = np.random.default_rng(2026)
    decided = 0
    for trial in range(150):
        n = int(rng.choice([6, 9, 20, 50, 120, 400]))
        min_size = int(rng.integers(1, 6))
        signal = _random_series(rng, n)
        noise = max(float(np.median(np.abs(np.diff(signal)))), 0.005)
        penalty = float(rng.choice([2 * np.log(n) * noise, 0.5 * noise, 0.0]))
        want = _recursion_alone(monkeypatch, signal, penalty, min_size)
        assert pelt_l1(signal, penalty, min_size) == want, trial
        if n <= 120:
            assert want == _pelt_every_start(signal, penalty, min_size), trial
        decided += changepoints._certified(signal, penalty, max(min_size, 2)) is not None
    assert decided >= 40, decided
