"""The statistics behind the claims' verdicts (:mod:`perflab.analysis.claims`), with scipy.stats.

Each check takes the evidence (rows, their raw samples, or figures) and the claim's words and
returns a :class:`~perflab.analysis.claims.Claim`. Two rules hold for all of them:

- INVALID needs clean evidence: rows perflab marks suspect (a busy machine, too few samples,
  a figure above a measured peak) can support a claim but never refute it: the verdict is then
  UNDERPOWERED, saying why.
- UNDERPOWERED says what would decide: how many more samples a side (two samples: the
  Mann-Whitney test's power, ``stats.repeats_needed``; a statistic of several: the width of its
  95 % bootstrap interval, which shrinks as 1/sqrt(n)), more test images, or more training.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from perflab.analysis.claims import INVALID, NOT_APPLICABLE, UNDERPOWERED, VALID, Claim, Tree
from perflab.store.rows import number

ALPHA = 0.05
Z = 1.959963984540054  # two-sided 95 %
MIN_SAMPLES = 4  # a side: with 3 a side no Mann-Whitney test reaches p < 0.05
PRACTICAL = 100_000  # beyond this many samples a side, "more samples" is no advice


def problems(rows: Iterable[Mapping[str, Any]]) -> str:
    """Why these rows are not clean evidence: what perflab flagged them for, each reason once
    with the measurements it concerns ("" if nothing)."""
    found: dict[str, list[str]] = {}
    for r in rows:
        name = str(r.get("measurement", ""))
        status = str(r.get("status", "ok"))
        if status not in ("ok", "<NA>"):
            found.setdefault(f"{status} ({r.get('error') or 'no reason given'})", []).append(name)
        suspect = r.get("suspect")
        for reason in str(suspect).split("; ") if isinstance(suspect, str) else []:
            if reason.strip():
                found.setdefault(reason.strip(), []).append(name)
    return "; ".join(f"{reason} ({', '.join(dict.fromkeys(names))})" for reason, names in found.items())


def claim(section: str, statement: str, book: str, expected: str, tolerance: str) -> Callable[..., Claim]:
    """A partial Claim: the words fixed, the outcome (measured, verdict, why) to come."""
    return functools.partial(Claim, section, statement, book, expected, tolerance)


def not_applicable(
    section: str, statement: str, book: str, why: str, measured: str = "", expected: str = "", tolerance: str = ""
) -> Claim:
    return Claim(section, statement, book, expected or "-", tolerance or "-", measured, NOT_APPLICABLE, why)


def refute_or_doubt(outcome: Callable[..., Claim], measured: str, why: str, doubt: str) -> Claim:
    """INVALID on clean evidence; UNDERPOWERED (saying why) on evidence perflab flagged."""
    if doubt:
        return outcome(measured, UNDERPOWERED, f"{why}, but the evidence is not clean: {doubt}; measure again")
    return outcome(measured, INVALID, why)


def more_samples(n: int, halfwidth: float, gap: float) -> int:
    """Samples a side more that would shrink a 95 % interval of half-width ``halfwidth`` (log
    scale) below ``gap``, the distance from the estimate to the nearer deciding line."""
    if gap <= 0 or not math.isfinite(halfwidth):
        return PRACTICAL
    return max(1, math.ceil(n * (halfwidth / gap) ** 2) - n)


def more_words(n: int, more: int) -> str:
    if more >= PRACTICAL:
        return "too close to the deciding line to tell at this spread: more samples would not settle it"
    return f"about {more} more samples a side would decide (bench.repeats={n + more})"


def faster(
    outcome: Callable[..., Claim],
    tree: Tree,
    base: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    at_least: float = 1.0,
    margin: float = 0.05,
    detail: str = "",
) -> Claim:
    """``new`` runs at least ``at_least`` x faster than ``base`` (the same work, raw sample
    times): VALID when the 95 % bootstrap interval of the speedup lies above ``at_least``;
    INVALID when it lies below ``at_least`` x (1 + ``margin``): not faster by a margin that
    counts; else UNDERPOWERED with the samples that would decide."""
    from perflab.analysis import stats

    a, b = tree.samples_of(base), tree.samples_of(new)
    doubt = problems([base, new])
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        n = min(len(a), len(b))
        return outcome(
            _median_speedup(base, new) + detail,
            UNDERPOWERED,
            f"{len(a)} and {len(b)} samples: at least {MIN_SAMPLES} a side are needed "
            f"(bench.repeats={max(MIN_SAMPLES, 10)}){'' if n else '; no raw samples kept (results.samples=false?)'}",
        )
    d = stats.compare_samples(a, b, higher_is_better=False)
    measured = f"{d.speedup:.3g}x (95% CI {d.ci_low:.3g}-{d.ci_high:.3g}; {len(a)} and {len(b)} samples){detail}"
    if d.ci_low > at_least:
        return outcome(measured, VALID)
    line = at_least * (1 + margin)
    if d.ci_high < line:
        return refute_or_doubt(outcome, measured, f"the speedup is below {line:.3g}x with 95% confidence", doubt)
    # the change the samples must be able to show: from the estimate to the nearer deciding line
    gap = max(math.log(d.speedup) - math.log(at_least), math.log(line) - math.log(d.speedup))
    n = min(len(a), len(b))
    needed = stats.repeats_needed(a, b, 100 * math.expm1(gap))
    more = PRACTICAL if not math.isfinite(needed) else max(1, int(needed) - n)
    return outcome(measured, UNDERPOWERED, "the interval straddles the deciding line: " + more_words(n, more))


def _median_speedup(base: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    b, n = number(base.get("median_s")), number(new.get("median_s"))
    return f"{b / n:.3g}x (medians)" if b and n else ""


def interval(
    samples: Sequence[np.ndarray], statistic: Callable[..., Any], resamples: int = 2000
) -> tuple[float, float, float]:
    """A statistic of several independent samples and its 95 % percentile-bootstrap interval."""
    from scipy import stats

    point = float(statistic(*samples, axis=-1))
    ci = stats.bootstrap(
        tuple(samples),
        statistic,
        vectorized=True,
        paired=False,
        n_resamples=resamples,
        method="percentile",
        random_state=np.random.default_rng(0),
    ).confidence_interval
    return point, float(ci.low), float(ci.high)


def at_least(
    outcome: Callable[..., Claim],
    samples: Sequence[np.ndarray],
    statistic: Callable[..., Any],
    *,
    floor: float,
    ceiling: float,
    unit: str,
    doubt: str,
    ceiling_why: str,
) -> Claim:
    """A statistic of raw samples (e.g. concurrency) is at least ``floor``: VALID when its 95 %
    interval lies at or above it (and the estimate is not above ``ceiling``, where it would be
    impossible: then UNDERPOWERED, saying ``ceiling_why``); INVALID when the interval lies below."""
    n = min((len(s) for s in samples), default=0)
    if n < MIN_SAMPLES:
        return outcome("", UNDERPOWERED, f"{n} samples: at least {MIN_SAMPLES} a side are needed")
    point, low, high = interval(samples, statistic)
    measured = f"{point:.3g}{unit} (95% CI {low:.3g}-{high:.3g}; {n} samples a side)"
    if point > ceiling:
        return outcome(measured + " (impossible: suspect)", UNDERPOWERED, ceiling_why)
    if low >= floor:
        return outcome(measured, VALID)
    if high < floor:
        return refute_or_doubt(outcome, measured, f"below {floor:.3g}{unit} with 95% confidence", doubt)
    half = (math.log(high) - math.log(low)) / 2 if low > 0 else math.inf
    gap = abs(math.log(point) - math.log(floor)) if point > 0 else 0.0
    return outcome(
        measured, UNDERPOWERED, "the interval straddles the deciding line: " + more_words(n, more_samples(n, half, gap))
    )


def share(
    outcome: Callable[..., Claim],
    value: float | None,
    reference: float | None,
    *,
    floor: float,
    ceiling: float = 1.0,
    doubt: str,
    above_why: str,
    what: str = "",
) -> Claim:
    """``value`` is at least ``floor`` of ``reference`` (single figures, e.g. a peak against a
    datasheet): a share above ``ceiling`` is flagged and judged UNDERPOWERED (``above_why``),
    never shown plain."""
    if value is None or reference is None or reference <= 0:
        return outcome("", UNDERPOWERED, f"no {what or 'figure'} to compare in these rows")
    ratio = value / reference
    measured = f"{ratio:.0%} ({value:.3g} of {reference:.3g}{what})"
    if 1.0 < ratio <= ceiling:
        measured += f"; above 100 %, flagged: {above_why}"
    if ratio > ceiling:
        return outcome(measured + f", above {ceiling:.0%}: suspect", UNDERPOWERED, above_why)
    if ratio >= floor:
        return outcome(measured, VALID)
    return refute_or_doubt(outcome, measured, f"below {floor:.0%}", doubt)


def at_most(outcome: Callable[..., Claim], value: float | None, limit: float, *, unit: str, doubt: str) -> Claim:
    """A single figure (e.g. a latency) is at most ``limit``."""
    if value is None:
        return outcome("", UNDERPOWERED, "no figure to compare in these rows")
    measured = f"{value:.3g}{unit}"
    if value <= limit:
        return outcome(measured, VALID)
    return refute_or_doubt(outcome, measured, f"above {limit:.3g}{unit}", doubt)


def same_accuracy(
    outcome: Callable[..., Claim],
    base: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    n_base: int,
    n_new: int,
    classes: int,
    margin: float = 0.05,
    unsettled: str = "",
) -> Claim:
    """``new``'s test accuracy matches ``base``'s within ``margin`` (absolute): VALID when the
    95 % interval of the difference (two binomial proportions) lies inside +-margin; INVALID
    when it lies outside. UNDERPOWERED when the baseline did not learn beyond chance (a
    one-sided binomial test against 1/classes: two untrained models "match" and show nothing),
    when the caller says the runs had not settled (``unsettled``), or when the interval is too
    wide (then: how many test images would do). Conservative: both runs are scored on the same
    test images, but the rows keep no per-image answers to pair them by."""
    from scipy import stats

    p1, p2 = number(base.get("test_acc")), number(new.get("test_acc"))
    if p1 is None or p2 is None:
        return outcome("", UNDERPOWERED, "no test accuracy in these rows")
    diff = p2 - p1
    se = math.sqrt(p1 * (1 - p1) / n_base + p2 * (1 - p2) / n_new)
    low, high = diff - Z * se, diff + Z * se
    measured = f"{p1:.3f} vs {p2:.3f}: {diff:+.3f} (95% CI {low:+.3f} to {high:+.3f}; {n_base} and {n_new} test images)"
    chance = 1 / classes
    learned = stats.binomtest(round(p1 * n_base), n_base, chance, alternative="greater").pvalue < ALPHA
    if not learned or p1 < chance + margin:
        return outcome(
            measured,
            UNDERPOWERED,
            f"the baseline did not learn beyond chance ({p1:.3f}; chance {chance:.2f}): two untrained models "
            "match and show nothing; train longer (more epochs or images)",
        )
    if unsettled:
        return outcome(measured, UNDERPOWERED, unsettled)
    if -margin < low and high < margin:
        return outcome(measured, VALID)
    if low > margin or high < -margin:
        return refute_or_doubt(
            outcome, measured, f"the accuracies differ by more than {margin:.2f}", problems([base, new])
        )
    room = margin - abs(diff)
    if room <= 0:
        return outcome(
            measured, UNDERPOWERED, "the difference sits at the margin: more test images and training would decide"
        )
    factor = (Z * se / room) ** 2
    return outcome(
        measured,
        UNDERPOWERED,
        f"the interval is wider than the margin: about {math.ceil(factor * max(n_base, n_new))} test images "
        "would decide (data.test_size)",
    )


def affine(
    outcome: Callable[..., Claim],
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    min_points: int = 4,
    min_r2: float = 0.95,
    doubt: str,
    describe: Callable[[float, float], str],
    intercept: str = "",
) -> Claim:
    """``ys`` follow a line in ``xs`` with a positive slope (least squares): VALID when it
    explains at least ``min_r2`` of their variance over ``min_points`` points or more.
    ``describe(slope, intercept)`` words the fitted model. ``intercept`` names what the line's
    intercept is (a latency): one below 0 is no such thing, and the fit judges nothing (UNDERPOWERED)."""
    from scipy import stats

    if len(xs) < min_points:
        return outcome("", UNDERPOWERED, f"{len(xs)} points: at least {min_points} are needed for a fit")
    fit = stats.linregress(np.asarray(xs, float), np.asarray(ys, float))
    r2 = float(fit.rvalue) ** 2
    measured = f"{describe(float(fit.slope), float(fit.intercept))}; R² {r2:.3f} over {len(xs)} points"
    if intercept and fit.slope > 0 and fit.intercept < 0:
        measured += f"; a negative {intercept} is no {intercept}"
        near = fit.intercept + Z * fit.intercept_stderr >= 0
        why = f"the fitted {intercept} is below 0" + (
            ", though 0 is within its 95 % interval: too small to tell at these sizes"
            if near
            else ", beyond its 95 % interval: the line does not hold down to the smallest sizes"
        )
        return outcome(measured, UNDERPOWERED, why + "; measure more small sizes, or more samples of each")
    if fit.slope > 0 and r2 >= min_r2:
        return outcome(measured, VALID)
    why = "the slope is not positive" if fit.slope <= 0 else f"the line explains only {r2:.0%} of the variance"
    return refute_or_doubt(outcome, measured, why, doubt)
