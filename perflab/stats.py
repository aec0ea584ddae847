"""Is a difference real? scipy.stats does the statistics: a two-sided Mann-Whitney U test on
the raw per-sample values of the metric being compared, and a bootstrap interval for the
ratio of their medians. Ratio, speedup and the words all come from that one metric, in its
own direction (higher is better for rates, lower for times), so they cannot disagree."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ALPHA = 0.05
MIN_SAMPLES = 3  # per side; with 3 a side the smallest possible p-value is 0.1
EXACT_UP_TO = 60  # samples in all


@dataclass(frozen=True)
class Verdict:
    p_value: float
    speedup: float  # > 1: better than the baseline, in the metric's own direction
    ci_low: float  # 95% interval of the speedup
    ci_high: float
    words: str

    @property
    def significant(self) -> bool:
        return not math.isnan(self.p_value) and self.p_value < ALPHA


def compare_samples(
    base: Sequence[float] | np.ndarray,
    new: Sequence[float] | np.ndarray,
    *,
    higher_is_better: bool,
    seed: int = 0,
    resamples: int = 2000,
) -> Verdict:
    """``new`` against ``base`` (raw samples of one metric): speedup, p-value, interval, words."""
    from scipy import stats

    a, b = np.asarray(base, float), np.asarray(new, float)
    ratio = float(np.median(b) / np.median(a))
    speedup = ratio if higher_is_better else 1 / ratio
    if len(a) < MIN_SAMPLES or len(b) < MIN_SAMPLES:
        return Verdict(
            math.nan,
            speedup,
            math.nan,
            math.nan,
            f"too few samples to test (need {MIN_SAMPLES} per side, have {len(a)} and {len(b)})",
        )
    # The exact distribution while it is cheap and there are no ties; the normal approximation beyond.
    exact = len(a) + len(b) <= EXACT_UP_TO and len(np.unique(np.concatenate([a, b]))) == len(a) + len(b)
    p = float(stats.mannwhitneyu(a, b, alternative="two-sided", method="exact" if exact else "asymptotic").pvalue)
    ci = stats.bootstrap(
        (a, b),
        _median_ratio,
        vectorized=True,
        paired=False,
        n_resamples=resamples,
        method="percentile",
        random_state=np.random.default_rng(seed),
    ).confidence_interval
    low, high = (ci.low, ci.high) if higher_is_better else (1 / ci.high, 1 / ci.low)
    if p >= ALPHA:
        return Verdict(p, speedup, low, high, f"no significant difference (p={p:.2g})")
    size = f"{speedup:.3g}x faster" if speedup >= 1 else f"{1 / speedup:.3g}x slower"
    words = f"significant: {size} than the baseline (p={p:.2g}, 95% CI of the speedup {low:.3g}-{high:.3g})"
    return Verdict(p, speedup, low, high, words)


def _median_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(b, axis=axis) / np.median(a, axis=axis)
