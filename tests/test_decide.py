"""The one verdict rule, as a table: a point's statistics and the gate in, a verdict and its
reasons out (``verdicts.decide``: pure), and history's step labels by the same significance."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perflab.analysis import replicates, verdicts
from perflab.analysis.floor import Floor
from perflab.analysis.replicates import Change, Measured, Spread
from perflab.analysis.verdicts import ComparedPoint, Counted, Gate, PointStats, StepLabel, Verdict, decide

GATE = Gate(10.0, 0.05)
FLOOR = Floor(0.02, "--process-cv")
MEASURED = Spread(between=0.02, within=0.01, measured=True, df=4)


def side(value: float = 1.0, processes: int = 3) -> Measured:
    figures = np.full(processes, value)
    return Measured(pd.DataFrame(), value, figures, [], [np.array([])] * processes, figures)


def point(**kw) -> ComparedPoint:
    given = {"experiment": "matmul", "label": "matmul / cpu", "metric": "median_s", "base": side(), "new": side()}
    return ComparedPoint(**{**given, **kw})


def stats(speedup=1.0, p_adj=0.5, detectable=3.0, margin=0.01, spread=MEASURED) -> PointStats:
    """A time's statistics: ``speedup`` above 1 is faster; significant where ``p_adj`` < 0.05."""
    change = Change(1 / speedup, p_adj, 0.0, 0.0, spread, detectable, 3, 3, margin)
    return PointStats(speedup, 0.0, 0.0, p_adj, verdicts.significant(p_adj, 0.05), change, FLOOR, 0.05)


@pytest.mark.parametrize(
    ("given", "verdict", "reason"),
    [
        (stats(0.8, 0.001), "FAIL", "1.25x slower: beyond the 10 % gate (adjusted p=0.001)"),
        (stats(0.95, 0.001), "PASS", "1.05x slower; a 3 % change was detectable"),
        (stats(1.25, 0.001, detectable=20), "PASS", "1.25x faster, significantly (adjusted p=0.001)"),
        (stats(0.97), "PASS", "no significant change; a 3 % change was detectable"),
        (stats(1.0, detectable=20, margin=0.05), "PASS", "no significant change; at most 5.1 % slower at this "),
        (stats(1.0, detectable=20, margin=0.5), "INCONCLUSIVE", "these processes could show only changes above 20 %"),
        (stats(0.5, 0.2, detectable=math.inf, margin=math.inf), "INCONCLUSIVE", "these processes could show no "),
        (
            stats(1.0, detectable=7.9e7, margin=math.inf),
            "INCONCLUSIVE",
            "these processes could show only changes of more",
        ),
    ],
)
def test_a_points_statistics_and_the_gate_give_its_verdict_and_first_reason(given, verdict, reason):
    decision = decide(point(), given, GATE)
    assert decision.verdict == verdict and decision.reasons[0].startswith(reason), decision
    assert decision == decide(point(), given, GATE), "the same statistics, the same decision"


def test_what_the_rows_say_is_added_to_the_reasons_and_a_busy_machine_is_never_judged():
    fail = stats(0.8, 0.001)
    busy = decide(point(busy=("new",)), fail, GATE)
    assert busy.verdict == "INCONCLUSIVE" and busy.reasons[0].startswith("not judged: new measured on a busy machine")
    assert busy.reasons[1].startswith("1.25x slower")  # what it showed, said after
    suspect = decide(point(suspect="new: too few samples"), fail, GATE)
    assert suspect.verdict == "FAIL" and suspect.reasons[-1] == "its measurements were flagged suspect: see suspect"
    other = point(identity="num_threads: 2 vs 1")
    assert decide(other, None, GATE).verdict == "INCOMPARABLE"
    assert decide(other, None, GATE).why == "machine identity differs: num_threads: 2 vs 1"
    mixed = decide(other, fail, Gate(10.0, 0.05, allow_mixed=True))
    assert mixed.verdict == "FAIL" and "compared across identities on purpose" in mixed.reasons[-1]
    gone = decide(point(new=side(math.nan), left_out="in NEW: 3 NaN"), None, GATE)
    assert gone.verdict == "INCONCLUSIVE" and gone.why == "no usable median_s in NEW (left out in NEW: 3 NaN)"
    with pytest.raises(ValueError, match="needs its statistics"):
        decide(point(), None, GATE)


