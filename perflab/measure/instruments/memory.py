"""Peak memory while a part's samples ran: host RSS and, on CUDA devices, allocated/reserved.

Host memory: the process's peak resident set while a sample ran. On Linux the kernel keeps
that peak (VmHWM) and lets a process reset it (``/proc/self/clear_refs``), so it is exact and
costs two tiny file operations per run of samples, outside the clock; elsewhere a psutil thread
samples RSS every 10 ms. CUDA: ``max_memory_allocated`` / ``max_memory_reserved`` after
``reset_peak_memory_stats``, per device. Unknown values are NaN (empty cells), never 0.
(Whether a job will fit before it allocates: ``perflab.measure.memory``.)
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from pathlib import Path
from typing import Any, ContextManager, Iterator, Sequence

import psutil

from perflab.measure.instruments.base import Instrument

MB = 2**20
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


class Memory(Instrument):
    """Peak memory per named part, over every sample of it (reset before each run of its samples)."""

    COLUMNS = ("rss_before_mb", "rss_peak_mb", "cuda_allocated_peak_mb", "cuda_reserved_peak_mb", "cuda_peaks_mb")

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

    def run(self, name: str) -> ContextManager[None]:
        return self.sample(name)

    def loop(self, name: str) -> ContextManager[None]:
        return self.sample(name)  # its peak RSS over torch.utils.benchmark's own loop

    def row(self, name: str, calls: int, items_per_call: float | None = None) -> dict[str, Any]:
        return self.columns(name)
