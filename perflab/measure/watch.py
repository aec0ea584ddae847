"""What else a measurement carries: peak memory, and how busy the machine was meanwhile.

Host memory: the process's peak resident set while a sample ran. On Linux the kernel keeps
that peak (VmHWM) and lets a process reset it (``/proc/self/clear_refs``), so it is exact and
costs two tiny file operations per sample, outside the clock; elsewhere a psutil thread
samples RSS every 10 ms. CUDA: ``max_memory_allocated`` / ``max_memory_reserved`` after
``reset_peak_memory_stats``, per device. Machine: other processes' share of all CPUs during
the measurement (from the kernel's CPU time counters) and the load average before and after;
and, known for a measurement however short, how long our own threads waited in the run queue
for a CPU (the kernel's per-thread schedstat, in nanoseconds) and the CPU pressure (PSI) of
the window. GPUs, where ``nvidia-ml-py`` is installed: clocks, temperature, power and throttle
reasons read after the samples. Unknown values are NaN (empty cells), never 0.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import psutil

from perflab.store.rows import number

MB = 2**20
TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01  # the CPU-time counters' step
MIN_WINDOW_TICKS = 25  # a shorter window's CPU shares are mostly rounding
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _vm_kb(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), flags=re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_kernel_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")  # 5: reset the peak RSS (VmHWM) to the current RSS
    except OSError:
        return False
    return _vm_kb("VmHWM") is not None


class _SampledPeak:
    """Where the kernel keeps no resettable peak: RSS sampled every 10 ms in a thread."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="perflab-rss")
        self._thread.start()

    def _run(self) -> None:
        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            self._stop.wait(0.01)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, psutil.Process().memory_info().rss) / MB


@contextlib.contextmanager
def host_peak() -> Iterator[list[float]]:
    """``with host_peak() as peak: work()`` then ``peak[0]``: this process's peak RSS in MiB."""
    out = [math.nan]
    sampled = None if _reset_kernel_peak() else _SampledPeak()
    try:
        yield out
    finally:
        if sampled is not None:
            out[0] = sampled.stop()
        else:
            kb = _vm_kb("VmHWM")
            out[0] = kb / 1024 if kb is not None else math.nan


class Memory:
    """Peak memory per named part, over every sample of it (reset before each run of its samples)."""

    def __init__(self, devices: Sequence[Any] = ()) -> None:
        self.cuda = [d for d in devices if getattr(d, "type", "") == "cuda"]
        self.before: dict[str, float] = {}
        self.host: dict[str, float] = {}
        self.gpu: dict[str, dict[str, tuple[float, float]]] = {}

    @contextlib.contextmanager
    def sample(self, name: str = "") -> Iterator[None]:
        if name not in self.before:
            self.before[name] = psutil.Process().memory_info().rss / MB
        if self.cuda:
            import torch

            for d in self.cuda:
                torch.cuda.reset_peak_memory_stats(d.index)
        with host_peak() as peak:
            yield
        self.host[name] = max(self.host.get(name, 0.0), peak[0])
        if self.cuda:
            import torch

            seen = self.gpu.setdefault(name, {})
            for d in self.cuda:
                a, r = torch.cuda.max_memory_allocated(d.index) / MB, torch.cuda.max_memory_reserved(d.index) / MB
                old = seen.get(d.name, (0.0, 0.0))
                seen[d.name] = (max(old[0], a), max(old[1], r))

    def columns(self, name: str = "") -> dict[str, Any]:
        cols: dict[str, Any] = {
            "rss_before_mb": self.before.get(name, math.nan),
            "rss_peak_mb": self.host.get(name, math.nan),
        }
        peaks = self.gpu.get(name)
        if peaks:
            cols["cuda_allocated_peak_mb"] = max(a for a, _ in peaks.values())
            cols["cuda_reserved_peak_mb"] = max(r for _, r in peaks.values())
            if len(peaks) > 1:
                cols["cuda_peaks_mb"] = ", ".join(f"{n}={a:.0f}/{r:.0f}" for n, (a, r) in peaks.items())
        return cols


