"""The verdicts of ``compare`` (A/B) and ``history``, their words and exit codes: in one place.

compare (and ab), per point of NEW against the same point of BASE, judged from per-process
figures (``perflab.analysis.replicates``; docs/compare.md says it at length):

  PASS          not significantly slower beyond the gate, and a change of the gate's size was
                detectable or the interval at a lone point's level excludes it; or significantly faster
  FAIL          significantly slower (Benjamini-Hochberg over all points) beyond the gate
  INCONCLUSIVE  neither (it says how many processes a side would do, none beyond 50); or measured
                on a busy machine (``busy``): never judged
  INCOMPARABLE  the machines' (or software's) identity differs: which fields (``--allow-mixed``
                judges them anyway, and says so)

An exact metric (``columns.EXACT``: instruction counts) has no distribution to test: it is
judged against ``EXACT_TOLERANCE_PCT``: FAIL beyond it more, PASS within or fewer, INCONCLUSIVE
where the counts themselves vary by more (between repeats or processes).

``judge`` computes every ``ComparedPoint``'s ``PointStats`` together (the FDR couples them);
``decide``, pure, turns a point's statistics and the ``Gate`` into its ``Decision``.

history, per change point of a series, by the same significance and gate (``label_step``):
``regression``, ``improvement``, ``suspicious``. Per series: a series long enough to judge
whose subjects are mostly flagged suspect (fewer clean ones than a change needs) cannot be
called unchanged: could not judge (3).

Exit codes (compare and history alike): 0 pass, 1 fail (a FAIL, a regression), 2 a usage
error, 3 could not judge (nothing matched, any point INCONCLUSIVE or INCOMPARABLE, too
little or too suspect history, a crash). A gate never passes by accident: judging nothing is
3, not 0; and a crash is never 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Iterable

from perflab.store.columns import EXACT

if TYPE_CHECKING:
    from perflab.analysis.floor import Floor
    from perflab.analysis.replicates import Change, Measured

PASS_EXIT = 0
FAIL_EXIT = 1
USAGE_EXIT = 2
UNJUDGED_EXIT = 3
DEFAULT_GATE_PCT = 10.0  # compare without --fail-if-slower: asv's default factor (1.1)
DEFAULT_STEP_PCT = 5.0  # history: a change smaller than this is suspicious at most
# An exact metric (instruction counts: columns.EXACT) is judged against this, whatever the gate:
# the same code counts within 0.4 % (64² torch.mm under callgrind), so more is more work.
EXACT_TOLERANCE_PCT = 1.0
_TOLERANCE = f"the {EXACT_TOLERANCE_PCT:g} % tolerance of an exact count"


class Verdict(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    INCOMPARABLE = "INCOMPARABLE"

    @property
    def exit_code(self) -> int:
        return {"PASS": PASS_EXIT, "FAIL": FAIL_EXIT}.get(self.value, UNJUDGED_EXIT)


class StepLabel(str, Enum):
    """history's label of a change point (``label_step``)."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SUSPICIOUS = "suspicious"


def exit_code(verdicts: Iterable[Verdict]) -> int:
    """One exit code for a comparison: 1 if any FAIL, else 3 if nothing was judged or any
    point was not (INCONCLUSIVE, INCOMPARABLE), else 0."""
    seen = set(verdicts)
    if Verdict.FAIL in seen:
        return FAIL_EXIT
    if not seen or seen - {Verdict.PASS}:
        return UNJUDGED_EXIT
    return PASS_EXIT


def history_exit_code(changes: Iterable[StepLabel], judged: bool, doubtful: bool = False) -> int:
    """1 if any regression, else 3 if no series had enough subjects to judge or a series had
    too few clean ones (``doubtful``: its subjects flagged suspect), else 0."""
    if StepLabel.REGRESSION in set(changes):
        return FAIL_EXIT
    return PASS_EXIT if judged and not doubtful else UNJUDGED_EXIT


DEBUG_ENV = "PERFLAB_DEBUG"  # set (to anything but 0): a crash of compare or history shows its traceback


def judging(prog: str, main: Callable[[], int]) -> int:
    """``main()``, a judge's command line, whose crash is exit 3 in one line (``could_not_judge``);
    a reader that went away (a closed pipe) ends the perflab command quietly."""
    try:
        return main()
    except BrokenPipeError:
        raise
    except Exception as err:  # damage no reader foresaw, or a bug: never exit 1, which means FAIL
        return could_not_judge(prog, err)


