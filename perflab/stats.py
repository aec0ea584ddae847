"""Is a difference real? Mann-Whitney U on raw samples and a bootstrap interval for the ratio
of medians: small, dependency-free versions of what scipy offers."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ALPHA = 0.05


@dataclass(frozen=True)
class Verdict:
    p_value: float
    ratio: float  # median(b) / median(a)
    ci_low: float
    ci_high: float
    words: str


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value: exact for small samples without ties, else the normal approximation."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return math.nan
    both = np.concatenate([x, y])
    ranks = _ranks(both)
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    u = min(u1, n1 * n2 - u1)
    ties = len(np.unique(both)) < len(both)
    if not ties and n1 + n2 <= 60:
        counts = _u_counts(n1, n2)
        return min(1.0, 2 * sum(counts[: int(math.floor(u)) + 1]) / sum(counts))
    _, tie_sizes = np.unique(both, return_counts=True)
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - (tie_sizes**3 - tie_sizes).sum() / (n * (n - 1))))
    if sigma == 0:
        return 1.0
    z = (abs(u1 - n1 * n2 / 2) - 0.5) / sigma
    return min(1.0, math.erfc(max(z, 0) / math.sqrt(2)))


def _ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):  # average ranks over ties
        tied = values == v
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


@functools.cache
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many orderings give each U (0 .. n1*n2) when the samples come from one distribution."""
    if n1 == 0 or n2 == 0:
        return (1,)
    size = n1 * n2 + 1
    with_last_from_x = (0,) * n2 + _u_counts(n1 - 1, n2)  # the largest value is x's: U grows by n2
    without = _u_counts(n1, n2 - 1)
    return tuple((with_last_from_x[i] if i < len(with_last_from_x) else 0)
                 + (without[i] if i < len(without) else 0) for i in range(size))


def compare_samples(a: Sequence[float], b: Sequence[float], *, seed: int = 0, rounds: int = 2000) -> Verdict:
    """Compare times ``b`` (seconds, lower is better) against the baseline's times ``a``."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    ratio = float(np.median(y) / np.median(x))
    if len(x) < 3 or len(y) < 3:
        return Verdict(math.nan, ratio, math.nan, math.nan, "too few samples to test (need 3 per side)")
    rng = np.random.default_rng(seed)
    boot = (np.median(rng.choice(y, (rounds, len(y))), axis=1) / np.median(rng.choice(x, (rounds, len(x))), axis=1))
    low, high = (float(v) for v in np.percentile(boot, [2.5, 97.5]))
    p = mann_whitney_p(x, y)
    speed = f"{1 / ratio:.3g}x faster" if ratio < 1 else f"{ratio:.3g}x slower"
    words = (f"significant: {speed} than the baseline (p={p:.2g}, 95% CI of the time ratio {low:.3g}-{high:.3g})"
             if p < ALPHA else f"no significant difference (p={p:.2g})")
    return Verdict(p, ratio, low, high, words)
