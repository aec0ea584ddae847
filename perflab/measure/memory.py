"""Will it fit? What a job is about to allocate, against what its devices have free, before it
allocates: a job too big for the machine is an ``oom`` row that says both figures, not a crash
halfway (or the kernel's OOM killer taking the whole sweep). Experiments that know their sizes
call :func:`require` (``ctx.need_memory``) before building their tensors; allocations that fail
anyway (torch's ``OutOfMemoryError``, the CPU allocator's "can't allocate memory") are
``oom`` rows too (:func:`is_oom`).
"""

from __future__ import annotations

import os
from typing import Sequence

from perflab.measure.devices import Device


class WillNotFit(Exception):
    """A job that would need more memory than its devices have free: an ``oom`` row."""

    def __init__(self, what: str, needed: int, available: int, where: str) -> None:
        self.needed, self.available = needed, available
        super().__init__(
            f"{what} needs {gb(needed)} on {where}, which has {gb(available)} free: not allocated (predicted)"
        )


def gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def available(device: Device) -> int | None:
    """Bytes free for new tensors on ``device`` now (None where it cannot be read)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device.index or 0)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    return None


def require(devices: Sequence[Device], per_device: int, what: str) -> None:
    """Raise :class:`WillNotFit` unless every device has ``per_device`` bytes free. The CPU
    and its workers share the host's memory: their needs add up."""
    cpu = [d for d in devices if d.type == "cpu"]
    if cpu:
        free = available(cpu[0])
        if free is not None and per_device * len(cpu) > free:
            where = cpu[0].name if len(cpu) == 1 else f"{len(cpu)} CPU workers (the host's memory)"
            raise WillNotFit(what, per_device * len(cpu), free, where)
    for d in devices:
        if d.type != "cpu":
            free = available(d)
            if free is not None and per_device > free:
                raise WillNotFit(what, per_device, free, d.name)


def is_oom(exc: BaseException) -> bool:
    """An allocation that failed for want of memory, on any device."""
    if isinstance(exc, (WillNotFit, MemoryError)):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA, MPS)
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)  # torch's CPU allocator