def could_not_judge(prog: str, err: BaseException) -> int:
    """A judge that crashed (damage no reader foresaw, a bug) says so in one line and exits 3,
    never 1: exit 1 means FAIL, and a crash is no evidence of a regression. The traceback goes
    to stderr only with ``PERFLAB_DEBUG=1``."""
    import os
    import sys
    import traceback

    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if debug:
        traceback.print_exception(err, file=sys.stderr)
    text = " ".join(str(err).split()) or "no message"
    hint = "" if debug else f"; {DEBUG_ENV}=1 shows the traceback"
    print(f"{prog}: could not judge: {type(err).__name__}: {text}{hint} -> exit {UNJUDGED_EXIT}", file=sys.stderr)
    return UNJUDGED_EXIT


def alpha_per_look(alpha: float, looks: int) -> float:
    """Bonferroni over a sequential run's scheduled looks (``perflab ab``): each tests at this,
    so a false FAIL over all of them has probability at most ``alpha``."""
    return alpha / max(1, looks)


def meaning(gate_pct: float, alpha: float, given: bool) -> str:
    """What a PASS means, in one line (printed under every comparison)."""
    where = "" if given else f" (the default gate; --fail-if-slower PCT sets it, {DEFAULT_GATE_PCT:g} % like asv)"
    return (
        f"PASS means: not significantly slower by more than {gate_pct:g} %{where}, with a change of that size "
        "detectable in the processes or their interval excluding one; significance at a false discovery rate "
        f"of {alpha:g} over all points "
        "(Benjamini-Hochberg). Exit codes: 0 pass, 1 fail, 2 usage error, 3 could not judge."
    )


@dataclass(frozen=True)
class Gate:
    """What a verdict is held to: the change a FAIL (history: a step) must exceed, in percent, the
    false discovery rate over all points (``--alpha``), and ``--allow-mixed``."""

    pct: float
    alpha: float
    allow_mixed: bool = False


@dataclass(frozen=True)
class ComparedPoint:
    """One point of NEW against the same point of BASE: what it is, its two sides and what its
    rows say of how they were measured."""

    experiment: str
    label: str  # the point's stable name (``comparison.dashboard_name``)
    metric: str  # the column judged (``cpu_median_s`` where a busy machine's wall times were not)
    base: Measured
    new: Measured
    higher: bool = True  # more of the metric is better (a rate), else less (a time, a count)
    identity: str = ""  # the machine identity fields whose values differ ("" none)
    busy: tuple[str, ...] = ()  # the sides measured on a busy machine: never judged
    suspect: str = ""  # why its rows were flagged suspect
    left_out: str = ""  # what was left out of its sides, in words


@dataclass(frozen=True)
class Counted:
    """An exact metric's change (no distribution to test): percent more NEW counts than BASE, and
    how much the counts vary (between repeats or processes; ``between_pct``: processes only)."""

    more_pct: float
    noise_pct: float
    between_pct: float
    base_processes: int
    new_processes: int

    def words(self, metric: str) -> str:
        return f"{abs(self.more_pct):.3g} % {'more' if self.more_pct > 0 else 'fewer'} {metric}"


@dataclass(frozen=True)
class PointStats:
    """What the processes say of a point, in the metric's better direction (``speedup`` above 1:
    NEW is better), its significance over every point judged with it, and the floor and level
    (alpha / (points x looks)) it was judged at."""

    speedup: float
    ci_low: float
    ci_high: float
    p_adjusted: float
    significant: bool
    change: Change | Counted
    floor: Floor | None = None
    level: float = math.nan

    def columns(self, metric: str) -> dict[str, Any]:
        """The table's columns of these statistics (compare's and ab's), in its order."""
        c, p_adj, yes = self.change, self.p_adjusted, self.significant
        out = {"speedup": self.speedup, "change_pct": 100 * (self.speedup - 1)}
        processes = {"base_processes": c.base_processes, "new_processes": c.new_processes}
        if isinstance(c, Counted):
            out |= processes | dict.fromkeys(("ci_low", "ci_high", "p_value", "p_adjusted"), math.nan)
            out |= {"detectable_pct": EXACT_TOLERANCE_PCT, "cv_between_pct": c.between_pct, "significant": yes}
            return out | {"significance": f"{c.words(metric)}: {'beyond' if yes else 'within'} {_TOLERANCE}"}
        out |= {"ci_low": self.ci_low, "ci_high": self.ci_high, "p_value": c.p_value, **processes}
        out |= {"cv_between_pct": 100 * c.spread.between if c.spread.measured else math.nan, "paired": c.paired}
        out |= {"cv_within_pct": 100 * c.spread.within, "detectable_pct": c.detectable_pct, "p_adjusted": p_adj}
        if math.isnan(p_adj):
            said = "nothing to test"
        elif yes:
            said = f"significant: {_size(self.speedup)} than the base (adjusted p={p_adj:.2g})"
        else:
            said = f"no significant difference (adjusted p={p_adj:.2g})"
        return out | {"significant": yes, "significance": said}


