"""Both sides of an A/B in one process, alternated sample by sample: ``perflab ab``'s round
where the sides differ only by overrides (``python -m perflab.job.together PAIRS_JSON``: a JSON
list of points, each the two sides' command lines, one point after the other).

Each side of a point runs as its own job (``perflab.run``: its run dir, rows and log in its own
tree), in a thread of its own, and the two take turns (``perflab.measure.turns``): a sample of
one, then a sample of the other. Whatever the machine does meanwhile falls on both sides of a
pair alike. What the sides share is the process: its host memory columns count both sides'
allocations. The exit code: the worst of the jobs' (a refusal, 2, first).
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Sequence

USAGE = "usage: python -m perflab.job.together PAIRS_JSON (a list of [base args, new args])"


def split(args: Sequence[str]) -> tuple[str, list[str]]:
    """A side's command line as ``perflab.run`` takes it: the experiment and the overrides."""
    chosen = [a.partition("=")[2] for a in args if a.startswith("+experiment=")]
    if len(chosen) != 1:
        raise ValueError(f"{list(args)}: allowed: one +experiment=NAME")
    return chosen[0], [a for a in args if not a.startswith("+experiment=")]


def main(argv: Sequence[str] | None = None) -> int:
    import perflab
    from perflab.errors import Refused
    from perflab.measure.turns import in_turns
    from perflab.store.outcome import exit_code

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    codes = []
    pairs = json.loads(argv[0])
    if any(a.lower() == "bench.profile=true" for pair in pairs for args in pair for a in args):
        from perflab.measure import operators

        operators.set_up()  # on this thread: the jobs' own would each print kineto's complaint
    for pair in pairs:
        ended = in_turns([functools.partial(perflab.run, *split(args)) for args in pair])
        for value in ended:
            if isinstance(value, Refused):
                print(f"perflab: error: {value}", file=sys.stderr)
                codes.append(2)
            elif isinstance(value, BaseException):
                print(f"perflab: {type(value).__name__}: {value}", file=sys.stderr)
                codes.append(1)
            else:
                codes.append(exit_code(value.attrs.get("outcome", "error")))
        if 2 in codes:  # a refusal is the same at every point: stop at the first
            return 2
    return max(codes, default=0)


if __name__ == "__main__":
    sys.exit(main())
