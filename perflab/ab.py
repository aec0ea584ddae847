"""An interleaved, adaptive A/B run: measure two sides in alternating fresh processes until
each point is decided or the budget ends, then judge them as ``perflab compare`` does.

    perflab ab OVERRIDES... [--base KEY=VALUE ...] [--new KEY=VALUE ...]
               [--base-env K=V ...] [--new-env K=V ...] [--base-python PY] [--new-python PY]
               [--base-ref REF] [--new-ref REF] [--install CMD]
               [--budget MINUTES] [--min-processes N] [--max-processes N] [--out DIR]
               [--metric COLUMN] [--where KEY=VALUE ...] [--fail-if-slower PCT] [--alpha A] [--process-cv PCT]
               [--format md|csv|json|github]
               [--apart]

The sides share OVERRIDES and differ by their own overrides, environment, interpreter or git
ref. Where they differ only by overrides, each round is one process measuring both in turns,
sample by sample (``perflab.job.together``); otherwise processes alternate A B, B A, ...
(``perflab.job.processes``). Either way process k of A and of B ran side by side, so a drift
or a neighbour falls on both of a pair and the points are judged as pairs. The run looks on a
sparse schedule (``schedule``), each look at alpha over the scheduled looks (``alpha_per_look``,
Bonferroni: the false FAIL rate over all looks stays at most alpha however early it stops), and
stops when no point is INCONCLUSIVE, at ``--max-processes`` or when the next look would not fit
in ``--budget``. docs/compare.md#perflab-ab-interleaved-adaptive says the rest: busy processes,
decided points, the trees it writes and its exit codes (compare's).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from perflab.analysis.comparison import WHERE_FORM, CompareError, where_item
from perflab.analysis.replicates import FLOOR_CV, metric_refusal, numeric
from perflab.analysis.stats import ALPHA
from perflab.analysis.verdicts import (
    DEFAULT_GATE_PCT,
    UNJUDGED_EXIT,
    USAGE_EXIT,
    Verdict,
    alpha_per_look,
    judging,
)
from perflab.errors import OneLineParser
from perflab.job import worktrees

PROG = "perflab ab"


BY_ENVIRONMENT = ("num_threads",)  # identity fields another thread setting explains (OMP_NUM_THREADS=1)
THREAD_VARIABLES = ("OMP_", "MKL_")  # ... the environment variables that are one (prefixes)
BY_INTERPRETER = ("torch", "mkl", "onednn", "cuda", "cudnn")  # ... and another interpreter (a venv's torch)


@dataclass
class Side:
    name: str  # base | new
    tree: Path
    overrides: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    cwd: Path | None = None  # where its processes start: a worktree at --base-ref / --new-ref

    def explains(self, other: "Side") -> frozenset[str]:
        """The machine identity fields (``environment.IDENTITY``) a difference between the sides
        is the change under test in, not a reason to call the points incomparable: the threads
        under another ``OMP_*``/``MKL_*`` variable or ``devices.threads``, torch and the libraries
        under it under another interpreter (another venv's). Any other field that differs still
        makes a point INCOMPARABLE (another variable, a ref's ``PYTHONPATH``, explains none)."""
        fields: set[str] = set()
        if self.threads() != other.threads():
            fields |= set(BY_ENVIRONMENT)
        if self.python != other.python:
            fields |= set(BY_INTERPRETER)
        return frozenset(fields)

    def threads(self) -> tuple[dict[str, str], str | None]:
        """What sets this side's threads: its thread variables and its ``devices.threads``."""
        variables = {k: v for k, v in self.env.items() if k.startswith(THREAD_VARIABLES)}
        return variables, self.setting("devices.threads")

    def setting(self, key: str) -> str | None:
        """The value this side's own overrides give ``key`` (None: not set by them)."""
        given = {k.lstrip("+~"): v for k, _, v in (o.partition("=") for o in self.overrides)}
        return given.get(key)

    def args(self, shared: Sequence[str]) -> list[str]:
        return [*shared, *self.overrides, f"results.store={self.tree}", "results.table=false"]

    def run(self, shared: Sequence[str], process: int) -> int:
        """This side's process ``process`` of its own: a fresh ``python -m perflab`` with its
        overrides, environment, interpreter and ref (``perflab.job.processes``); its exit code."""
        from perflab.job import processes

        return processes.run_one(
            self.args(shared), process=process, env=self.env, python=self.python, quiet=True, cwd=self.cwd
        )


MAX_PROCESSES = 40  # a side, at most (--max-processes): about 5 minutes of quick/matmul's processes
LOOKS_AT = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96)  # processes a side after which a run may look


def schedule(min_processes: int, max_processes: int) -> list[int]:
    """The processes a side after which the run looks: ``min_processes``, the ``LOOKS_AT`` between
    and ``max_processes``. Fixed before the first look: the correction is paid for all of them."""
    return sorted({min_processes, max_processes, *(k for k in LOOKS_AT if min_processes < k < max_processes)})


Measure = Callable[[Side, int], int]  # (side, process) -> exit code of that process
MeasureBoth = Callable[
    [int, list[list[str]]], int
]  # (process, points) -> exit code of the process measuring both sides


def apart_because(shared: Sequence[str], base: Side, new: Side) -> str:
    """Why the sides cannot share a process each round ('' when they can): they differ by more
    than overrides (an environment, an interpreter, a ref), or the command is a sweep."""
    if points(shared) is None:
        return "a sweep only Hydra can expand (a glob)"
    for side in (base, new):
        if side.env or side.python or side.cwd:
            return f"{side.name} has its own environment, interpreter or ref"
    return ""


def run(
    shared: Sequence[str],
    base: Side,
    new: Side,
    *,
    budget_s: float = math.inf,
    min_processes: int = 2,
    max_processes: int = MAX_PROCESSES,
    gate_pct: float = DEFAULT_GATE_PCT,
    alpha: float = ALPHA,
    process_cv: float | None = None,
    metric: str | None = None,
    where: Sequence[str] = (),
    measure: Measure | None = None,
    together: bool = False,
    measure_both: MeasureBoth | None = None,
    say: Callable[[str], None] = lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True),
    clock: Callable[[], float] = time.monotonic,
) -> tuple[pd.DataFrame, int]:
    """The loop of the module docstring: (the last look's table, its exit code). ``together``:
    each round one process measures both sides, alternated sample by sample (``apart_because``
    says where it cannot). ``clock``: where the budget's seconds come from (a test's own)."""
    from perflab import compare

    todo = (points(shared) or [list(shared)]) if together else []  # the points not decided yet
    measure = measure or (lambda side, k: side.run(shared, k))
    measure_both = measure_both or (lambda k, todo: both(base, new, k, todo))
    looks = schedule(min_processes, max_processes)
    start, table = clock(), pd.DataFrame()
    for k in range(1, max_processes + 1):
        if together:
            code = measure_both(k, todo)
            if code:
                say(f"process {k} (both sides) ended with exit {code}: nothing judged")
                return table, USAGE_EXIT if code == USAGE_EXIT else UNJUDGED_EXIT
        for side in () if together else (base, new) if k % 2 else (new, base):  # A B, B A, ...
            code = measure(side, k)
            if code:
                say(f"process {k} of {side.name} ended with exit {code}: nothing judged")
                return table, USAGE_EXIT if code == USAGE_EXIT else UNJUDGED_EXIT
        if k not in looks:
            continue
        table = compare.ab(
            base.tree,
            new.tree,
            metric=metric,
            where=where,
            gate_pct=gate_pct,
            alpha=alpha,
            process_cv=process_cv,
            looks=len(looks),
            differ=[o.lstrip("+").partition("=")[0] for o in (*base.overrides, *new.overrides)],
            explained=base.explains(new),
            # a busy machine's processes are measured again, never judged, unless both sides
            # shared each process sample by sample: then the machine fell on both alike
            busy="alike" if together else "left_out",
            paired=True,  # process k of A and of B ran side by side: a drift falls on both of a pair
        )
        undecided = int((table.get("verdict", pd.Series(dtype=str)) == Verdict.INCONCLUSIVE.value).sum())
        undecided += int(table.get("change", pd.Series(dtype=str)).notna().sum())  # a side's every process busy
        if table.attrs.get("left_busy") and "verdict" not in table:  # every process so far busy: none judged yet
            undecided += 1
        at = looks.index(k) + 1
        level = alpha_per_look(alpha, len(looks))
        say(f"{k} processes a side (look {at} of {len(looks)}, at alpha {level:.2g}): {compare.summary(table)}")
        if together and len(todo) > 1:  # a decided point is measured no more
            left = [point for point in todo if not decided(table, point)]
            if left and len(left) < len(todo):
                say(f"{len(todo) - len(left)} point(s) decided: measuring the {len(left)} left")
                todo[:] = left
        if not undecided or k == max_processes:
            break
        after = looks[at]  # the next look
        spent = clock() - start
        if spent + (after - k) * spent / k > budget_s:  # at the pace of the rounds so far
            say(
                f"the budget ends: {undecided} point(s) undecided after {k} processes a side "
                f"(the next look, at {after}, would not fit)"
            )
            break
    return table, compare.verdict_of(table) if not table.empty else UNJUDGED_EXIT


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: NAME=VALUE")
    return key, value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: an integer >= 1")
    return int(text)