def test_one_process_a_side_says_what_it_was_judged_against():
    floor = stats(0.97, spread=Spread(0.01, 0.005, measured=False, df=0))
    assert "judged against a floor of 2 % (--process-cv;" in decide(point(), floor, GATE).reasons[-1]
    own = stats(0.97, spread=Spread(0.05, 0.03, measured=False, df=0))
    assert "judged against 5 %, what the samples' own spread" in decide(point(), own, GATE).reasons[-1]


@pytest.mark.parametrize(
    ("more", "noise", "verdict", "reason"),
    [
        (5.0, 0.1, "FAIL", "5 % more instructions: beyond the 1 % tolerance of an exact count (counts vary by 0.1 %)"),
        (0.5, 0.1, "PASS", "0.5 % more instructions: within the 1 % tolerance of an exact count"),
        (-5.0, 0.1, "PASS", "5 % fewer instructions: beyond the 1 % tolerance of an exact count"),
        (5.0, 3.0, "INCONCLUSIVE", "5 % more instructions, but the counts vary by 3 % (between repeats or processes)"),
    ],
)
def test_an_exact_metric_is_judged_against_its_tolerance_whatever_the_gate(more, noise, verdict, reason):
    counted = PointStats(1 / (1 + more / 100), *[math.nan] * 3, abs(more) > 1, Counted(more, noise, math.nan, 1, 1))
    for gate in (GATE, Gate(0.0, 0.05), Gate(50.0, 0.05)):
        decision = decide(point(metric="instructions"), counted, gate)
        assert decision.verdict == verdict and decision.why.startswith(reason), decision


def test_words_and_numbers_agree_a_significant_slowdown_is_never_beside_an_interval_holding_one():
    """#41: judged together (FDR over the points), a point's words never contradict its interval:
    a FAIL's interval lies below 1, and where the interval holds 1 no reason says it moved."""
    rng = np.random.default_rng(41)
    points = [
        point(base=side_of(rng.normal(0, 0.05, 4)), new=side_of(rng.normal(np.log(slow), 0.05, 4)), higher=False)
        for slow in (1.0, 1.02, 1.05, 1.1, 1.2, 1.4) * 8
    ]
    judged = verdicts.judge(points, 10.0, 0.05, False)
    seen = {d.verdict for _, d in judged}
    assert {Verdict.FAIL, Verdict.PASS} <= seen, seen
    for s, d in judged:
        assert s is not None
        holds_one = s.ci_low <= 1 <= s.ci_high
        if d.verdict == Verdict.FAIL or s.significant:
            assert not holds_one, (s, d)
        if holds_one:
            assert not s.significant and not any("x slower" in w or "x faster" in w for w in d.reasons), (s, d)


def side_of(logs: np.ndarray) -> Measured:
    """Processes' figures only (no samples: the t interval, no bootstrap)."""
    figures = np.exp(logs)
    return Measured(pd.DataFrame(), float(np.median(figures)), figures, [], [np.array([])] * len(figures), figures)


@pytest.mark.parametrize(
    ("p_adj", "change_pct", "worse", "label"),
    [
        (0.001, 9.0, True, StepLabel.REGRESSION),
        (0.001, -9.0, False, StepLabel.IMPROVEMENT),
        (0.001, 3.0, True, StepLabel.SUSPICIOUS),  # significant, but smaller than the threshold
        (0.2, 30.0, True, StepLabel.SUSPICIOUS),  # big, not significant
        (math.nan, 30.0, True, StepLabel.SUSPICIOUS),  # nothing to test
        (0.001, 5.0, True, StepLabel.REGRESSION),  # at least the threshold
    ],
)
def test_history_labels_a_step_by_the_same_significance_and_gate(p_adj, change_pct, worse, label):
    assert verdicts.label_step(p_adj, change_pct, worse, Gate(5.0, 0.05)) == label


def test_the_processes_needed_reason_is_the_models():
    c = Change(1.0, 0.5, 0.9, 1.1, MEASURED, 20.0, 3, 3, 0.5)
    need = replicates.processes_needed(c, 10.0, 0.05, FLOOR.cv)
    reason = decide(point(), PointStats(1.0, 0.9, 1.1, 0.5, False, c, FLOOR, 0.05), GATE).reasons[0]
    assert f"about {need} a side would do (bench.processes={need}, or perflab ab)" in reason
