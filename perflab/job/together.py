"""Both sides of an A/B in one process, alternated sample by sample: ``perflab ab``'s round
where the sides differ only by overrides (``python -m perflab.job.together BASE_JSON NEW_JSON``,
each side's command line as a JSON list).

Each side runs as its own job (``perflab.run``: its run dir, rows and log in its own tree), in
a thread of its own, and the two take turns (``perflab.measure.turns``): a sample of one, then
a sample of the other. Whatever the machine does meanwhile falls on both sides of a pair alike.
What the sides share is the process: its host memory columns count both sides' allocations.
The exit code: the worse of the two jobs' (a refusal, 2, first).
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Sequence

USAGE = "usage: python -m perflab.job.together BASE_ARGS_JSON NEW_ARGS_JSON"


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
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    jobs = [functools.partial(perflab.run, *split(json.loads(a))) for a in argv]
    ended = in_turns(jobs)
    codes = []
    for value in ended:
        if isinstance(value, Refused):
            print(f"perflab: error: {value}", file=sys.stderr)
            codes.append(2)
        elif isinstance(value, BaseException):
            print(f"perflab: {type(value).__name__}: {value}", file=sys.stderr)
            codes.append(1)
        else:
            codes.append(exit_code(value.attrs.get("outcome", "error")))
    return 2 if 2 in codes else max(codes)


if __name__ == "__main__":
    sys.exit(main())
