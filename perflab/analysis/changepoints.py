"""Change points of a series: PELT with the L1 cost, as ruptures' ``Pelt(model="l1", jump=1)``
finds them, in numpy.

ruptures evaluates the cost of every admissible segment in Python (a median and a sum each);
on a series with no change PELT prunes nothing, so a series of n subjects costs n^2 / 2 such
calls: 6 s for 1,000 subjects. Here the same recursion asks, for each end, the costs of all its
admissible starts at once, from a wavelet matrix over the values' ranks: the L1 cost of a
segment of m values is its sum less the sums of its ceil(m/2) and floor(m/2) smallest values,
each read in log2(n) steps (both in one descent: they differ by the median alone). Values are
summed as integers (about the series' median, in the finest unit whose sums cannot overflow:
~2^-50 of the largest value for a thousand subjects), so equal values give equal costs exactly;
where two segmentations cost the same, the one whose last segment starts first is taken
(ruptures' float sums let rounding choose).
"""

from __future__ import annotations

import math

import numpy as np


class L1Costs:
    """The L1 cost (sum of absolute deviations from the median) of any segments of ``signal``."""

    def __init__(self, signal: np.ndarray) -> None:
        values = np.asarray(signal, float).ravel()
        centred = values - np.median(values)
        largest = max(float(np.abs(centred).max(initial=0.0)), 1.0)
        # a power of two (exact scaling) that keeps any sum of the values below 2^62
        self.scale = 2.0 ** min(60, math.floor(math.log2(2.0**62 / (len(values) + 1) / largest)))
        q = np.rint(centred * self.scale).astype(np.int64)
        self.prefix = np.concatenate(([0], np.cumsum(q)))
        rank = np.empty(len(q), np.int64)
        rank[np.argsort(q, kind="stable")] = np.arange(len(q))  # unique: one value a leaf
        self.levels: list[tuple[np.ndarray, np.ndarray, int]] = []
        for bit in reversed(range(max(1, (len(q) - 1).bit_length()))):
            ones = (rank >> bit) & 1
            zeros = np.concatenate(([0], np.cumsum(ones == 0)))
            zero_sums = np.concatenate(([0], np.cumsum(np.where(ones == 0, q, 0))))
            self.levels.append((zeros, zero_sums, int(zeros[-1])))
            order = np.argsort(ones, kind="stable")  # this level's zeros first, each side in order
            rank, q = rank[order], q[order]
        self.leaves = q

    def lower_half(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each segment ``starts:ends`` (none empty), in one descent of the levels: the sum of
        its m // 2 smallest values and its (m // 2 + 1)-th smallest (its upper median), in
        integer units. The L1 cost needs both halves' sums, which differ by that value alone."""
        lo, hi = starts.copy(), ends.copy()
        k = (ends - starts) // 2 + 1  # the rank sought: what lies below it is the lower half
        total = np.zeros(len(lo), np.int64)
        for zeros, zero_sums, n_zeros in self.levels:
            zl, zh = zeros[lo], zeros[hi]
            inside = zh - zl
            right = k > inside  # the segment's zeros here are all below the rank sought
            total += np.where(right, zero_sums[hi] - zero_sums[lo], 0)
            k -= np.where(right, inside, 0)
            lo = np.where(right, lo + (n_zeros - zl), zl)
            hi = np.where(right, hi + (n_zeros - zh), zh)
        return total, self.leaves[np.minimum(lo, len(self.leaves) - 1)]

    def __call__(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The cost of each segment ``starts[i]:ends[i]`` (0 where it is empty): its sum less
        the sums of its ceil(m/2) and floor(m/2) smallest values."""
        starts, ends = np.broadcast_arrays(np.asarray(starts, np.int64), np.asarray(ends, np.int64))
        starts, ends = starts.ravel(), np.maximum(ends, starts).ravel()
        m = ends - starts
        whole = self.prefix[ends] - self.prefix[starts]
        below, middle = self.lower_half(starts, ends)
        cost = np.where(m > 0, whole - 2 * below - np.where(m % 2 == 1, middle, 0), 0)
        return cost / self.scale


BLOCK = 64  # ends whose costs are asked together: numpy's per-call cost spread over many segments
PAIRS = 1 << 22  # segments asked at once at most (memory: a few arrays of this many integers)


def pelt_l1(signal: np.ndarray, penalty: float, min_size: int = 2) -> list[int]:
    """The ends of the segments of the least penalised L1 cost (the last is ``len(signal)``),
    by ruptures' recursion: each end's best start among the admissible ones (the first of equal
    totals), a start kept while its total is within ``penalty`` of the end's best. The costs of
    ``BLOCK`` ends are asked at once, for every start admissible when the block begins (a start
    once dropped never returns)."""
    n = len(signal)
    min_size = max(min_size, 2)  # ruptures' L1 cost needs two values
    costs = L1Costs(signal)
    best = np.full(n + 1, np.nan)
    best[0] = 0.0
    start_of = np.zeros(n + 1, np.int64)
    admissible = np.array([], np.int64)
    first = min_size
    while first <= n:
        ends = np.arange(first, min(first + max(1, min(BLOCK, PAIRS // max(1, len(admissible)))), n + 1))
        first = int(ends[-1]) + 1
        new = ends - min_size
        opens = (new == 0) | (new >= min_size)  # a start where a partition of what precedes it ends
        starts = np.union1d(admissible, new[opens])
        block = costs(starts[:, None], ends[None, :]).reshape(len(starts), len(ends))
        # the admissible starts as a mask over ``starts`` (ascending, as the list was kept)
        alive = np.isin(starts, admissible, assume_unique=True)
        at_new = np.searchsorted(starts, new)
        best_of = best[starts]  # each start's best total: set before the block (a start precedes its ends)
        for j, end in enumerate(ends.tolist()):
            if opens[j]:
                alive[at_new[j]] = True
                best_of[at_new[j]] = best[new[j]]
            where = np.flatnonzero(alive)
            totals = best_of[where] + (block[where, j] + penalty)
            i = int(np.argmin(totals))
            best[end], start_of[end] = totals[i], starts[where[i]]
            alive[where[~(totals <= best[end] + penalty)]] = False  # as ruptures keeps a start
        admissible = starts[alive]
    ends_found, at = [], n
    while at > 0:
        ends_found.append(at)
        at = int(start_of[at])
    return ends_found[::-1]
