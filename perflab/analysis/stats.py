"""Is a difference real? A two-sided Mann-Whitney U test on the raw per-sample values of the
metric being compared (their logs: a change is a ratio), the Hodges-Lehmann estimate of the
ratio and the interval that inverts the same test: significance, the interval, the speedup
and the words come from one model and one metric, in its own direction (higher is better for
rates, lower for times), so they cannot disagree.

And could it have been seen? ``repeats_needed`` is how many samples a side would show a given
change (their spread, the Mann-Whitney test's smallest attainable p-value); ``fdr`` adjusts many
p-values together (Benjamini-Hochberg), so 40 unchanged points do not yield two "significant"
ones by chance."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

ALPHA = 0.05
MIN_SAMPLES = 3  # per side; with 3 a side the smallest possible p-value is 0.1
EXACT_UP_TO = 60  # samples in all
POWER = 0.8  # the chance a change of the detectable size is found (the usual 80 %)
MW_EFFICIENCY = 3 / math.pi  # Mann-Whitney's efficiency relative to the t-test on normal data (0.955)
IQR_TO_SIGMA = 1.349  # IQR / 1.349 estimates a normal distribution's standard deviation


def usable(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The values a ratio of medians and a log spread can use: finite and above 0 (a time or a
    rate; NaN, inf, 0 and negatives are damage, never a measurement). Callers say what they
    left out; the functions below drop it too, so that no input crashes them."""
    x = np.asarray(values, float)
    return x[np.isfinite(x) & (x > 0)]


@dataclass(frozen=True)
class Difference:
    p_value: float
    speedup: float  # > 1: better than the baseline, in the metric's own direction
    ci_low: float  # 95% interval of the speedup
    ci_high: float
    words: str
    alpha: float = ALPHA

    @property
    def significant(self) -> bool:
        return not math.isnan(self.p_value) and self.p_value < self.alpha


def compare_samples(
    base: Sequence[float] | np.ndarray,
    new: Sequence[float] | np.ndarray,
    *,
    higher_is_better: bool,
    alpha: float = ALPHA,
) -> Difference:
    """``new`` against ``base`` (raw samples of one metric): speedup, p-value, interval, words,
    all from one model, so that they cannot disagree: the Mann-Whitney test of the log samples,
    the Hodges-Lehmann estimate of the shift (the median of every log ratio new / base) and the
    interval that inverts the same test (every shift it would not reject at ``alpha``). The
    interval excludes 1 exactly when p < ``alpha``; with too few samples for any p below
    ``alpha`` (3 a side) it is unbounded."""
    a, b = usable(base), usable(new)
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        ratio = float(np.median(b) / np.median(a)) if len(a) and len(b) else math.nan
        return Difference(
            math.nan,
            ratio if higher_is_better else 1 / ratio,
            math.nan,
            math.nan,
            f"too few samples to test (need {MIN_SAMPLES} per side, have {len(a)} and {len(b)})",
        )
    a, b = _thinned(a), _thinned(b)
    shifts = np.sort(np.subtract.outer(np.log(b), np.log(a)), axis=None)
    distinct = len(np.unique(np.concatenate([a, b]))) == len(a) + len(b)
    p, c = _mann_whitney(shifts, len(a), len(b), distinct, alpha)
    estimate = float(np.median(shifts))
    low, high = (math.exp(shifts[c]), math.exp(shifts[-1 - c])) if c >= 0 else (0.0, math.inf)
    sign = 1 if higher_is_better else -1
    speedup = math.exp(sign * estimate)
    low, high = (low, high) if higher_is_better else (1 / high if high else math.inf, 1 / low if low else math.inf)
    if p >= alpha:
        return Difference(p, speedup, low, high, f"no significant difference (p={p:.2g})", alpha)
    size = f"{speedup:.3g}x faster" if speedup >= 1 else f"{1 / speedup:.3g}x slower"
    level = f"{100 * (1 - alpha):g}%"
    words = f"significant: {size} than the baseline (p={p:.2g}, {level} CI of the speedup {low:.3g}-{high:.3g})"
    return Difference(p, speedup, low, high, words, alpha)


MOST_SAMPLES = 2000  # a side's samples beyond this are thinned to evenly spaced order statistics


def _thinned(x: np.ndarray) -> np.ndarray:
    """At most ``MOST_SAMPLES`` of ``x``, evenly spaced in its order: every pairwise ratio of two
    sides is m x n values (4 million at this cap), and the quantiles they give barely move."""
    if len(x) <= MOST_SAMPLES:
        return x
    return np.sort(x)[np.linspace(0, len(x) - 1, MOST_SAMPLES).round().astype(int)]


