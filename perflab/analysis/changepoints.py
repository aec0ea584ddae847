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

Before the recursion, ``_certified`` tries to show which segments it would find without it: a
DP over a grid of candidate medians, n x (a few hundred) steps where PELT, pruning nothing on a
series without change, takes n^2 / 2; it answers only where the best segmentation wins by more
than any rounding, else the recursion runs as before.
"""

from __future__ import annotations

import math

import numpy as np


def _quantized(signal: np.ndarray) -> tuple[np.ndarray, float]:
    """The values as integers about their median, and the scale (a power of two: exact) that
    keeps any sum of them below 2^62: the values whose costs PELT compares."""
    values = np.asarray(signal, float).ravel()
    centred = values - np.median(values)
    largest = max(float(np.abs(centred).max(initial=0.0)), 1.0)
    scale = 2.0 ** min(60, math.floor(math.log2(2.0**62 / (len(values) + 1) / largest)))
    return np.rint(centred * scale).astype(np.int64), scale


class L1Costs:
    """The L1 cost (sum of absolute deviations from the median) of any segments of ``signal``."""

    def __init__(self, signal: np.ndarray) -> None:
        q, self.scale = _quantized(signal)
        self.values = q  # in the series' order
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
        self._from: tuple[int, np.ndarray] = (-1, q[:0])

    def from_start(self, a: int) -> np.ndarray:
        """The cost of ``a:s`` for every end ``s`` from ``a`` on (integer units; 0 before ``a``): the
        last start asked is kept, as the blocks of a series without change ask the same one."""
        if self._from[0] != a:
            ends = np.arange(a, len(self.values) + 1)
            self._from = (a, np.concatenate((np.zeros(a, np.int64), self.units(np.full(len(ends), a), ends)[0])))
        return self._from[1]

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

    def units(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The cost of each segment ``starts[i]:ends[i]`` (0 where it is empty) in integer units,
        and its upper median (a median: the cost is the sum of distances to it)."""
        starts, ends = np.broadcast_arrays(np.asarray(starts, np.int64), np.asarray(ends, np.int64))
        starts, ends = starts.ravel(), np.maximum(ends, starts).ravel()
        m = ends - starts
        whole = self.prefix[ends] - self.prefix[starts]
        below, middle = self.lower_half(starts, ends)
        return np.where(m > 0, whole - 2 * below - np.where(m % 2 == 1, middle, 0), 0), middle

    def __call__(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The cost of each segment ``starts[i]:ends[i]`` (0 where it is empty): its sum less
        the sums of its ceil(m/2) and floor(m/2) smallest values."""
        return self.units(starts, ends)[0] / self.scale


BLOCK = 64  # ends whose costs are asked together: numpy's per-call cost spread over many segments
FEW = 4 * BLOCK  # starts below which every cost is asked (bounds cost more than they save)
PAIRS = 1 << 22  # segments asked at once at most (memory: a few arrays of this many integers)


def pelt_l1(signal: np.ndarray, penalty: float, min_size: int = 2) -> list[int]:
    """The ends of the segments of the least penalised L1 cost (the last is ``len(signal)``),
    by ruptures' recursion: each end's best start among the admissible ones (the first of equal
    totals), a start kept while its total is within ``penalty`` of the end's best.

    Ends are taken ``BLOCK`` at a time, from ``p``, the block's first end. A start ``t`` before
    ``p`` has, for each end ``s`` of the block, integer bounds on its cost from its cost up to
    ``p`` alone: C(t, p) + C(p, s) <= C(t, s) (splitting a segment never costs more), C(t, s)
    <= C(t, p) + the distances of ``p:s``'s values to ``t:p``'s median (a point no better than
    the median) and C(t, s) <= C(a, s) - C(a, t) (``_bounds``). Totals are monotone in the
    cost (float sums are), so a start whose lower bound is above the best upper bound is not
    the end's best, one whose lower bound is past the end's limit is dropped, one whose upper
    bound is within it is kept: as ruptures decides, on the same floats. Only the starts the
    bounds leave undecided get their exact cost: on a series with no change, where no start
    is ever dropped, a tenth of them. A block's ends are decided together (``_whole_block``)
    unless a start of the block or one dropped in it might decide one (near a change): then
    one after the other (``_end_by_end``)."""
    n = len(signal)
    min_size = max(min_size, 2)  # ruptures' L1 cost needs two values
    certain = _certified(signal, penalty, min_size)
    if certain is not None:
        return certain
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
        low, high, exact = _bounds(costs, starts, ends, best, start_of, penalty)  # rows: ends, columns: starts
        opened = np.full(len(starts), -1)  # the row (end) from which each start is admissible; -1: before the block
        opened[np.searchsorted(starts, new[opens])] = np.flatnonzero(opens)
        alive = _whole_block(costs, starts, ends, opened, low, high, exact, best, start_of, penalty)
        if alive is None:  # a start of the block or one dropped in it decides an end: end by end
            alive = _end_by_end(costs, starts, ends, opened, low, high, exact, best, start_of, penalty)
        admissible = starts[alive]
    ends_found, at = [], n
    while at > 0:
        ends_found.append(at)
        at = int(start_of[at])
    return ends_found[::-1]


SEGMENTS = 16  # segments at most that _certified checks (more changes: PELT prunes, and is quick)
CELLS = 1 << 23  # subjects x candidate medians at most for _certified (memory: 8 bytes each, a few arrays)


def _certified(signal: np.ndarray, penalty: float, min_size: int) -> list[int] | None:
    """The segments pelt_l1 finds, where the least penalised segmentation wins by more than
    rounding can undo; None where that is not shown (then the recursion decides).

    Why it is sound. With m a median of the whole series, a segmentation's cost is C(0, n) less
    its segments' gains g(S) = max_c sum_{x in S} (|x - m| - |x - c|) (a concave function of c,
    its max at S's median): the best segmentation maximises F, its gains less a penalty each.
    On a grid of distinct values (``_grid``), the max over c in [a, b] is at most the larger of
    the sum at a and its tangent at b (exact where no value lies inside): both sums over S, so
    F's upper bound is a DP over ends whose inner max runs over these columns as numpy vectors.
    It runs on PELT's own integers (``_quantized``) made 2^k coarser so every sum stays below
    2^52 (exact in floats). Backwards from n, each end e's best start b, its gains exact along
    the chain, must beat every other start's bound by ``delta`` (the coarsening's 6n units plus
    a bound of PELT's float rounding): then the recursion's totals, each within rounding of an
    exact one, pick b at e, and b was kept until e: a start dropped at an end s would make the
    best segmentation of [0, s) followed by s:e better than b's, a contradiction where s:e is
    long enough to be a segment, and checked directly (F(s) against b's total) for the ends s
    within min_size of e."""
    n = len(signal)
    if n < 2 * min_size or not math.isfinite(penalty) or penalty < 0:
        return None
    q, scale = _quantized(signal)
    beta = penalty * scale  # exact: scale is a power of two
    big, k = int(np.abs(q).max()), 0
    while k <= 62 and 32 * (n * ((big >> k) + 1) + beta / 2.0**k) >= 2.0**52:  # its sums: < 16 n max|x| + 17 pen
        k += 1
    if k > 62:  # a penalty of 2^52 times the values' range, or more
        return None
    x = (q >> k).astype(float)  # PELT's values, 2^k coarser: each moves less than one unit
    pen = math.floor(beta / 2.0**k)  # no more than the penalty: the gains' bounds stay bounds
    spread = n * (float(x.max() - x.min()) + 4) * 2.0**k / scale + penalty  # above any total that matters
    delta = 6 * n + (n + 2) * 2.0**-48 * spread * scale / 2.0**k
    m = np.sort(x)[(n - 1) // 2]
    values, counts = np.unique(x, return_counts=True)
    below = np.concatenate(([0], np.cumsum(counts)))  # the values (repeats counted) below each distinct one
    at = _grid(values, below, max(1, math.isqrt(n) // 2), pen / 8)
    grid = values[at]
    bent = np.flatnonzero(below[at[1:]] > below[at[:-1] + 1])  # intervals with values inside: g bends there
    if n * (len(at) + len(bent)) > CELLS:
        return None
    gains = np.zeros((n + 1, len(grid) + len(bent)))  # [t, column]: the column's sum over x[:t]
    at_grid, tangent = gains[1:, : len(grid)], gains[1:, len(grid) :]
    np.subtract(np.abs(x - m)[:, None], np.abs(x[:, None] - grid[None, :]), out=at_grid)  # |x_i - m| - |x_i - a|
    if len(bent):  # the tangents at each interval's right end: slope +1 a value above a, -1 a value not
        width = grid[bent + 1] - grid[bent]
        np.add(at_grid[:, bent], np.where(x[:, None] > grid[None, bent], width, -width), out=tangent)
    np.cumsum(gains[1:], axis=0, out=gains[1:])
    best = np.full(n + 1, -np.inf)  # F's upper bound over [0, s); -inf where no segmentation
    best[0] = 0.0
    reach = np.full(gains.shape[1], -np.inf)  # each column's max over the starts so far of F(t) - gains[t]
    block = np.empty((min_size, gains.shape[1]))
    for s in range(min_size, n + 1, min_size):  # min_size ends at once: their starts all precede s
        e = min(s + min_size, n + 1)
        rows = block[: e - s]  # row j: the starts up to s + j - min_size, for the end s + j
        np.subtract(best[s - min_size : e - min_size, None], gains[s - min_size : e - min_size], out=rows)
        np.maximum(rows[0], reach, out=rows[0])
        for i in range(1, len(rows)):
            np.maximum(rows[i], rows[i - 1], out=rows[i])
        reach[:] = rows[-1]
        rows += gains[s:e]
        best[s:e] = rows.max(axis=1) - pen
    chain, others, end = [n], [], n  # backwards: each end's best start and the best bound of its others
    while end > 0 and len(chain) <= SEGMENTS:  # chain: the ends found, n first
        totals = best[: end - min_size + 1] + (gains[end] - gains[: end - min_size + 1]).max(axis=1)
        end = int(np.argmax(totals))
        totals[end] = -np.inf
        chain.append(end)
        others.append(totals.max())
    if end > 0:
        return None
    chain.reverse()
    exact = 0.0  # F along the chain, exactly: each segment's gain at its own median
    for j in range(1, len(chain)):
        b, e = chain[j - 1], chain[j]
        near = np.arange(max(b + min_size, e - min_size + 1), e + 1)  # e, and the ends where dropping b is checked
        segments = [x[b:s] for s in near]
        gain = np.array([np.abs(y - m).sum() - np.abs(y - np.sort(y)[(len(y) - 1) // 2]).sum() for y in segments])
        if not exact + gain[-1] - others[-j] > delta:  # b, the best start of e by far
            return None
        if not (exact + gain[:-1] - best[near[:-1]] > delta).all():  # b kept at the ends just before e
            return None
        exact += gain[-1] - pen
    return chain[1:]


def _grid(values: np.ndarray, below: np.ndarray, step: int, budget: float) -> np.ndarray:
    """Indexes of the distinct ``values`` (sorted; ``below``: how many values precede each) that
    _certified takes as medians: every ``step``-th, the last, and every one of an interval where
    a tangent may be loose by more than twice ``budget`` (its width times the values inside)."""
    keep = np.zeros(len(values), bool)
    keep[::step] = keep[-1] = True
    at = np.flatnonzero(keep)
    loose = (values[at[1:]] - values[at[:-1]]) * (below[at[1:]] - below[at[:-1] + 1]) > budget
    for i in np.flatnonzero(loose):
        keep[at[i] : at[i + 1]] = True
    return np.flatnonzero(keep)


def _whole_block(
    costs: L1Costs,
    starts: np.ndarray,
    ends: np.ndarray,
    opened: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    exact: np.ndarray,
    best: np.ndarray,
    start_of: np.ndarray,
    penalty: float,
) -> np.ndarray | None:
    """Every end of the block at once (the starts still admissible after it), as the recursion
    decides them, from the starts before the block and as if none were dropped within it; None
    where that is not the recursion's answer: an end whose best start was dropped at an earlier
    end of the block, or whose best might be a start within the block (set by the block's own
    ends). Then each end's best is the least total over its starts, the first of equal ones,
    and each start's drop its own total against the end's limit: the same floats as end by end."""
    p, n_ends = int(ends[0]), len(ends)
    far = int(np.searchsorted(starts, p))  # starts[:far] are before p: their best is known
    before = best[starts[:far]]
    lows = before + (low[:, :far] + penalty)
    highs = before + (high[:, :far] + penalty)
    late = [(i, int(opened[i])) for i in np.flatnonzero(opened[:far] > 0)]  # new starts of the block's first ends
    for i, j in late:
        lows[:j, i] = highs[:j, i] = np.inf  # not a start before its opening
    top = highs.min(axis=1, keepdims=True)
    if np.isinf(top).any():
        return None
    r, c = np.nonzero(lows <= top)  # every start that may be an end's best (columns ascending in each row)
    totals = before[c] + (_exact_at(costs, exact, starts, ends, r, c) + penalty)
    order = np.lexsort((totals, r))  # stable: the first of equal totals first
    first = order[np.r_[True, r[order][1:] != r[order][:-1]]]  # each row's (each has one: its top's start)
    if len(first) != n_ends:
        return None
    found, at = totals[first], c[first]
    limit = found + penalty
    drop = lows > limit[:, None]
    r, c = np.nonzero(highs > limit[:, None])
    unsure = ~drop[r, c]
    r, c = r[unsure], c[unsure]  # as ruptures keeps a start: its total within the limit
    drop[r, c] = ~(before[c] + (_exact_at(costs, exact, starts, ends, r, c) + penalty) <= limit[r])
    for i, j in late:
        drop[:j, i] = False
    dropped = drop.any(axis=0)
    first_drop = np.where(dropped, drop.argmax(axis=0), n_ends)
    if (first_drop[at[1:]] < np.arange(1, n_ends)).any():  # an end's best was dropped before it
        return None
    best[ends], start_of[ends] = found, starts[at]
    valid = opened[None, far:] <= np.arange(n_ends)[:, None]  # the block's own starts, from their opening on
    own = best[starts[far:]] + (exact[:, far:] + penalty)  # their totals, now that their best is known
    if (valid & (own < found[:, None])).any():  # (an equal total is no better: the far start comes first)
        return None
    return ~np.concatenate((dropped, (valid & (own > limit[:, None])).any(axis=0)))


def _end_by_end(
    costs: L1Costs,
    starts: np.ndarray,
    ends: np.ndarray,
    opened: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    exact: np.ndarray,
    best: np.ndarray,
    start_of: np.ndarray,
    penalty: float,
) -> np.ndarray:
    """The block's ends one after the other, as the recursion takes them (the starts still admissible after it)."""
    alive = opened < 0
    best_of = best[starts]  # each start's best total: before the block, or at its opening (before its ends)
    for j, end in enumerate(ends.tolist()):
        opening = np.flatnonzero(opened == j)
        alive[opening] = True
        best_of[opening] = best[starts[opening]]
        where = np.flatnonzero(alive)
        before = best_of[where]
        lows = before + (low[j, where] + penalty)
        highs = before + (high[j, where] + penalty)
        maybe = lows <= highs.min()  # every start that may be the best (the first of equal totals among them)
        totals = before[maybe] + (_exact(costs, exact[j], starts, where[maybe], end) + penalty)
        i = int(np.argmin(totals))
        best[end], start_of[end] = totals[i], starts[where[maybe][i]]
        limit = best[end] + penalty
        drop = lows > limit
        unsure = ~drop & (highs > limit)
        if unsure.any():  # as ruptures keeps a start: its total within the limit
            cost = _exact(costs, exact[j], starts, where[unsure], end)
            drop[unsure] = ~(before[unsure] + (cost + penalty) <= limit)
        alive[where[drop]] = False
    return alive


def _bounds(
    costs: L1Costs, starts: np.ndarray, ends: np.ndarray, best: np.ndarray, start_of: np.ndarray, penalty: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lower and upper bounds of the cost of each start (column; ascending) to each end of the
    block (row; consecutive from ``p``), and the exact costs known (NaN: not asked yet): those
    of the starts from ``p`` on (a block's few) and of every start at ``p``."""
    p = int(ends[0])
    far = int(np.searchsorted(starts, p))  # starts[:far] are before p
    exact = np.full((len(ends), len(starts)), np.nan)
    few = far <= FEW  # pruning keeps few starts (a series that changes): every cost costs less than bounds
    rows, cols = np.nonzero(starts[None, 0 if few else far :] < ends[:, None])  # each start's ends after it
    cols += 0 if few else far
    exact[rows, cols] = costs.units(starts[cols], ends[rows])[0] / costs.scale
    if few:
        return exact, exact, exact
    low, high = exact.copy(), exact.copy()
    base, median = costs.units(starts[:far], np.full(far, p))
    tail = costs.units(np.full(len(ends), p), ends)[0]
    spread = np.zeros((len(ends), far), np.int64)  # distances of p:end's values to each start's median
    np.cumsum(np.abs(costs.values[p : int(ends[-1]), None] - median[None, :]), axis=0, out=spread[1:])
    low[:, :far] = (base[None, :] + tail[:, None]) / costs.scale
    upper = base[None, :] + spread
    # splitting never costs more, so C(t, s) <= C(a, s) - C(a, t) for a start a <= t: a, the
    # best start of the end before the block (on a series without change, 0; there this bound
    # is the cost itself wherever the split gains nothing)
    a = int(np.searchsorted(starts, start_of[p - 1]))
    if a < far:
        from_a = costs.from_start(int(starts[a]))
        whole = from_a[ends][:, None]
        split = from_a[starts[a:far]][None, :]
        np.minimum(upper[:, a:far], whole - split, out=upper[:, a:far])
    high[:, :far] = upper / costs.scale
    exact[0, :far] = low[0, :far]  # at p the bounds meet: C(t, p) itself
    return low, high, exact


def _exact_at(
    costs: L1Costs, exact: np.ndarray, starts: np.ndarray, ends: np.ndarray, r: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """The exact costs of the starts ``c`` (columns of ``exact``) to the ends ``r`` (its rows),
    those not known yet asked in one call (and kept in ``exact``)."""
    got = exact[r, c]
    missing = np.flatnonzero(np.isnan(got))
    if len(missing):
        got[missing] = costs.units(starts[c[missing]], ends[r[missing]])[0] / costs.scale
        exact[r[missing], c[missing]] = got[missing]
    return got


def _exact(costs: L1Costs, known: np.ndarray, starts: np.ndarray, at: np.ndarray, end: int) -> np.ndarray:
    """The exact costs of the starts ``at`` (columns of ``known``, an end's row) to ``end``,
    those not known yet asked now (and kept in ``known``)."""
    got = known[at]
    missing = np.isnan(got)
    if missing.any():
        got[missing] = costs.units(starts[at[missing]], np.full(int(missing.sum()), end))[0] / costs.scale
        known[at[missing]] = got[missing]
    return got
