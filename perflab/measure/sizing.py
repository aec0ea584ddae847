"""Sizing experiments to a time budget (``perflab chapter``): what the machine does now, and the
points an experiment asks for in the seconds it is given.

:func:`calibrate` measures the machine *as it is* — other processes' load included, so a busy
machine gets smaller sizes — in a few seconds: a float32 matmul, a memory copy and a tiny op
on one device. The book's part of an experiment that takes part (:mod:`perflab.book`) defines

  CHAPTER_SHARE                      its share of the budget (relative to the others')
  chapter(machine, seconds) -> [Point]   its points, sized to about ``seconds`` in all

and may time its own workload once with :meth:`Calibration.probe` (a training step, say), kept
with the calibration so that a continued chapter does not time it again. Inside
:func:`showing`, each measurement is named as it starts (the chapter's progress meanwhile).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

LARGE_MATMUL_MIN = 256  # the smallest n perflab calls a "large" matmul: below it a matmul is no compute-bound work
JOB_OVERHEAD_S = 1.0  # composing, checking and recording one job, beside its measurements (measured: 0.3-0.6 s)


@dataclass
class Calibration:
    """What the calibration found: one device of the kind the chapter runs on, as it is now."""

    kind: str  # cuda | cpu
    count: int  # GPUs, or the CPU's threads for torch
    name: str  # the device as rows name it ("CPU (2 threads)", a GPU's model)
    matmul_tflops: float  # float32 matmul on one device (the CPU: all its threads), mean of ~0.6 s of calls
    copy_gbps: float  # a memory copy on one device, bytes read + written per second
    op_us: float  # a tiny op, issued and finished
    others_pct: float  # other processes' share of the CPUs while calibrating (nan: unknown)
    seconds: float  # how long the calibration took, wall time (the chapter's: its probes included)
    probes: dict[str, float] = field(default_factory=dict)  # experiments' own timings (Calibration.probe)

    @property
    def gpu(self) -> bool:
        return self.kind == "cuda"

    def matmul_s(self, n: int, share: float = 1.0) -> float:
        """Seconds of one float32 n x n matmul on ``share`` of a device (a CPU worker: 1/k)."""
        return 2 * n**3 / (self.matmul_tflops * 1e12 * share)

    def probe(self, name: str, measure: Callable[[], float]) -> float:
        """An experiment's own timing (seconds, a rate ...), measured once and kept."""
        if name not in self.probes:
            _show(name)
            self.probes[name] = float(measure())
        return self.probes[name]

    def words(self) -> str:
        where = f"{self.count} GPU{'s' if self.count != 1 else ''} ({self.name})" if self.gpu else self.name
        busy = "" if math.isnan(self.others_pct) else f"; other processes used {self.others_pct:.0f}% of the CPUs"
        return (
            f"{where}: float32 matmul {self.matmul_tflops:.3g} TFLOP/s, memory copy {self.copy_gbps:.3g} GB/s, "
            f"a tiny op {self.op_us:.3g} us{busy} (calibrated in {self.seconds:.1f} s)"
        )


@dataclass
class Point:
    """One job of the chapter: a preset with overrides, its estimated time and why these sizes."""

    section: str  # the book's section ("13.4")
    preset: str  # +experiment=NAME
    overrides: list[str]
    estimate_s: float
    why: str  # why these sizes: saved in every row (results.note) and shown in the report
    label: str = ""  # how the progress line names it ("1 device")
    group: str = ""  # points compared with one another: sized together, never re-sized apart
    module: str = ""  # the experiment module that sized it (set by the chapter)
    model_s: float = 0.0  # the hook's own estimate; estimate_s is it at the pace this job had here before

    @property
    def key(self) -> str:
        """The job as the pace learned on this machine knows it: the same job of any size."""
        return f"{self.module}:{self.preset}:{self.label}"