OUT_ALLOWED = "a new or empty folder (or an earlier ab's, its base/ and new/ empty)"


def out_mistake(out: Path) -> str:
    """Why ``--out`` cannot take this run's two trees ('' when it can): a results tree or a
    folder of one (layout.truth), a file, or a folder holding anything but empty base/, new/, src/."""
    from perflab.store import files, layout

    why = layout.truth(out)
    if why:
        return f"--out {out}: {why}; allowed: {OUT_ALLOWED}"
    kind = files.kind_of(out)
    if kind == "missing":
        return ""
    if kind != "a directory":
        return f"--out {out}: {kind}, not a folder; allowed: {OUT_ALLOWED}"
    for entry in sorted(out.iterdir()):
        ours = entry.name in ("base", "new", "src") and entry.is_dir() and not entry.is_symlink()
        if not ours or any(entry.iterdir()):
            said = "is not empty" if ours else "is there (not one of an earlier ab's empty base/, new/, src/)"
            return f"--out {out}: {entry} {said}; allowed: {OUT_ALLOWED}"
    return ""


def side_mistake(side: Side, shared: Sequence[str], at_ref: bool = False) -> str:
    """Why a side cannot run ('' when it can): its interpreter is no program, or (a side run by
    this very perflab: no ref, no interpreter of its own) its overrides are refused as a run
    refuses them. Asked of both sides before either measures."""
    import os
    import shutil

    if side.python is not None:
        found = shutil.which(side.python)
        if found is None or not os.access(found, os.X_OK) or os.path.isdir(found):
            allowed = "a Python interpreter (a venv's bin/python)"
            return f"--{side.name}-python {side.python}: no such program; allowed: {allowed}"
        return ""
    if at_ref:  # another commit's perflab: its own checks say, in its first process
        return ""
    from perflab.app import checked_before_hydra, sweeping
    from perflab.config.composition import compose
    from perflab.errors import Refused

    args = side.args(shared)
    line = checked_before_hydra(args)
    chosen = [a.partition("=")[2] for a in args if a.startswith("+experiment=")]
    rest = [a for a in args if not a.startswith("+experiment=")]
    if line is None and len(chosen) == 1:  # what Hydra's own path would say, of a sweep's first point
        swept = bool(sweeping(rest))
        first = (points(["-m", *rest]) or [rest])[0] if swept else rest  # as given where Hydra cannot expand it
        try:
            compose(chosen[0], first)
        except Refused as err:
            line = str(err)
        if line is None and swept:  # its values, as a single run's are checked above
            line = checked_before_hydra([f"+experiment={chosen[0]}", *first])
    return f"{side.name} side: {line}" if line else ""