class Machine:
    """``with Machine() as m: ...`` then ``m.columns()``: how busy the rest of the machine was.

    Three views, read before and after (no sampler that a short window could slip through):
    other processes' share of all CPUs from the CPU-time counters (whole ticks: NaN below 25 of
    them), the share of our threads' runnable time spent waiting in the run queue for a CPU
    (``waited_pct``, from nanosecond counters: any window), and the kernel's CPU pressure (PSI
    ``some``: the share of the window in which a runnable task waited for a CPU)."""

    def __enter__(self) -> "Machine":
        self.load_before = _load()
        self._waits, self._pressure = run_queue(), cpu_pressure_us()
        self._cpu, self._own, self._t0 = psutil.cpu_times(), own_cpu_s(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.monotonic() - self._t0
        self.busy_s = _busy_s(psutil.cpu_times()) - _busy_s(self._cpu)
        self.own_s = own_cpu_s() - self._own
        waits, pressure = run_queue(), cpu_pressure_us()
        self.load_after = _load()
        ran = sum(w[0] - self._waits.get(t, (0, 0))[0] for t, w in waits.items())
        waited = sum(w[1] - self._waits.get(t, (0, 0))[1] for t, w in waits.items())
        self.waited_share = waited / (ran + waited) if ran + waited > 0 else math.nan
        self.pressure = (
            (pressure - self._pressure) / 1e6 / self.wall_s
            if pressure is not None and self._pressure is not None and self.wall_s > 0
            else math.nan
        )

    def others_share(self, own_s: float | None = None) -> float:
        """Other processes' share of all CPUs, 0..1; ``own_s`` replaces ours (e.g. summed over
        DDP ranks). NaN for a window too short to tell: the kernel counts CPU time in ticks."""
        if self.wall_s < MIN_WINDOW_TICKS * TICK_S:
            return math.nan
        own = self.own_s if own_s is None else own_s
        return min(1.0, max(0.0, self.busy_s - own) / (self.wall_s * (psutil.cpu_count() or 1)))

    def columns(self, own_s: float | None = None) -> dict[str, Any]:
        return {
            "others_cpu_pct": 100 * self.others_share(own_s),
            "waited_pct": 100 * self.waited_share,
            "cpu_pressure_pct": 100 * min(1.0, self.pressure),
            "load_before": self.load_before,
            "load_after": self.load_after,
            "cpus": psutil.cpu_count(),
        }


def since_import() -> Machine | None:
    """The machine since this process imported perflab's watchers, read now (None in a process
    started from one that did, by fork): a worker's whole life so far, where a row has no window
    of its own in it. At least 25 ticks long: a process whose first look comes sooner waits out
    the rest of that quarter second, once, rather than leave others' share blank (the kernel
    counts CPU time in 10 ms ticks)."""
    pid, window = _SINCE_IMPORT
    if pid != os.getpid():
        return None
    young = MIN_WINDOW_TICKS * TICK_S - (time.monotonic() - window._t0)
    if young > 0:
        time.sleep(young)
    window.__exit__(None, None, None)
    return window


def others_since_import() -> float:
    """Other processes' share of all CPUs since this process imported perflab's watchers, 0..1
    (NaN in a process forked from one that did): the last resort for a row whose own window, and
    its job's so far, are too short for the kernel's ticks (a warm process's job that measures
    within a quarter second of starting)."""
    window = since_import()
    return window.others_share() if window else math.nan


MACHINE_COLUMNS = ("others_cpu_pct", "waited_pct", "cpu_pressure_pct", "load_before", "load_after", "cpus")


def busy_reason(columns: Mapping[str, Any], limit: float) -> str:
    """The one rule that says a row's machine was too busy for a clean figure, from the row's own
    columns ("" if it was not, or nobody can tell): its threads waited for a CPU more than
    ``limit`` of their runnable time (``waited_pct``: a short measurement's only sure sign), or
    other processes left fewer free CPUs than its threads need, less ``limit`` of them
    (``others_cpu_pct`` of ``cpus``, against ``num_threads``; where the row has no thread count,
    others above ``limit`` of the CPUs). One thread beside one busy process on two CPUs has a CPU
    of its own: no sign of trouble, and such a gate decides. The advice fits the row: fewer
    threads only where it ran more than one."""
    reasons = []
    others, waited = number(columns.get("others_cpu_pct")), number(columns.get("waited_pct")) or 0.0
    threads, cpus = number(columns.get("num_threads")), number(columns.get("cpus"))
    if others is not None:
        if threads and cpus:
            free = cpus * (1 - others / 100)
            if free < threads * (1 - limit):
                n = f"{threads:g} thread{'s' if threads != 1 else ''}"
                reasons.append(
                    f"other processes used {others:.0f}% of the {cpus:g} CPUs meanwhile, leaving {free:.1f} for its {n}"
                )
        elif others > 100 * limit:
            reasons.append(f"other processes used {others:.0f}% of the CPUs meanwhile")
    if waited > 100 * limit:
        reasons.append(f"its threads spent {waited:.0f}% of their runnable time waiting for a CPU")
    if not reasons:
        return ""
    advice = FEWER_THREADS if (threads or 0) > 1 else QUIETER
    return "the machine was busy: " + "; ".join(reasons) + f": {advice}"


def worst(windows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The machine columns of several windows as one row says them (a run's summary of its
    epochs): the highest share and load of any, the first load before and the last after."""
    out: dict[str, Any] = {}
    for name in MACHINE_COLUMNS:
        known = [v for v in (number(w.get(name)) for w in windows) if v is not None]
        if name == "load_before":
            out[name] = known[0] if known else math.nan
        elif name == "load_after":
            out[name] = known[-1] if known else math.nan
        else:
            out[name] = max(known) if known else math.nan
    return out


# The fix for threads that wait for a CPU, said where it is seen (docs/running.md measures it),
# and for a busy machine where fewer threads cannot help (one already).
FEWER_THREADS = (
    "run with fewer threads, as many as the cores that are free: OMP_NUM_THREADS=1 perflab ... "
    "(docs/running.md#what-omp_num_threads-does)"
)
QUIETER = (
    "measure where nothing else runs, or judge a change with perflab ab, which alternates the two "
    "sides so that both share the machine's state (docs/compare.md)"
)


def run_queue() -> dict[int, tuple[int, int]]:
    """Per thread of this process and its live descendants: (ns run on a CPU, ns waited in the
    run queue for one), from ``/proc/<pid>/task/<tid>/schedstat``; {} where the kernel has none."""
    out: dict[int, tuple[int, int]] = {}
    me = psutil.Process()
    try:
        pids = [me.pid, *(c.pid for c in me.children(recursive=True))]
    except psutil.Error:
        pids = [me.pid]
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ran, waited, _ = f.read().split()
            except (OSError, ValueError):
                continue
            out[int(tid)] = (int(ran), int(waited))
    return out


def cpu_pressure_us() -> int | None:
    """The kernel's cumulative CPU pressure (PSI ``some total``, microseconds), or None."""
    try:
        with open("/proc/pressure/cpu") as f:
            first = f.readline()
    except OSError:
        return None
    found = re.search(r"total=(\d+)", first)
    return int(found.group(1)) if found else None


# NVML's clock event (throttle) reasons, by bit (nvml.h: nvmlClocksEventReason*).
THROTTLE_REASONS = {
    0x1: "gpu idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


def throttle_words(mask: int) -> str:
    """NVML's throttle-reason bits as words ("none" for 0; idle is not a throttle under load)."""
    words = [w for bit, w in THROTTLE_REASONS.items() if mask & bit and bit != 0x1]
    return ", ".join(words) or "none"


class GpuState:
    """A GPU's clocks, temperature, power and throttle reasons while it is measured, read through
    NVML (``pip install 'perflab[gpu]'``: nvidia-ml-py) after samples, at most ten times a second,
    outside the clock. Without NVML or a CUDA device it reads nothing and adds no column."""

    def __init__(self, devices: Sequence[Any] = ()) -> None:
        self.handles: list[Any] = []
        self.reads: list[tuple[float, float, float, float, int]] = []
        self._last = 0.0
        cuda = [d for d in devices if getattr(d, "type", "") == "cuda"]
        if not cuda:
            return
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            for d in cuda:
                uuid = str(torch.cuda.get_device_properties(d.index).uuid)  # NVML's own order may differ
                self.handles.append(
                    pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
                )
            self._nvml = pynvml
        except Exception:  # no nvidia-ml-py, no driver: the columns stay out, never guessed
            self.handles = []

    def sample(self) -> None:
        now = time.monotonic()
        if not self.handles or now - self._last < 0.1:
            return
        self._last = now
        nv = self._nvml
        reasons = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        for h in self.handles:
            with contextlib.suppress(Exception):
                self.reads.append(
                    (
                        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                        nv.nvmlDeviceGetPowerUsage(h) / 1000,
                        int(reasons(h)),
                    )
                )

    def columns(self) -> dict[str, Any]:
        """Lowest clocks, highest temperature and power, and every throttle reason seen."""
        if not self.reads:
            return {}
        mask = 0
        for *_, m in self.reads:
            mask |= m
        return {
            "gpu_sm_clock_mhz": min(r[0] for r in self.reads),
            "gpu_mem_clock_mhz": min(r[1] for r in self.reads),
            "gpu_temp_c": max(r[2] for r in self.reads),
            "gpu_power_w": max(r[3] for r in self.reads),
            "gpu_throttle": throttle_words(mask),
        }


def own_cpu_s() -> float:
    """CPU seconds of this process and its live descendants (DataLoader workers, DDP ranks)."""
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _busy_s(t: Any) -> float:
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


_SINCE_IMPORT = (os.getpid(), Machine().__enter__())  # this process's perflab: a window long enough to count