@dataclass(frozen=True)
class Decision:
    """A point's verdict and its reasons, the verdict's own first."""

    verdict: Verdict
    reasons: tuple[str, ...]

    @property
    def why(self) -> str:
        return "; ".join(self.reasons)


def significant(p_adjusted: float, alpha: float) -> bool:
    """Significance, for compare, ab and history alike: the adjusted p-value below alpha."""
    return not math.isnan(p_adjusted) and p_adjusted < alpha


def judge(
    points: list[ComparedPoint],
    gate_pct: float,
    alpha: float,
    allow_mixed: bool,
    floor: float | None = None,
    looks: int = 1,
    paired: bool = False,
) -> list[tuple[PointStats | None, Decision]]:
    """Each point's statistics (None: not tested, INCOMPARABLE) and ``decide``'s verdict, in
    order. Significance is adjusted over every tested point (Benjamini-Hochberg), after a
    Bonferroni correction over ``looks`` (perflab ab looks again as processes are added);
    detectability is at the level a lone changed point must meet, alpha / (points x looks).
    ``floor``: the between-process variation assumed where a side has one process (given:
    ``--process-cv``); else what the same experiment's points with two or more processes a side
    measured here, else ``replicates.FLOOR_CV`` (``perflab.analysis.floor``): the trees and the
    command line decide, nothing kept elsewhere."""
    from perflab.analysis import floor as floors
    from perflab.analysis import replicates
    from perflab.analysis.stats import fdr

    tested = [i for i, p in enumerate(points) if (allow_mixed or not p.identity) and not empty(p)]
    stats: dict[int, PointStats] = {i: _counted(points[i]) for i in tested if points[i].metric in EXACT}
    sampled = [i for i in tested if points[i].metric not in EXACT]
    level = alpha_per_look(alpha, looks) / max(1, len(sampled))
    sides = [(points[i].base, points[i].new) for i in sampled]
    measured: dict[str, list[tuple[float, int]]] = {}
    for i, spread in zip(sampled, replicates.between_each(sides)):
        measured.setdefault(points[i].experiment, []).append(spread)
    of_trees = {name: floors.measured(found) for name, found in measured.items()}
    found = {i: floors.given(floor) if floor is not None else of_trees[points[i].experiment] for i in sampled}
    cvs = [found[i].cv for i in sampled]  # every point's statistics at once: numpy over all their arrays
    changes = dict(zip(sampled, replicates.changes(sides, level=level, floors=cvs, paired=paired)))
    for i, p_adj in zip(sampled, fdr([min(1.0, changes[i].p_value * max(1, looks)) for i in sampled])):
        c, up = changes[i], points[i].higher
        ci = (c.ci_low, c.ci_high) if up else (1 / c.ci_high, 1 / c.ci_low)
        speedup = c.ratio if up else 1 / c.ratio
        stats[i] = PointStats(speedup, *ci, p_adj, significant(p_adj, alpha), c, found[i], level)
    gate = Gate(gate_pct, alpha, allow_mixed)
    return [(stats.get(i), decide(p, stats.get(i), gate)) for i, p in enumerate(points)]


def empty(point: ComparedPoint) -> bool:
    """Whether a side of the point holds nothing usable of its metric."""
    return math.isnan(point.base.value) or math.isnan(point.new.value)


def _counted(point: ComparedPoint) -> PointStats:
    """An exact metric's statistics (lower is better: counts): medians, and how much they vary."""
    import numpy as np

    base, new = point.base, point.new
    a, b = float(np.median(base.figures)), float(np.median(new.figures))
    within = [
        float(x)
        for side in (base, new)
        for x in side.rows.get(f"{point.metric}_spread_pct", [])
        if isinstance(x, (int, float)) and math.isfinite(x)
    ]
    between = [100 * float(np.ptp(s.figures)) / float(np.median(s.figures)) for s in (base, new) if s.n_processes > 1]
    more = 100 * (b / a - 1)
    c = Counted(more, max([*within, *between, 0.0]), max(between, default=math.nan), base.n_processes, new.n_processes)
    return PointStats(a / b, math.nan, math.nan, math.nan, abs(more) > EXACT_TOLERANCE_PCT, c)


