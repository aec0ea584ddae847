"""The verdicts of ``compare`` (A/B) and ``history``, their words and exit codes: in one place.

compare (and ab), per point of NEW against the same point of BASE, judged from per-process
figures (``perflab.analysis.replicates``):

  PASS          not significantly slower by more than the gate, and the processes could have
                shown a change of the gate's size (the smallest change they could show, at
                this between-process spread and count, is within the gate); or significantly faster;
                or equivalent: the change's interval at the level a lone point must meet
                excludes a slowdown beyond the gate (an A/A run decided before it could
                detect the gate's size)
  FAIL          significantly slower (Benjamini-Hochberg over all points) by more than the gate
  INCONCLUSIVE  neither: the smallest change the processes could show exceeds the gate; the
                verdict says how many processes a side would do (bounded: none beyond 50); or
                the point's rows were measured on a busy machine (``busy``): never judged
  INCOMPARABLE  the rows come from machines (or software) whose identity differs; the
                verdict names the fields (``--allow-mixed`` judges them anyway, and says so)

An exact metric (``columns.EXACT``: instruction counts) is no sample of a distribution: the same
code on the same software counts the same whatever the load, so there is nothing to test or
resample. It is judged against ``EXACT_TOLERANCE_PCT``: FAIL beyond it more, PASS within or
fewer, INCONCLUSIVE where the counts themselves vary by more (between repeats or processes).

history, per change point of a series: ``regression``, ``improvement``, ``suspicious``.

history, per series: a series long enough to judge whose subjects are mostly flagged suspect
(fewer clean ones than a change needs) cannot be called unchanged: could not judge (3).

Exit codes (compare and history alike): 0 pass, 1 fail (a FAIL, a regression), 2 a usage
error, 3 could not judge (nothing matched, any point INCONCLUSIVE or INCOMPARABLE, too
little or too suspect history, a crash). A gate never passes by accident: judging nothing is
3, not 0; and a crash is never 1.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Iterable

PASS_EXIT = 0
FAIL_EXIT = 1
USAGE_EXIT = 2
UNJUDGED_EXIT = 3
DEFAULT_GATE_PCT = 10.0  # compare without --fail-if-slower: asv's default factor (1.1)
DEFAULT_STEP_PCT = 5.0  # history: a change smaller than this is suspicious at most
# An exact metric (instruction counts: columns.EXACT) is judged against this, whatever the gate:
# the same code counts within 0.4 % (64² torch.mm under callgrind), so more is more work.
EXACT_TOLERANCE_PCT = 1.0


class Verdict(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    INCOMPARABLE = "INCOMPARABLE"

    @property
    def exit_code(self) -> int:
        return {"PASS": PASS_EXIT, "FAIL": FAIL_EXIT}.get(self.value, UNJUDGED_EXIT)


class Change(str, Enum):
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


def history_exit_code(changes: Iterable[Change], judged: bool, doubtful: bool = False) -> int:
    """1 if any regression, else 3 if no series had enough subjects to judge or a series had
    too few clean ones (``doubtful``: its subjects flagged suspect), else 0."""
    if Change.REGRESSION in set(changes):
        return FAIL_EXIT
    return PASS_EXIT if judged and not doubtful else UNJUDGED_EXIT


DEBUG_ENV = "PERFLAB_DEBUG"  # set (to anything but 0): a crash of compare or history shows its traceback


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


def judge(
    points: list[dict[str, Any]],
    gate_pct: float,
    alpha: float,
    allow_mixed: bool,
    floor: float | None = None,
    looks: int = 1,
    paired: bool = False,
) -> None:
    """Each matched point's verdict, in place. A point holds its sides as ``_base`` and
    ``_new`` (``replicates.Measured``) and ``identity`` (the machine identity fields that
    differ). Significance is adjusted over every judged point (Benjamini-Hochberg), after a
    Bonferroni correction over ``looks`` (perflab ab looks again as processes are added);
    detectability is at the level a lone changed point must meet, alpha / (points x looks).
    ``floor``: the between-process variation assumed where a side has one process (given:
    ``--process-cv``); else what the same experiment's points with two or more processes a side
    measured here, else ``replicates.FLOOR_CV`` (``perflab.analysis.floor``): the trees and the
    command line decide, nothing kept elsewhere."""
    from perflab.analysis import floor as floors
    from perflab.analysis import replicates
    from perflab.analysis.stats import fdr
    from perflab.store.columns import EXACT

    judged = [p for p in points if allow_mixed or not p["identity"]]
    for p in judged:
        if p.get("metric") in EXACT:
            _judge_exact(p)
    judged = [p for p in judged if p.get("metric") not in EXACT]
    level = alpha_per_look(alpha, looks) / max(1, len(judged))
    measured: dict[Any, list[tuple[float, int]]] = {}
    for p in judged:
        measured.setdefault(p.get("experiment"), []).append(replicates.between(p["_base"], p["_new"]))
    of_trees = {name: floors.measured(found) for name, found in measured.items()}
    for p in judged:
        f = floors.given(floor) if floor is not None else of_trees[p.get("experiment")]
        p["_floor"] = f
        c = replicates.change(p["_base"], p["_new"], level=level, floor=f.cv, paired=paired)
        p["_change"] = c
        higher = p.get("_higher", True)
        p["speedup"] = c.ratio if higher else 1 / c.ratio
        p["change_pct"] = 100 * (p["speedup"] - 1)
        p["ci_low"], p["ci_high"] = (c.ci_low, c.ci_high) if higher else (1 / c.ci_high, 1 / c.ci_low)
        p["p_value"] = c.p_value
        p["base_processes"], p["new_processes"] = c.base_processes, c.new_processes
        p["cv_between_pct"] = 100 * c.spread.between if c.spread.measured else math.nan
        p["paired"] = c.paired
        p["cv_within_pct"] = 100 * c.spread.within
        p["detectable_pct"] = c.detectable_pct
    adjusted = fdr([min(1.0, p["p_value"] * max(1, looks)) for p in judged])
    for p, p_adj in zip(judged, adjusted):
        c, f = p["_change"], p["_floor"]
        p["p_adjusted"] = p_adj
        significant = not math.isnan(p_adj) and p_adj < alpha
        p["significant"] = significant
        size = _size(p["speedup"])
        if math.isnan(p_adj):
            p["significance"] = "nothing to test"
        elif significant:
            p["significance"] = f"significant: {size} than the base (adjusted p={p_adj:.2g})"
        else:
            p["significance"] = f"no significant difference (adjusted p={p_adj:.2g})"
        why: list[str] = []
        if significant and slower_pct(p["speedup"]) > gate_pct:
            verdict = Verdict.FAIL
            why.append(f"{size}: beyond the {gate_pct:g} % gate (adjusted p={p_adj:.2g})")
        elif p["detectable_pct"] <= gate_pct or (significant and p["speedup"] >= 1) or _within(p, c, gate_pct):
            # a change of the gate's size was detectable, it got significantly faster, or the
            # interval at this level excludes a slowdown beyond the gate (equivalent within it)
            verdict = Verdict.PASS
            seen = size if significant else "no significant change"
            why.append(f"{seen}; a {p['detectable_pct']:.2g} % change was detectable")
            if significant and p["speedup"] >= 1 and p["detectable_pct"] > gate_pct:
                why = [f"{size}, significantly (adjusted p={p_adj:.2g})"]
            elif p["detectable_pct"] > gate_pct:
                why = [f"{seen}; at most {_slowest(p, c):.2g} % slower at this level: within the {gate_pct:g} % gate"]
        else:
            verdict = Verdict.INCONCLUSIVE
            why.append(_inconclusive(p, c, gate_pct, level, f.cv))
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
        if p["identity"]:
            why.append(f"compared across identities on purpose (--allow-mixed): {p['identity']}")
        if p.get("_busy"):  # evidence a busy machine made is never judged, whatever it shows
            verdict = Verdict.INCONCLUSIVE
            sides = " and ".join(p["_busy"])
            why = [
                f"not judged: {sides} measured on a busy machine (see suspect); measure again where it is quiet, "
                "or with perflab ab, which measures such processes again",
                *why,
            ]
        elif p.get("suspect"):
            why.append("its measurements were flagged suspect: see suspect")
        p["verdict"], p["_why"] = verdict.value, why
        p["why"] = "; ".join(why)
    for p in points:
        if not (allow_mixed or not p["identity"]):
            p["verdict"], p["why"] = Verdict.INCOMPARABLE.value, f"machine identity differs: {p['identity']}"
            p["_why"] = [p["why"]]


def slower_pct(speedup: float) -> float:
    """How much slower in percent a change is, as the gate reads it: the time (a rate's time per
    item) over the base's, minus one (asv's factor 1 + gate/100). A 10 % gate fails a 1.10x
    slower point; read as a speedup of 0.9 it would need 1.11x."""
    return 100 * (1 / speedup - 1) if speedup > 0 else math.inf


def _slowest(p: dict[str, Any], c: Any) -> float:
    """The largest slowdown in percent (new's time over base's) the change's interval at the
    look's level allows (``replicates.Change.margin``)."""
    return 100 * math.expm1(c.margin - math.log(p["speedup"]))


