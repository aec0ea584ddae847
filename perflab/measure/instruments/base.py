"""The one small interface every instrument implements (perflab.measure.instruments)."""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, ContextManager, Sequence


class Instrument:
    """Reads something around a measurement's samples, outside the clock, and says it as columns.

    Made for the devices one measurement (``Context.measure_rounds``: one part or several,
    interleaved) runs on; each hook is optional:

    - ``around()`` the whole measurement (every part, every round);
    - ``run(name)`` an unbroken run of one part's samples: what holds over many samples (a peak,
      a sum) is read here, never between two samples (issue 30: reading files there evicted the
      caches the next sample needed);
    - ``loop(name)`` a loop perflab does not sample itself (torch_utils_benchmark's): a peak, not
      a per-call sum;
    - ``sampled()`` after every sample: cheap, and no file read (tests/test_bench.py checks).

    Then ``row(name, calls, items_per_call)``: the part's columns. ``COLUMNS`` names every column
    it may write; their facts (type, unit, direction, whether A/B judges them sample by sample)
    are in the one table, ``perflab.store.columns.COLUMNS``. ``SHARED``: its columns say the
    machine over the whole measurement, the same for every part, and a row of a part's calls
    (``Context.record(calls_of=...)``) carries them too.
    """

    COLUMNS: ClassVar[tuple[str, ...]] = ()
    SHARED: ClassVar[bool] = False

    def __init__(self, devices: Sequence[Any] = ()) -> None:
        pass

    def around(self) -> ContextManager[object]:
        return contextlib.nullcontext()

    def run(self, name: str) -> ContextManager[object]:
        return contextlib.nullcontext()

    def loop(self, name: str) -> ContextManager[object]:
        return contextlib.nullcontext()

    def sampled(self) -> None:
        pass

    def row(self, name: str, calls: int, items_per_call: float | None = None) -> dict[str, Any]:
        return {}