def _mann_whitney(shifts: np.ndarray, m: int, n: int, distinct: bool, alpha: float) -> tuple[float, int]:
    """(p, c) of the two-sided Mann-Whitney test whose statistic U counts the positive ``shifts``:
    its p-value (a zero shift, a tie, counted against a change on either tail, as the interval
    that holds its end counts it), and the largest count ``c`` rejected at ``alpha`` on either tail
    (-1: none can be), so that the sorted ``shifts[c]`` .. ``shifts[-1 - c]`` is the interval of
    the shift that inverts the test. Exact for ``distinct`` samples up to ``EXACT_UP_TO``; else the
    normal approximation with a continuity correction. Both from the same null distribution."""
    mn = m * n
    tail = int(min(np.count_nonzero(shifts > 0), np.count_nonzero(shifts < 0)) + np.count_nonzero(shifts == 0))
    if m + n <= EXACT_UP_TO and distinct:
        cdf = np.cumsum(_u_counts(m, n)) / math.comb(m + n, m)  # P(U <= k)
        p = min(1.0, 2 * float(cdf[min(tail, mn)]))
        c = int(np.searchsorted(cdf, alpha / 2, side="right")) - 1
        return p, c
    sigma = math.sqrt(mn * (m + n + 1) / 12)
    p = min(1.0, 2 * NormalDist().cdf(-max(0.0, mn / 2 - tail - 0.5) / sigma))
    c = math.ceil(mn / 2 - 0.5 - NormalDist().inv_cdf(1 - alpha / 2) * sigma) - 1
    return p, min(c, mn // 2 - 1)


@functools.cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many orderings of m against n distinct samples give each U = 0 .. m n: the exact null
    distribution of the Mann-Whitney statistic (its recursion on the largest sample)."""
    if not m or not n:
        return (1,)
    out = [0] * (m * n + 1)
    for k, count in enumerate(_u_counts(m - 1, n)):
        out[k + n] += count
    for k, count in enumerate(_u_counts(m, n - 1)):
        out[k] += count
    return tuple(out)


def smallest_p(m: int, n: int) -> float:
    """The smallest two-sided p-value a Mann-Whitney test of m against n samples can give:
    every sample of one side beyond every sample of the other, 2 / C(m+n, m) (3 a side: 0.1)."""
    return min(1.0, 2 / math.comb(m + n, m)) if m and n else 1.0


def _log_spread(a: np.ndarray, b: np.ndarray) -> float:
    """The pooled spread of both sides on a log scale (so a change is a ratio): each side's
    IQR / 1.349, robust to a stray sample, then the root mean square of the two."""

    def one(x: np.ndarray) -> float:
        q1, q3 = np.percentile(np.log(x), [25, 75])
        return float(q3 - q1) / IQR_TO_SIGMA

    return math.sqrt((one(a) ** 2 + one(b) ** 2) / 2)


def repeats_needed(
    base: Sequence[float] | np.ndarray,
    new: Sequence[float] | np.ndarray,
    pct: float,
    *,
    alpha: float = ALPHA,
    power: float = POWER,
) -> float:
    """Samples a side that would make a ``pct`` % change detectable: found by a two-sided
    Mann-Whitney test at level ``alpha`` with probability ``power``, at the spread these samples
    show. The minimal detectable change of m and n samples is

        MDC = 100 * (exp(d) - 1),   d = (z[1 - alpha/2] + z[power]) * s * sqrt(1/m + 1/n) / sqrt(3/pi)

    (s: the pooled spread of the log samples, each side's IQR / 1.349; 3/pi: the test's
    efficiency relative to the t-test), solved for m = n, and at least the smallest count whose
    attainable p-value (``smallest_p``) is below ``alpha``. Infinite for pct <= 0."""
    a, b = usable(base), usable(new)
    if not pct > 0 or len(a) < 2 or len(b) < 2:
        return math.inf
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    spread = _log_spread(a, b)
    n = math.ceil(2 * (z * spread / math.log1p(pct / 100)) ** 2 / MW_EFFICIENCY) if spread else 1
    n = max(n, MIN_SAMPLES)
    while smallest_p(n, n) > alpha:
        n += 1
    return n


def fdr(p_values: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values over all the tests of one comparison (what
    ``scipy.stats.false_discovery_control`` gives, tested against it: importing scipy.stats
    cost every compare and every look of perflab ab 1.3 s); NaN (no test) stays NaN and does
    not count. The i-th smallest of m p-values adjusts to the least of p_(j) m / j over j >= i."""
    p = np.asarray(p_values, float)
    out = np.full(len(p), math.nan)
    tested = np.flatnonzero(~np.isnan(p))
    if len(tested):
        order = tested[np.argsort(p[tested], kind="stable")]
        scaled = p[order] * len(order) / np.arange(1, len(order) + 1)
        out[order] = np.clip(np.minimum.accumulate(scaled[::-1])[::-1], 0, 1)
    return out
