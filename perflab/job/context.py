"""What an experiment gets: its typed params, the resolved devices, and ways to record rows.

Experiments time things with ``measure`` (one part) or ``measure_rounds`` (parts meant to be
compared, interleaved), record what they computed otherwise with ``record``, and say what
cannot run here with ``skip``. Rows are written the moment they exist.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

from perflab.analysis.table import progress_line
from perflab.config.schema import PerflabConfig
from perflab.job.logs import live
from perflab.job.stop import raise_if_stopped
from perflab.measure import bench, turns
from perflab.measure.bench import Part, Stats, Variant
from perflab.measure.devices import Device
from perflab.measure.instruments import Instruments
from perflab.measure.instruments.machine import Machine, busy_reason, others_since_import, since_import
from perflab.measure.peaks import Peaks
from perflab.store.outcome import ROW_STATUSES
from perflab.store.rows import number
from perflab.store.rundir import RunWriter

log = logging.getLogger("perflab")


class Status:
    """A one-line, self-erasing "measuring ..." status on a terminal (stderr), for measurements
    that take a while: updated at most twice a second, outside the clock. Silent in a pipe."""

    def __init__(self, what: str) -> None:
        self.what, self.samples, self.shown = what, 0, False
        self.on = live()
        self.start = self.last = time.monotonic()

    def sampled(self) -> None:
        self.samples += 1
        now = time.monotonic()
        if self.on and now - self.last > 0.5:
            self.last, self.shown = now, True
            line = f"  measuring {self.what}: {self.samples} samples, {now - self.start:.0f} s"
            sys.stderr.write("\r" + line[: shutil.get_terminal_size((100, 20)).columns - 1] + "\033[K")
            sys.stderr.flush()

    def __enter__(self) -> "Status":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


@dataclass
class Context:
    settings: PerflabConfig
    devices: list[Device]
    writer: RunWriter
    identity: dict[str, Any]  # columns every row carries: ids, environment, cfg.*
    peaks: Peaks = field(default_factory=lambda: Peaks(None))
    progress: Callable[[Mapping[str, Any]], str | None] | None = None  # the experiment's own line
    metric: str = ""  # the experiment's headline metric, for the progress lines
    recorded_elsewhere: bool = False  # a node of a multi-node run whose workers hold no rank 0
    # per measured part: the shared instruments' columns (the machine's, the GPUs') over its calls
    watched: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the machine since the last row, and since the job began, each in the process that opened
    # it: the windows of a row whose measurement brought none of its own, or one too short (``record``)
    since: tuple[int, Machine] | None = field(default=None, repr=False)
    began: tuple[int, Machine] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.since = (os.getpid(), Machine().__enter__())
        self.began = self.began or self.since  # the job's start where the runner opened it, else now

    @property
    def params(self) -> Any:
        """The experiment's own typed config (a subclass of ExperimentConfig)."""
        return self.settings.experiment

    @property
    def run_dir(self) -> Path:
        """The job's folder, for files an experiment writes beside its rows."""
        return self.writer.run_dir

    @property
    def run_id(self) -> str:
        return str(self.identity["run_id"])

    def use_devices(self, devices: list[Device], why: str) -> None:
        """Run on other devices than resolved (e.g. the CPU split into workers); rows say why."""
        self.devices = devices
        self.identity = {**self.identity, "fallback": "; ".join(x for x in (self.identity.get("fallback"), why) if x)}
        log.info("%s (%s)", why, ", ".join(d.name for d in devices))

    def launch_workers(
        self,
        entrypoint: Callable[..., Any],
        *args: Any,
        nproc: int,
        nnodes: int = 1,
        rdzv_endpoint: str = "",
        rdzv_id: str = "",
        max_restarts: int = 0,
    ) -> dict[int, Any]:
        """Run ``entrypoint(ctx, *args)`` in ``nproc`` worker processes (a process group each
        joins with ``perflab.cluster.workers.init_process_group``); logs in ``<run dir>/workers``.
        Returns their values by global rank; where none is rank 0 (a further node of a multi-node
        run), the node with it records the point and this job records nothing."""
        from perflab.cluster import workers

        returned = workers.launch(
            entrypoint,
            self,
            *args,
            nproc=nproc,
            nnodes=nnodes,
            rdzv_endpoint=rdzv_endpoint,
            log_dir=self.run_dir / "workers",
            run_id=rdzv_id or self.run_id,
            max_restarts=max_restarts,
        )
        self.recorded_elsewhere = 0 not in returned
        return returned

    def measure(
        self,
        name: str,
        fn: Callable[[], object],
        devices: Sequence[Device] | None = None,
        *,
        sync: bool = True,
        items: float | None = None,
        flops: float | None = None,
        bytes: float | None = None,
        dtype: str | None = None,
        derive: Callable[[Stats], dict[str, Any]] | None = None,
        **extra: Any,
    ) -> Stats:
        """Time ``fn`` with the job's bench settings, record its row, return its stats (see Part)."""
        part = Part(fn, devices, sync, items, flops, bytes, dtype, derive, extra)
        return self.measure_rounds({name: part})[name]

    def measure_rounds(
        self,
        parts: Mapping[str, Part],
        relate: Callable[[Mapping[str, Stats]], Mapping[str, dict[str, Any]]] | None = None,
        watch: Callable[[str], ContextManager[object]] | None = None,
    ) -> dict[str, Stats]:
        """Time parts meant to be compared in interleaved rounds (A B A B ...), one row each.

        ``relate(stats)`` may add columns that relate the parts (by part name), e.g. a ratio;
        ``watch(name)`` wraps each sample of a part, outside the clock (e.g. to count recompiles).
        """
        b = self.settings.bench
        devices = {name: self.devices if p.devices is None else list(p.devices) for name, p in parts.items()}
        everything = list({d.name: d for ds in devices.values() for d in ds}.values())
        instruments = Instruments(everything)  # perflab.measure.instruments.INSTRUMENTS, on these devices
        status = Status(", ".join(parts))
        after_sample = [*instruments.after_sample, status.sampled]

        @contextlib.contextmanager
        def around(name: str) -> Iterator[None]:  # every sample: nothing that reads a file (bench.measure_rounds)
            with watch(name) if watch else contextlib.nullcontext():
                yield
            for after in after_sample:
                after()

        with instruments.around(), status:
            stats = bench.measure_rounds(
                {n: Variant(p.fn, devices[n], p.sync) for n, p in parts.items()},
                warmup=b.warmup,
                repeats=b.repeats,
                min_time_s=b.min_time_s,
                timer=b.timer,
                noise_threshold=b.noise_threshold,
                around=around,
                around_run=instruments.run,  # a run of one part's samples: a peak, a sum
                around_loop=instruments.loop,  # torch.utils.benchmark's own loop: its peak only
            )
        related = relate(stats) if relate else {}
        watched = self._filled(instruments.shared())  # the machine's state over the measurement
        for name, part in parts.items():
            s = stats[name]
            row = {
                **part.extra,
                **self._derived(part, s, devices[name]),
                **related.get(name, {}),
                **instruments.row(name, s.n * s.calls_per_sample, part.items),
                **watched,
            }
            self.watched[name] = watched
            row["suspect"] = "; ".join(x for x in (s.suspect, row.get("suspect", "")) if x)
            found = None
            if self.settings.bench.profile:
                from perflab.measure import operators, profile  # the trace, and the same pass per operator

                calls = operators.calls_for(s.median)
                row["trace"], found = profile.traced(self.run_dir, name, part.fn, devices[name], calls)
                row["profile_s"] = found.pass_s
            if self.settings.bench.instructions and part.count is not None:
                from perflab.measure import instructions

                row.update(instructions.count(part.count))
            written = self.record(name, s, devices=devices[name], **row)
            if found is not None:  # its operators, keyed by the row just written (operators: imported above)
                operators.write(self.run_dir, written, found.table)
        return stats

    def _derived(self, part: Part, s: Stats, devices: list[Device]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if part.items is not None:
            out["items_per_s"] = part.items / s.median
        if part.flops is not None:
            out["tflops"] = part.flops / s.median / 1e12
        if part.bytes is not None:
            out["gbps"] = part.bytes / s.median / 1e9
        if part.flops is not None and part.dtype and devices:
            from perflab.measure.flops import PRECISION_DTYPE

            out["flops_dtype"] = PRECISION_DTYPE.get(part.dtype, part.dtype)  # whose peak bounds it (roofline)
            per_item = part.flops / part.items if part.items else None
            out.update(self.utilization(out["tflops"], devices, part.dtype, per_item))
        if part.derive is not None:
            out.update(part.derive(s))
        return out

    def utilization(
        self, tflops: float, devices: Sequence[Device], dtype: str, flops_per_item: float | None = None
    ) -> dict[str, Any]:
        """``pct_of_peak`` and ``mfu`` of an achieved TFLOP/s on these devices (perflab.measure.flops).

        A measured peak from a smaller matmul than one item of this job's work (``flops_per_item``:
        one matmul of the matmul job) is no peak for it: not taken, and the row says why in
        ``peak_not_taken`` (a quick/hardware run's 256² "peak" under a 1024² job gave 127 %)."""
        from perflab.measure import flops

        names = [d.description() for d in devices]
        quantity = f"matmul_{flops.PRECISION_DTYPE.get(dtype, dtype)}"
        measured = self.peaks.lookup(names[0], quantity) if len(set(names)) == 1 else None
        size = self.peaks.measured_at(names[0], quantity) if measured else None
        if size and flops_per_item and 2 * size**3 < flops_per_item:
            out = flops.utilization(tflops, names, dtype, None)
            out["peak_not_taken"] = (
                f"the measured {quantity} peak comes from a {size}x{size} matmul, smaller than this job's "
                f"{flops_per_item:.3g} FLOPs per item: not a peak for it (run +experiment=hardware larger)"
            )
            return out
        return flops.utilization(tflops, names, dtype, measured)

    def record(
        self,
        name: str,
        stats: Stats | None = None,
        *,
        status: str = "ok",
        error: str = "",
        devices: Sequence[Device] | None = None,
        calls_of: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Write one row (and its raw samples) now, so a later crash cannot lose it.

        Every row says the machine's state while it was measured, by one rule: the machine
        columns (``watch.MACHINE_COLUMNS``) of its own measurement where it brought them (``measure``,
        training's epochs), else of ``calls_of`` (the part measured before whose calls this row's
        samples come from: decode's steps, of generate's calls), else of the time since the last
        row; others' CPU share, which the kernel counts in ticks, from the job so far where that
        window was too short to tell; and from those columns ``busy`` with its reason in
        ``suspect`` (``watch.busy_reason``)."""
        if status == "ok":
            raise_if_stopped()  # never an ok row after a stop signal, even one Python swallowed
        if status not in ROW_STATUSES:
            raise ValueError(f"status {status!r}: one of {', '.join(ROW_STATUSES)}")
        devices = self.devices if devices is None else list(devices)
        window = self._window_since_last_row()
        watched = self.watched[calls_of] if calls_of is not None else window
        fields = {**watched, **fields}
        row = {
            **self.identity,
            "measurement": name,
            "status": status,
            "error": error,
            "devices": "+".join(d.name for d in devices),
            "device_name": " + ".join(dict.fromkeys(d.description() for d in devices)),
            **(stats.as_row() if stats else {}),
            **fields,
        }
        row = self._filled(row)
        busy = busy_reason(row, self.settings.bench.busy_threshold)
        said = (fields.get("suspect", ""), busy, beyond_peak(fields))
        row.update(busy=bool(busy), suspect="; ".join(x for x in said if x))
        row = self.writer.add(row, stats.samples if stats else (), stats.warmup if stats else ())
        line = (self.progress(row) if self.progress else None) or progress_line(row, self.metric)
        log.info("  %s", line)
        turns.turn()  # where two jobs share this process (perflab ab), the other's part now
        return row

    def _window_since_last_row(self) -> dict[str, Any]:
        """The machine columns since the last row (or the job's start) in this process, and a new
        window opened; in a worker process (a DDP rank), its first row's are of the worker's life."""
        pid, window = self.since or (0, Machine())
        self.since = (os.getpid(), Machine().__enter__())
        if pid == os.getpid():
            window.__exit__(None, None, None)
            return window.columns()
        first = since_import()  # a worker's first row: its own life so far (a spawned process imports anew)
        return first.columns() if first else {}

    def _filled(self, columns: dict[str, Any]) -> dict[str, Any]:
        """``columns`` with others' CPU share from the job so far (in this process) where their own
        window was too short to count it (the kernel counts CPU time in 10 ms ticks); from this
        process's perflab so far where the job is that young too (a warm process)."""
        pid, job = self.began or (0, Machine())
        if number(columns.get("others_cpu_pct")) is not None:
            return columns
        share = math.nan
        if pid == os.getpid():
            job.__exit__(None, None, None)  # the counters now against the job's start: read again at the next row
            share = job.others_share()
        if math.isnan(share):  # the job too young to count: this process's perflab so far
            share = others_since_import()
        return {**columns, "others_cpu_pct": 100 * share}

    def need_memory(self, per_device: int, what: str, devices: Sequence[Device] | None = None) -> None:
        """Say, before allocating, how many bytes each device will hold: if they are not free
        the job ends here as an ``oom`` row with both figures (perflab.measure.memory)."""
        from perflab.measure import memory

        memory.require(list(devices or self.devices), int(per_device), what)

    def skip(self, name: str, reason: str, devices: Sequence[Device] | None = None) -> None:
        """A part that cannot run here (e.g. needs a GPU): say so in a ``skipped`` row."""
        self.record(name, status="skipped", error=reason, devices=devices)


def beyond_peak(fields: Mapping[str, Any]) -> str:
    """Why a figure above 100 % of the measured peak, or of the datasheet's (an MFU above 1), is
    suspect ("" if it is above neither). A CPU peak counted with a clock that is no maximum is a
    floor (:func:`perflab.measure.flops.is_lower_bound`): a figure above it gets no MFU at all
    (``mfu_note`` says why), so an MFU above 1 here is above a true peak."""
    said = []
    pct = number(fields.get("pct_of_peak"))
    if pct is not None and pct > 100:
        said.append(
            f"{pct:.1f} % of the measured peak: above 100 %, so that peak (results.peaks) was no peak "
            "for this work (measured smaller, or on a busy machine): run +experiment=hardware again"
        )
    mfu = number(fields.get("mfu"))
    if mfu is not None and mfu > 1:
        said.append(
            f"MFU {mfu:.0%}: above the datasheet peak, whose figure is low for this device "
            "(datasheet_basis says how it was derived)"
        )
    return "; ".join(said)