def __getattr__(name: str) -> Any:
    """``Machine``, ``Calibration``'s name before (the load's watcher is
    ``perflab.measure.instruments.machine.Machine``): kept this release, with a DeprecationWarning."""
    if name == "Machine":
        warnings.warn(
            "perflab.measure.sizing.Machine is now Calibration (the load's watcher is "
            "perflab.measure.instruments.machine.Machine); the old name goes in perflab 0.6.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return Calibration
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_SHOWN: list[Callable[[str], None]] = []  # see showing()


@contextlib.contextmanager
def showing(step: Callable[[str], None]) -> Iterator[None]:
    """Within: ``step(what)`` is called as each measurement of the calibration starts (its own,
    then each new :meth:`Calibration.probe`), so that a calibration of seconds shows what it does."""
    _SHOWN.append(step)
    try:
        yield
    finally:
        _SHOWN.remove(step)


def _show(what: str) -> None:
    for step in _SHOWN:
        step(what)


def calibrate() -> Calibration:
    """About a second of measuring: which devices, a float32 matmul's rate, a memory copy's
    bandwidth and a tiny op's cost on one of them (means: the machine as it is, its busy
    moments included), and how busy the rest of the machine is meanwhile."""
    import torch

    from perflab.config.schema import DevicesConfig
    from perflab.measure.devices import Inventory, synchronize
    from perflab.measure.devices import resolve as resolve_devices
    from perflab.measure.instruments.machine import Machine as Load

    start = time.perf_counter()
    _show("a float32 matmul, a memory copy and a tiny op")
    inventory = Inventory.detect()
    device = resolve_devices(DevicesConfig(spec="auto", count=1), inventory).devices[0]
    sync = [device]

    def typical(fn: Callable[[], object], seconds: float) -> float:
        """The mean time of ``fn`` over about ``seconds`` of calls (after one warm-up): what the
        work costs on the machine as it is now, stalls behind other processes included (on
        busy cores a call's median stays low while its mean, which the budget pays, does not)."""
        fn()
        synchronize(sync)
        calls, start = 0, time.perf_counter()
        while calls < 3 or time.perf_counter() - start < seconds:
            fn()
            synchronize(sync)
            calls += 1
        return (time.perf_counter() - start) / calls

    with Load() as load:
        n = 4096 if device.type == "cuda" else 512
        a, b = (torch.randn(n, n, device=device.torch) for _ in range(2))
        matmul = typical(lambda: torch.mm(a, b), 0.6)
        src = torch.ones(32 * 2**20 // 4, device=device.torch)
        dst = torch.empty_like(src)
        copy = typical(lambda: dst.copy_(src), 0.3)
        x = torch.zeros(1, device=device.torch)

        def tiny() -> None:
            for _ in range(200):
                x.add_(1)

        op = typical(tiny, 0.1) / 200
    return Calibration(
        kind=device.type,
        count=inventory.cuda if device.type == "cuda" else inventory.cpu_threads,
        name=device.description(),
        matmul_tflops=2 * n**3 / matmul / 1e12,
        copy_gbps=2 * src.numel() * 4 / copy / 1e9,
        op_us=op * 1e6,
        others_pct=100 * load.others_share(),
        seconds=time.perf_counter() - start,
    )


def repeats_within(seconds: float, per_sample_s: float, *, lo: int = 5, hi: int = 200) -> int:
    """How many samples of ``per_sample_s`` fit in ``seconds`` (at least ``lo``, at most ``hi``)."""
    if per_sample_s <= 0:
        return hi
    return int(min(hi, max(lo, seconds // per_sample_s)))


def round_to(x: float, step: int, lo: int, hi: int) -> int:
    """``x`` rounded down to a multiple of ``step``, within [lo, hi]."""
    return int(min(hi, max(lo, step * math.floor(x / step))))


def bench(repeats: int, warmup: int = 1, min_time_s: float = 0.0) -> list[str]:
    """The bench overrides of a sized point: these repeats, no minimum time (sized by repeats)."""
    return [f"bench.repeats={repeats}", f"bench.warmup={warmup}", f"bench.min_time_s={min_time_s:g}"]


def large_matmul(machine: Calibration, seconds: float = 0.02) -> int:
    """The n of a "large" float32 matmul here: one takes about ``seconds`` on one device (at
    least 256, at most 8192, a multiple of 128), large enough to run near the peak and small
    enough to repeat. The hardware section measures its peak at this size and the matmul
    section runs at it, so that peak is the peak of that work."""
    n = (seconds * machine.matmul_tflops * 1e12 / 2) ** (1 / 3)
    return round_to(n, 128, LARGE_MATMUL_MIN, 8192)


def matmul_words(n: float) -> str:
    """A matmul's size in words that fit it: "a large 4096² matmul" only from ``LARGE_MATMUL_MIN`` on."""
    return f"a {'large ' if n >= LARGE_MATMUL_MIN else ''}{n:.0f}² matmul"


PROBE_STEPS, PROBE_S = 3, 1.0  # a training probe times up to 3 steps, fewer once a second has passed


def training_rate(
    machine: Calibration, name: str, build: Callable[[], Any], shape: tuple[int, ...], batch: int, classes: int = 10
) -> float:
    """Images per second of SGD steps of ``build()`` on ``batch`` random inputs of ``shape`` on
    one device of the machine: a warm-up step, then up to three timed, one where a step takes
    a second or more (a slow model's probe would otherwise cost the calibration most of its
    time); kept as a probe."""

    def measure() -> float:
        import torch
        from torch.nn import functional as F

        device = torch.device("cuda" if machine.gpu else "cpu")
        model = build().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(batch, *shape, device=device)
        y = torch.randint(0, classes, (batch,), device=device)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        step()
        if machine.gpu:
            torch.cuda.synchronize()
        start, steps = time.perf_counter(), 0
        while steps < PROBE_STEPS and (steps == 0 or time.perf_counter() - start < PROBE_S):
            step()
            steps += 1
        if machine.gpu:
            torch.cuda.synchronize()
        return steps * batch / (time.perf_counter() - start)

    return machine.probe(f"{name} training, batch {batch} (images/s)", measure)
