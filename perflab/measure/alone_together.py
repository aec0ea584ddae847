"""'Each device alone, then all together': the measurement behind matmul and auto_parallel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from perflab.config.schema import PerflabConfig
from perflab.errors import ConfigError
from perflab.measure.instructions import Counted
from perflab.store.rows import number

if TYPE_CHECKING:
    from perflab.job.context import Context  # the job's handle, above the measuring layer
    from perflab.measure.devices import Device


def split_cpu_if_fallback(ctx: Context, workers: int) -> None:
    """``devices.spec=auto`` fell back to one CPU: split it into ``workers`` CPU workers, so
    that experiments about several devices still have several (labelled cpu#0, cpu#1 ...)."""
    from perflab.config.schema import DevicesConfig
    from perflab.measure.devices import resolve

    fell_back = bool(ctx.identity.get("fallback"))
    if fell_back and len(ctx.devices) == 1 and workers > 1:
        devices = resolve(DevicesConfig(spec="cpu", count=workers)).devices
        ctx.use_devices(devices, f"no GPU: the CPU split into {workers} workers")


def check_cpu_split(settings: PerflabConfig, devices: Sequence[Device], workers: int) -> None:
    """Refuse ``experiment.cpu_workers`` beyond the cores before the job starts: the split
    itself (:func:`split_cpu_if_fallback`) happens in ``run``."""
    if settings.devices.spec != "auto" or len(devices) != 1 or devices[0].type != "cpu":
        return  # no fallback to the CPU, so no split
    cores = devices[0].threads or 1  # the one CPU device holds all of torch's threads
    if workers > cores:
        raise ConfigError(
            "experiment.cpu_workers",
            workers,
            f"at most {cores} (one per core)",
            problem=f"no GPU here: the CPU is split into workers, and it has {cores} cores for torch",
        )


def alone_then_together(
    ctx: Context,
    work: Callable[[Device], object],
    *,
    flops: float | None = None,
    items: float | None = None,
    unit: str = "items",
    dtype: str | None = None,
    columns: Mapping[str, Any] | None = None,
    count: Counted | None = None,
) -> dict[str, float]:
    """Time ``work(device)`` on each device alone and on all devices issued together, in
    interleaved rounds (alone, alone, together, ...) so that drift hits every variant alike.

    ``flops``/``items`` are per device per call; ``columns`` go into every row. The together row carries the sum of the
    alone medians, and ``concurrency`` = that sum / the together median (ideal: the number
    of devices; above it is impossible and the row is marked suspect). ``count``: one alone
    call as source text, for ``bench.instructions`` (perflab.measure.instructions). Returns the medians.
    """
    from perflab.measure.bench import Part  # torch: only where something is measured, never
    from perflab.measure.devices import Together, on_device  # for a report's headline

    devices = ctx.devices

    def alone(d: Device) -> Callable[[], object]:
        def call() -> object:
            with on_device(d):
                return work(d)

        return call

    parts = {
        f"{d.name} alone": Part(
            alone(d),
            [d],
            flops=flops,
            items=items,
            dtype=dtype,
            extra={"items_unit": unit, **(columns or {})},
            count=count,
        )
        for d in devices
    }
    if len(devices) < 2:
        return {n: s.median for n, s in ctx.measure_rounds(parts).items()}
    scale = len(devices)
    name = " + ".join(d.name for d in devices) + " together"
    alone_names = list(parts)

    def concurrency(stats: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        total = sum(stats[n].median for n in alone_names)
        c = total / stats[name].median
        row = {
            "sum_alone_s": total,
            "ideal_concurrency": scale,
            "concurrency": c,
            "note": f"achieved concurrency {c:.2f} of an ideal {scale}",
        }
        if c > scale * 1.1:
            row["suspect"] = f"concurrency {c:.2f} above the ideal {scale}: the alone runs were disturbed"
        return {name: row}

    with Together(devices) as together:
        parts[name] = Part(
            lambda: together.run(work),
            devices,
            flops=flops * scale if flops else None,
            items=items * scale if items else None,
            dtype=dtype,
            extra={"items_unit": unit, **(columns or {})},
        )
        stats = ctx.measure_rounds(parts, relate=concurrency)
    return {n: s.median for n, s in stats.items()}


def concurrency_headline(rows: Sequence[Mapping[str, Any]], unit: str, column: str) -> list[str]:
    """'alone: X each; together: Y (concurrency c of n)'."""
    ok = [r for r in rows if r.get("status") == "ok"]
    alone = [r for r in ok if str(r.get("measurement", "")).endswith(" alone")]
    together = [r for r in ok if str(r.get("measurement", "")).endswith(" together")]
    from perflab.analysis.table import in_unit

    if not alone:
        return []
    figures = [in_unit(number(r.get(column)) or 0, unit) for r in alone]
    if len({f.split(" ", 1)[1] for f in figures}) == 1:  # one unit: said once, at the end
        figures = [f.split(" ", 1)[0] for f in figures[:-1]] + figures[-1:]
    values = ", ".join(f"{r['measurement'].removesuffix(' alone')} {f}" for r, f in zip(alone, figures))
    lines = [f"alone: {values}"]
    for r in together:
        lines.append(
            f"together: {in_unit(number(r.get(column)) or 0, unit)}, concurrency "
            f"{number(r.get('concurrency')) or 0:.2f} of an ideal {number(r.get('ideal_concurrency')) or 0:g}"
        )
    return lines