def _within(p: dict[str, Any], c: Any, gate_pct: float) -> bool:
    """Whether the interval at the look's level excludes a slowdown beyond the gate."""
    return math.isfinite(p["speedup"]) and p["speedup"] > 0 and _slowest(p, c) <= gate_pct


def _judge_exact(p: dict[str, Any]) -> None:
    """A point of an exact metric (lower is better: counts), against ``EXACT_TOLERANCE_PCT``."""
    import numpy as np

    base, new, metric = p["_base"], p["_new"], p.get("metric", "instructions")
    a, b = float(np.median(base.figures)), float(np.median(new.figures))
    p["speedup"] = a / b
    p["change_pct"] = 100 * (p["speedup"] - 1)
    p["base_processes"], p["new_processes"] = base.n_processes, new.n_processes
    p["ci_low"] = p["ci_high"] = p["p_value"] = p["p_adjusted"] = math.nan
    p["detectable_pct"] = EXACT_TOLERANCE_PCT
    within = [
        float(x)
        for side in (base, new)
        for x in side.rows.get(f"{metric}_spread_pct", [])
        if isinstance(x, (int, float)) and math.isfinite(x)
    ]
    between = [100 * float(np.ptp(s.figures)) / float(np.median(s.figures)) for s in (base, new) if s.n_processes > 1]
    p["cv_between_pct"] = max(between) if between else math.nan
    noise = max([*within, *between, 0.0])
    more = 100 * (b / a - 1)
    tol = f"the {EXACT_TOLERANCE_PCT:g} % tolerance of an exact count"
    p["significant"] = abs(more) > EXACT_TOLERANCE_PCT
    words = f"{abs(more):.3g} % {'more' if more > 0 else 'fewer'} {metric}"
    p["significance"] = f"{words}: {'beyond' if p['significant'] else 'within'} {tol}"
    if noise > EXACT_TOLERANCE_PCT:
        verdict = Verdict.INCONCLUSIVE
        why = f"{words}, but the counts vary by {noise:.2g} % (between repeats or processes): more than {tol}"
    elif more > EXACT_TOLERANCE_PCT:
        verdict, why = Verdict.FAIL, f"{words}: beyond {tol} (counts vary by {noise:.2g} %)"
    else:
        verdict, why = Verdict.PASS, f"{words}: {'within' if more >= -EXACT_TOLERANCE_PCT else 'beyond'} {tol}"
    p["verdict"], p["_why"], p["why"] = verdict.value, [why], why