def decide(point: ComparedPoint, stats: PointStats | None, gate: Gate) -> Decision:
    """A point's verdict and its reasons, from its statistics and the gate: the one place the
    rule lives (the module docstring says it in words). Pure: no I/O, nothing changed."""
    if empty(point):  # nothing of this point to judge on a side: said, never a pass
        sides = " and ".join(side for side, x in (("BASE", point.base), ("NEW", point.new)) if math.isnan(x.value))
        return Decision(Verdict.INCONCLUSIVE, (f"no usable {point.metric} in {sides} (left out {point.left_out})",))
    if point.identity and not gate.allow_mixed:
        return Decision(Verdict.INCOMPARABLE, (f"machine identity differs: {point.identity}",))
    if stats is None:
        raise ValueError("a point to judge needs its statistics: verdicts.judge computes them")
    if isinstance(stats.change, Counted):
        return _decide_counted(point.metric, stats.change)
    c, f, gate_pct, p_adj = stats.change, stats.floor, gate.pct, stats.p_adjusted
    assert f is not None, "a sampled point's statistics carry their floor"
    size, detectable = _size(stats.speedup), c.detectable_pct
    why: list[str] = []
    if stats.significant and slower_pct(stats.speedup) > gate_pct:
        verdict = Verdict.FAIL
        why.append(f"{size}: beyond the {gate_pct:g} % gate (adjusted p={p_adj:.2g})")
    elif detectable <= gate_pct or (stats.significant and stats.speedup >= 1) or _within(stats, gate_pct):
        # a change of the gate's size was detectable, it got significantly faster, or the
        # interval at this level excludes a slowdown beyond the gate (equivalent within it)
        verdict = Verdict.PASS
        seen = size if stats.significant else "no significant change"
        if stats.significant and stats.speedup >= 1 and detectable > gate_pct:
            why.append(f"{size}, significantly (adjusted p={p_adj:.2g})")
        elif detectable > gate_pct:
            why.append(f"{seen}; at most {_slowest(stats):.2g} % slower at this level: within the {gate_pct:g} % gate")
        else:
            why.append(f"{seen}; a {detectable:.2g} % change was detectable")
    else:
        verdict = Verdict.INCONCLUSIVE
        why.append(_inconclusive(point, stats, gate_pct))
    if not c.spread.measured and c.spread.between > f.cv:
        why.append(
            f"one process a side: the between-process variation is unknown, judged against "
            f"{100 * c.spread.between:.2g} %, what the samples' own spread makes a median vary by "
            "(bench.processes=K or perflab ab measure it)"
        )
    elif not c.spread.measured:
        why.append(
            f"one process a side: the between-process variation is unknown, judged against a floor of "
            f"{100 * f.cv:.2g} % ({f.source}; bench.processes=K or perflab ab measure it)"
        )
    if point.identity:
        why.append(f"compared across identities on purpose (--allow-mixed): {point.identity}")
    if point.busy:  # evidence a busy machine made is never judged, whatever it shows
        verdict = Verdict.INCONCLUSIVE
        sides = " and ".join(point.busy)
        why.insert(
            0,
            f"not judged: {sides} measured on a busy machine (see suspect); measure again where it is quiet, "
            "or with perflab ab, which measures such processes again",
        )
    elif point.suspect:
        why.append("its measurements were flagged suspect: see suspect")
    return Decision(verdict, tuple(why))


def _decide_counted(metric: str, c: Counted) -> Decision:
    """An exact metric against ``EXACT_TOLERANCE_PCT``: FAIL beyond it more, PASS within or
    fewer, INCONCLUSIVE where the counts themselves vary by more."""
    tol, words = _TOLERANCE, c.words(metric)
    if c.noise_pct > EXACT_TOLERANCE_PCT:
        why = f"{words}, but the counts vary by {c.noise_pct:.2g} % (between repeats or processes): more than {tol}"
        return Decision(Verdict.INCONCLUSIVE, (why,))
    if c.more_pct > EXACT_TOLERANCE_PCT:
        return Decision(Verdict.FAIL, (f"{words}: beyond {tol} (counts vary by {c.noise_pct:.2g} %)",))
    within = "within" if c.more_pct >= -EXACT_TOLERANCE_PCT else "beyond"
    return Decision(Verdict.PASS, (f"{words}: {within} {tol}",))


