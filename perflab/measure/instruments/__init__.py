"""What a measurement carries besides time: one instrument a module, each a class implementing
the small ``Instrument`` interface (``base.py``), registered once in ``INSTRUMENTS``.

``Context.measure_rounds`` opens every registered instrument for its devices (``Instruments``),
lets each hook the samples, and writes what each says in the parts' rows. A new one (power,
say) is a module here, its columns in ``perflab.store.columns``, and a line in ``INSTRUMENTS``
(docs/metrics.md#adding-an-instrument).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

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
        self.after_sample = [i.sampled for i in self._having("sampled")]
        self._around, self._run, self._loop = self._having("around"), self._having("run"), self._having("loop")

    def _having(self, hook: str) -> list[Instrument]:
        return [i for i in self.each if getattr(type(i), hook) is not getattr(Instrument, hook)]

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for i in self._around:
                stack.enter_context(i.around())
            yield

    @contextlib.contextmanager
    def run(self, name: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for i in self._run:
                stack.enter_context(i.run(name))
            yield

    @contextlib.contextmanager
    def loop(self, name: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for i in self._loop:
                stack.enter_context(i.loop(name))
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
