"""'Each device alone, then all together': the measurement behind matmul and auto_parallel."""

from __future__ import annotations

from typing import Callable

import logging

from perflab.context import Context
from perflab.devices import Device, Resolved, Together, on_device, resolve
from perflab.schema import DevicesConfig

log = logging.getLogger("perflab")


def cpu_workers_if_fallback(ctx: Context, workers: int) -> None:
    """``devices.spec=auto`` fell back to one CPU: split it into ``workers`` CPU workers, so
    that experiments about several devices still have several (labelled cpu#0, cpu#1 ...)."""
    if ctx.resolved.fallback and len(ctx.devices) == 1 and workers > 1:
        devices = resolve(DevicesConfig(spec="cpu", count=workers)).devices
        ctx.resolved = Resolved(devices, ctx.resolved.fallback)
        log.info("no GPU: splitting the CPU into %d workers (%s)", workers, ", ".join(ctx.resolved.names))


def alone_then_together(ctx: Context, work: Callable[[Device], object], *, flops: float | None = None,
                        items: float | None = None, peak: str | None = None) -> dict[str, float]:
    """Time ``work(device)`` on each device alone, then on all devices issued together.

    ``flops``/``items`` are per device per call. The together row carries the sum of the
    alone medians, and ``concurrency`` = that sum / the together median (ideal: the number
    of devices). Returns the medians by measurement name.
    """
    devices = ctx.devices
    medians: dict[str, float] = {}
    for d in devices:
        with on_device(d):
            stats = ctx.measure(f"{d.name} alone", lambda d=d: work(d), [d], flops=flops, items=items, peak=peak)
        medians[d.name] = stats.median
    if len(devices) < 2:
        return medians
    scale = len(devices)
    with Together(devices) as together:
        name = " + ".join(d.name for d in devices) + " together"
        total_alone = sum(medians.values())
        stats = ctx.measure(
            name, lambda: together.run(work), devices,
            flops=flops * scale if flops else None, items=items * scale if items else None,
            sum_alone_s=total_alone, ideal_concurrency=scale,
            derive=lambda s: {"concurrency": total_alone / s.median,
                              "note": f"achieved concurrency {total_alone / s.median:.2f} of an ideal {scale}"},
        )
    medians[name] = stats.median
    return medians
