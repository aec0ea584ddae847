"""The verdicts of ``compare`` (A/B) and ``history``, their words and exit codes: in one place.

compare, per point of NEW against the same point of BASE:

  PASS          not significantly slower by more than the gate, and the samples could have
                shown a change of the gate's size (the smallest change they could show, at
                this spread and count, is within the gate); or significantly faster
  FAIL          significantly slower (Benjamini-Hochberg over all points) by more than the gate
  INCONCLUSIVE  neither: the smallest change the samples could show exceeds the gate; the
                verdict says how many more repeats would do
  INCOMPARABLE  the rows come from machines (or software) whose identity differs; the
                verdict names the fields (``--allow-mixed`` judges them anyway, and says so)

history, per change point of a series: ``regression``, ``improvement``, ``suspicious``.

history, per series: a series long enough to judge whose subjects are mostly flagged suspect
(fewer clean ones than a change needs) cannot be called unchanged: could not judge (3).

Exit codes (compare and history alike): 0 pass, 1 fail (a FAIL, a regression), 2 a usage
error, 3 could not judge (nothing matched, any point INCONCLUSIVE or INCOMPARABLE, too
little or too suspect history, a crash). A gate never passes by accident: judging nothing is
3, not 0; and a crash is never 1.
"""

from __future__ import annotations

from enum import Enum
from typing import Iterable

PASS_EXIT = 0
FAIL_EXIT = 1
USAGE_EXIT = 2
UNJUDGED_EXIT = 3
DEFAULT_GATE_PCT = 10.0  # compare without --fail-if-slower: asv's default factor (1.1)
DEFAULT_STEP_PCT = 5.0  # history: a change smaller than this is suspicious at most


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


def meaning(gate_pct: float, alpha: float, given: bool) -> str:
    """What a PASS means, in one line (printed under every comparison)."""
    where = "" if given else f" (the default gate; --fail-if-slower PCT sets it, {DEFAULT_GATE_PCT:g} % like asv)"
    return (
        f"PASS means: not significantly slower by more than {gate_pct:g} %{where}, with a change of that size "
        f"detectable in the samples; significance at a false discovery rate of {alpha:g} over all points "
        "(Benjamini-Hochberg). Exit codes: 0 pass, 1 fail, 2 usage error, 3 could not judge."
    )
