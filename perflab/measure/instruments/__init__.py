"""What a measurement carries besides time: one instrument a module, each a class implementing
the small ``Instrument`` interface (``base.py``), registered once in ``INSTRUMENTS``.

``Context.measure_rounds`` opens every registered instrument for its devices (``Instruments``),
lets each hook the samples, and writes what each says in the parts' rows. A new one (power,
say) is a module here, its columns in ``perflab.store.columns``, and a line in ``INSTRUMENTS``
(docs/metrics.md#adding-an-instrument).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator, Sequence

from perflab.measure.instruments.base import Instrument
from perflab.measure.instruments.energy import Energy
from perflab.measure.instruments.gpu import GpuState
from perflab.measure.instruments.machine import Machine
from perflab.measure.instruments.memory import Memory

# Every measurement's instruments; a part's row says theirs in this order.
INSTRUMENTS: list[type[Instrument]] = [Memory, Energy, Machine, GpuState]


class Instruments:
    """The registered instruments, opened for one measurement on ``devices``."""

    def __init__(self, devices: Sequence[Any] = ()) -> None:
        self.each = [cls(devices) for cls in INSTRUMENTS]
        # each hook, of the instruments that have it (when parts alternate, a run is one sample)
        self.having = {
            hook: [i for i in self.each if getattr(type(i), hook) is not getattr(Instrument, hook)]
            for hook in ("around", "run", "loop", "sampled")
        }
        self.after_sample = [i.sampled for i in self.having["sampled"]]

    def around(self) -> ContextManager[None]:
        return self._entered("around")

    def run(self, name: str) -> ContextManager[None]:
        return self._entered("run", name)

    def loop(self, name: str) -> ContextManager[None]:
        return self._entered("loop", name)

    @contextlib.contextmanager
    def _entered(self, hook: str, *args: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for i in self.having[hook]:
                stack.enter_context(getattr(i, hook)(*args))
            yield

    def row(self, name: str, calls: int, items_per_call: float | None = None) -> dict[str, Any]:
        """A part's own columns (of the instruments not ``SHARED``)."""
        out: dict[str, Any] = {}
        for i in self.each:
            if not i.SHARED:
                out.update(i.row(name, calls, items_per_call))
        return out

    def shared(self) -> dict[str, Any]:
        """The columns every part of the measurement shares: the machine's state over it."""
        out: dict[str, Any] = {}
        for i in self.each:
            if i.SHARED:
                out.update(i.row("", 0))
        return out


__all__ = ["INSTRUMENTS", "Energy", "GpuState", "Instrument", "Instruments", "Machine", "Memory"]