def said_once(points: list[dict[str, Any]]) -> list[str]:
    """The reasons every judged point of two or more gives, taken out of each point's ``why``
    and returned, to be said once."""
    whys = [p["_why"] for p in points if "_why" in p]
    if len(whys) < 2:
        return []
    shared = [w for w in whys[0][1:] if all(w in x[1:] for x in whys)]  # never a point's first, its verdict's reason
    for p in points:
        if "_why" in p:
            p["why"] = "; ".join(w for w in p["_why"] if w not in shared)
    return [f"every point: {w}" for w in shared]


def _size(speedup: float) -> str:
    if math.isnan(speedup):
        return "change unknown"
    return f"{speedup:.3g}x faster" if speedup >= 1 else f"{1 / speedup:.3g}x slower"


def _inconclusive(p: dict[str, Any], c: Any, gate_pct: float, level: float, floor: float) -> str:
    """Why a point is not judged, and what would judge it: processes, bounded."""
    from perflab.analysis import replicates

    metric = p.get("metric", "the metric")
    if not c.base_processes or not c.new_processes:
        return f"no usable {metric} to test" + (f" (left out {p['left_out']})" if p.get("left_out") else "")
    have = f"have {c.base_processes} and {c.new_processes} process(es)"
    need = replicates.processes_needed(c, gate_pct, level, floor)
    cv = f"between-process variation {100 * max(c.spread.between, 0):.2g} %"
    if need is None:
        return (
            f"no affordable number of processes shows a change of {gate_pct:g} % ({cv}; {have}; "
            f"more than {replicates.MOST_PROCESSES} a side would be needed)"
        )
    shown = c.detectable_pct
    could = "no change at all" if math.isinf(shown) else f"only changes above {shown:.2g} %"
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
