"""What else a measurement carries: peak memory, and how busy the machine was meanwhile.

Host memory: the process's peak resident set while a sample ran. On Linux the kernel keeps
that peak (VmHWM) and lets a process reset it (``/proc/self/clear_refs``), so it is exact and
costs two tiny file operations per sample, outside the clock; elsewhere a psutil thread
samples RSS every 10 ms. CUDA: ``max_memory_allocated`` / ``max_memory_reserved`` after
``reset_peak_memory_stats``, per device. Machine: other processes' share of all CPUs during
the measurement (from the kernel's CPU time counters) and the load average before and after.
Unknown values are NaN (empty cells), never 0.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import psutil

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
    """Peak memory per named part, over every sample of it (reset before each sample)."""

    def __init__(self, devices: Sequence[Any] = ()) -> None:
        self.cuda = [d for d in devices if getattr(d, "type", "") == "cuda"]
        self.before: dict[str, float] = {}
        self.host: dict[str, float] = {}
        self.gpu: dict[str, dict[str, tuple[float, float]]] = {}

    @contextlib.contextmanager
    def sample(self, name: str = "") -> Iterator[None]:
        self.before.setdefault(name, psutil.Process().memory_info().rss / MB)
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
    """``with Machine() as m: ...`` then ``m.columns()``: how busy the rest of the machine was."""

    def __enter__(self) -> "Machine":
        self.load_before = _load()
        self._cpu, self._own, self._t0 = psutil.cpu_times(), own_cpu_s(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.monotonic() - self._t0
        self.busy_s = _busy_s(psutil.cpu_times()) - _busy_s(self._cpu)
        self.own_s = own_cpu_s() - self._own
        self.load_after = _load()

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
            "load_before": self.load_before,
            "load_after": self.load_after,
            "cpus": psutil.cpu_count(),
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