def both(base: Side, new: Side, k: int, todo: Sequence[Sequence[str]]) -> int:
    """Process ``k`` of both sides, one process measuring the points ``todo`` of each in turns,
    sample by sample (``perflab.job.together``); its exit code."""
    from perflab.job import processes

    sides = (base, new) if k % 2 else (new, base)  # which starts: an order effect falls on both sides
    pairs = [[side.args(point) for side in sides] for point in todo]
    return processes.run_one([json.dumps(pairs)], process=k, quiet=True, module="perflab.job.together")


def points(overrides: Sequence[str]) -> list[list[str]] | None:
    """A command's points, each its overrides with one value per swept key, in the order a
    ``-m`` sweep runs them (the product of the swept keys' values, in the order given); one point
    without ``-m``. None where Hydra alone can expand it (a ``glob`` of a config group's options)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [a for a in overrides if a not in ("-m", "--multirun")]
    if len(given) == len(overrides):
        return [given]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
        choices = [
            [f"{text.partition('=')[0]}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [text]
            for text, o in zip(given, parsed)
        ]
    except Exception:  # Hydra's own errors and expansions: its sweep runs them
        return None
    return [list(point) for point in itertools.product(*choices)]


def decided(table: pd.DataFrame, point: Sequence[str]) -> bool:
    """Whether every row of ``table`` that is this point's (its swept keys' values as the table's
    ``cfg.`` columns hold them) has a verdict other than INCONCLUSIVE; False where none matches."""
    if table.empty or "verdict" not in table:
        return False
    mine = pd.Series(True, index=table.index)
    for text in point:
        key, _, value = text.lstrip("+~").partition("=")
        column = f"cfg.{key}"
        if column in table:
            mine &= table[column].map(_as_text) == _as_text(value)
    rows = table[mine]
    return (
        not rows.empty
        and bool(rows["verdict"].notna().all())
        and not (rows["verdict"] == Verdict.INCONCLUSIVE.value).any()
    )


def _as_text(value: object) -> str:
    """A config value as an override writes it (``true``, ``64``, ``0.5``), to match a table's cell."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip().lower()


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit codes as compare's (a crash is 3 in one line, never 1)."""
    return judging(PROG, lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    from perflab import compare

    argv = list(sys.argv[1:] if argv is None else argv)
    sweep = [a for a in argv if a in ("-m", "--multirun")]  # perflab's own flag, passed on to both sides
    argv = [a for a in argv if a not in sweep]
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="what both sides run: +experiment=NAME key=value ...")
    parser.add_argument("--base", action="append", default=[], metavar="KEY=VALUE", help="an override of A only")
    parser.add_argument("--new", action="append", default=[], metavar="KEY=VALUE", help="an override of B only")
    parser.add_argument("--base-env", action="append", type=_pair, default=[], metavar="K=V", help="A's env var")
    parser.add_argument("--new-env", action="append", type=_pair, default=[], metavar="K=V", help="B's env var")
    parser.add_argument("--base-python", help="A's Python interpreter (another venv's, with perflab)")
    parser.add_argument("--new-python", help="B's Python interpreter")
    parser.add_argument("--base-ref", metavar="REF", help="A at this git ref of the project here (a worktree)")
    parser.add_argument("--new-ref", metavar="REF", help="B at this git ref")
    parser.add_argument("--install", metavar="CMD", help="run in each ref's worktree first (a shell command)")
    # nan or a negative budget would end the run before it began, quietly
    minutes = compare.number(lambda v: v > 0, "a number of minutes > 0, e.g. 5")
    parser.add_argument("--budget", type=minutes, default=math.inf, metavar="MINUTES", help="time to spend")
    parser.add_argument("--min-processes", type=_count, default=2, metavar="N", help="a side before the first look")
    parser.add_argument(
        "--max-processes", type=_count, default=MAX_PROCESSES, metavar="N", help=f"a side at most ({MAX_PROCESSES})"
    )
    parser.add_argument("--metric", help="column to judge (default: each experiment's own)")
    parser.add_argument(
        "--where", action="append", default=[], metavar="KEY=VALUE", help="judge only these rows (KEY!=VALUE: all but)"
    )
    parser.add_argument("--out", type=Path, default=Path("ab"), help="DIR: the trees DIR/base and DIR/new")
    parser.add_argument("--fail-if-slower", type=compare.percent, metavar="PCT", help="the gate (default 10)")
    parser.add_argument("--alpha", type=compare.probability, default=ALPHA, help="false alarm rate (0.05)")
    parser.add_argument(
        "--process-cv", type=compare.cv_pct, metavar="PCT", help=f"floor (default: measured, else {100 * FLOOR_CV:g})"
    )
    parser.add_argument(
        "--why",
        action=argparse.BooleanOptionalAction,
        help="after the verdict, measure the sides again under the profiler and name the operators that moved: "
        "by default where a point FAILed; --why: where one was significantly faster too; --no-why: never",
    )
    parser.add_argument("--format", choices=("md", "csv", "json", "github"), default="md")
    parser.add_argument(
        "--apart",
        action="store_true",
        help="a process for each side each round (default where the sides differ only by overrides: "
        "both in one process, alternated sample by sample)",
    )
    args = parser.parse_args(argv)
    if not args.overrides:
        parser.error("give what both sides run, e.g. +experiment=quick/matmul")
    if args.min_processes > args.max_processes:
        parser.error(f"--min-processes {args.min_processes}: allowed: at most --max-processes ({args.max_processes})")
    if args.metric is not None and not numeric(args.metric):  # the rows are checked at the first look
        parser.error(metric_refusal(args.metric))
    for item in args.where:  # its key is checked against the rows at the first look, as --metric's
        if not where_item(item)[1]:
            parser.error(f"--where {item}: allowed: {WHERE_FORM}")
    same = [a for a in (*args.base, *args.new) if not a.partition("=")[1]]
    if same:
        parser.error(f"--base/--new {same[0]}: allowed: KEY=VALUE")
    if args.install and not (args.base_ref or args.new_ref):
        parser.error(f"--install {args.install}: allowed: with --base-ref or --new-ref (it runs in their worktrees)")
    refs = {"base": args.base_ref, "new": args.new_ref}
    try:
        shas = {name: worktrees.commit(f"--{name}-ref", ref, Path.cwd()) for name, ref in refs.items() if ref}
    except worktrees.RefError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return USAGE_EXIT
    args.out = args.out.resolve()  # the sides' processes may start elsewhere (a worktree)
    sides = (
        Side("base", args.out / "base", args.base, dict(args.base_env), args.base_python),
        Side("new", args.out / "new", args.new, dict(args.new_env), args.new_python),
    )
    differ = (args.base, args.new, args.base_env, args.new_env, args.base_python, args.new_python)
    refs_differ = len(shas) == 1 or len(set(shas.values())) == 2  # a ref against the working tree, or two commits
    if not any(differ) and not refs_differ:
        print(
            f"{PROG}: note: the sides do not differ: an A/A run (how often it FAILs is the false alarm rate)",
            file=sys.stderr,
        )
    mistake = out_mistake(args.out) or next(
        filter(None, (side_mistake(side, args.overrides, side.name in shas) for side in sides)), ""
    )
    if mistake:  # both sides checked before either measures
        print(f"{PROG}: error: {mistake}", file=sys.stderr)
        return USAGE_EXIT
    gate = DEFAULT_GATE_PCT if args.fail_if_slower is None else args.fail_if_slower
    apart = "--apart" if args.apart else apart_because([*sweep, *args.overrides], *sides) or ("a ref" if shas else "")
    print(
        f"{PROG}: each round, "
        + (
            f"a process for each side ({apart})"
            if apart
            else "both sides in one process, alternated sample by sample (--apart: a process each)"
        ),
        file=sys.stderr,
    )
    with contextlib.ExitStack() as stack:
        for side in sides:
            if side.name not in shas:
                continue
            path = stack.enter_context(worktrees.checked_out(Path.cwd(), shas[side.name], args.out / "src" / side.name))
            if args.install and worktrees.install(args.install, path):
                print(f"{PROG}: --install failed in {side.name}'s worktree ({path}): nothing measured", file=sys.stderr)
                return UNJUDGED_EXIT
            side.cwd, side.env = path, {**worktrees.environment(path), **side.env}
            side.python = side.python or worktrees.interpreter(path)
        try:
            table, code = run(
                [*sweep[:1], *args.overrides],
                *sides,
                budget_s=60 * args.budget,
                min_processes=args.min_processes,
                max_processes=args.max_processes,
                gate_pct=gate,
                alpha=args.alpha,
                process_cv=None if args.process_cv is None else args.process_cv / 100,
                metric=args.metric,
                where=args.where,
                together=not apart,
            )
        except CompareError as err:  # --metric or --where no row has: compare's line (others: could not judge)
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return USAGE_EXIT
        from perflab import why

        if args.why is not False and not table.empty and why.wanted(table, bool(args.why)):
            shared = [*sweep[:1], *args.overrides]
            table = why.explain(
                table,
                sides,
                shared,
                faster=bool(args.why),
                alpha=args.alpha,
                process_cv=None if args.process_cv is None else args.process_cv / 100,
                explained=sides[0].explains(sides[1]),
                together=None if apart else lambda a, b, k: both(a, b, k, points(shared) or [shared]),
                say=lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True),
            )
    if table.empty:
        for note in table.attrs.get("notes", []):  # why nothing was judged (every process busy ...)
            print(f"{PROG}: {note}", file=sys.stderr)
        return code
    compare.show(table, args.format, two=True, code=code, gate=args.fail_if_slower)
    compare.verdict_lines(table, args.format, code=code, gate=args.fail_if_slower, alpha=args.alpha, prog=PROG)
    return code


if __name__ == "__main__":
    sys.exit(main())