def label_step(p_adjusted: float, change_pct: float, worse: bool, gate: Gate) -> StepLabel:
    """history's label of a change point, by decide's rule for a FAIL (significant, and beyond
    the gate) each way: ``regression`` where it is significant and worse by at least the gate's
    percent, ``improvement`` the same better, else ``suspicious``."""
    if significant(p_adjusted, gate.alpha) and abs(change_pct) >= gate.pct:
        return StepLabel.REGRESSION if worse else StepLabel.IMPROVEMENT
    return StepLabel.SUSPICIOUS


def slower_pct(speedup: float) -> float:
    """How much slower in percent a change is, as the gate reads it: the time (a rate's time per
    item) over the base's, minus one (asv's factor 1 + gate/100). A 10 % gate fails a 1.10x
    slower point; read as a speedup of 0.9 it would need 1.11x."""
    return 100 * (1 / speedup - 1) if speedup > 0 else math.inf


def _slowest(stats: PointStats) -> float:
    """The largest slowdown in percent (new's time over base's) the change's interval at the
    look's level allows (``replicates.Change.margin``)."""
    assert not isinstance(stats.change, Counted)
    return 100 * math.expm1(stats.change.margin - math.log(stats.speedup))


def _within(stats: PointStats, gate_pct: float) -> bool:
    """Whether the interval at the look's level excludes a slowdown beyond the gate."""
    return math.isfinite(stats.speedup) and stats.speedup > 0 and _slowest(stats) <= gate_pct


def said_once(decisions: list[Decision]) -> tuple[list[str], list[str]]:
    """The reasons every decision of two or more gives, to be said once (``every point: ...``),
    and each decision's ``why`` without them."""
    whys = [d.reasons for d in decisions]
    shared = [w for w in whys[0][1:] if all(w in x[1:] for x in whys)] if len(whys) >= 2 else []
    # never a point's first reason: its verdict's own
    return [f"every point: {w}" for w in shared], ["; ".join(w for w in x if w not in shared) for x in whys]


def _size(speedup: float) -> str:
    if math.isnan(speedup):
        return "change unknown"
    return f"{speedup:.3g}x faster" if speedup >= 1 else f"{1 / speedup:.3g}x slower"


def _inconclusive(point: ComparedPoint, stats: PointStats, gate_pct: float) -> str:
    """Why a point is not judged, and what would judge it: processes, bounded."""
    from perflab.analysis import replicates

    c = stats.change
    assert not isinstance(c, Counted) and stats.floor is not None
    if not c.base_processes or not c.new_processes:
        return f"no usable {point.metric} to test" + (f" (left out {point.left_out})" if point.left_out else "")
    have = f"have {c.base_processes} and {c.new_processes} process(es)"
    need = replicates.processes_needed(c, gate_pct, stats.level, stats.floor.cv)
    cv = f"between-process variation {100 * max(c.spread.between, 0):.2g} %"
    if need is None:
        return (
            f"no affordable number of processes shows a change of {gate_pct:g} % ({cv}; {have}; "
            f"more than {replicates.MOST_PROCESSES} a side would be needed)"
        )
    shown = c.detectable_pct
    if math.isinf(shown):
        could = "no change at all"
    elif shown > 900:  # two processes a side can give 7.9e+07 %: no number to read
        could = "only changes of more than 10x"
    else:
        could = f"only changes above {shown:.2g} %"
    return (
        f"these processes could show {could}, not {gate_pct:g} % ({have}, {cv}): about {need} a side would do "
        f"(bench.processes={need}, or perflab ab)"
    )


def json_verdict(code: int, verdicts: Iterable[str]) -> str:
    """The verdict of a whole comparison as one of the four documented ones: FAIL and PASS by
    their exit codes; else INCOMPARABLE when every unjudged point is, INCONCLUSIVE otherwise."""
    if code in (PASS_EXIT, FAIL_EXIT):
        return "PASS" if code == PASS_EXIT else "FAIL"
    seen = set(verdicts) - {Verdict.PASS.value}
    return Verdict.INCOMPARABLE.value if seen == {Verdict.INCOMPARABLE.value} else Verdict.INCONCLUSIVE.value
